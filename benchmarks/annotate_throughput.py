"""Annotation throughput: candor's decode loop against per-question ``generate`` calls.

Both paths answer the same NQ questions with the embedded default model and
the ``fewshot`` template: one greedy answer and k samples per question
(temperature 1, top-p 0.95, top-k 50, at most 32 new tokens, cut at the first
newline), keeping every token's log-prob.

- candor: ``HFBackend.generate`` on all questions (chunks of ``batch_size``),
  its linear layers on prepacked oneDNN weights and each decode step's small
  ops on one thread (the default, :mod:`candor.backends.engine.packed_linear`,
  :mod:`candor.backends.engine.op_threads`).
- candor-stock: the same loop with ``pack_linears=False`` (``nn.Linear``'s own
  MKL kernels, every op on torch's threads): the gain of both, greedy answers
  and log-prob drift, measured in the same run.
- naive: what per-question toolkits do: for each question one greedy
  ``model.generate`` call and k sampled calls, with the same stop string.
- annotate: the full ``candor.annotation.builder.annotate`` (generation and judges,
  records written to a temporary file), when that module is present.

Each path runs in its own subprocess, so its peak RSS (``ru_maxrss``) is its
own; model loading is outside the timed region. The two candor paths run
``--repeats`` times each, alternating, and report the median run (the machine
is shared; alternation spreads its load over both). Results go to
``benchmarks/results/annotate_throughput.json``.

The children run with ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets
it: on a 2-core machine shared with other processes, spinning OpenMP threads
made every path five to six times slower (measured), and far more so for the
naive path's small batch-1 steps, which would inflate the speedup.

    python benchmarks/annotate_throughput.py [--questions 64] [--threads 2] [--dtype float32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "honestybench" / "nq" / "test.jsonl"
RESULTS = ROOT / "benchmarks" / "results" / "annotate_throughput.json"
MODEL = "smollm2-135m"
SETTINGS = {"max_new_tokens": 32, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "stop": ["\n"]}


class Timer:
    """Wall-clock and process CPU seconds of a block (CPU time is steadier on a shared machine)."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def load_items(n: int) -> list[Any]:
    from candor.data.items import QAItem

    items = []
    with DATA.open() as f:
        for i, line in enumerate(f):
            if i == n:
                break
            row = json.loads(line)
            items.append(
                QAItem(id=f"nq-{i}", dataset="nq", split="test", question=row["question"], answers=tuple(row["answer"]))
            )
    return items


def sampling_params() -> Any:
    from candor.backends.base import SamplingParams

    return SamplingParams(**{**SETTINGS, "stop": tuple(SETTINGS["stop"])})


def generated_tokens(gens: list[Any], max_new_tokens: int) -> int:
    """Tokens generated for every answer, counting the stop token that ended one before the cap."""
    return sum(
        len(c.token_ids) + (len(c.token_ids) < max_new_tokens) for g in gens for c in [g.greedy, *g.samples]
    )


def prompts_for(items: list[Any], backend: Any) -> list[str]:
    from candor.annotation.prompts import TEMPLATES

    template = TEMPLATES.get("fewshot")
    return [template(item, backend) for item in items]


# ------------------------------------------------------------------- paths


def run_candor(items: list[Any], k: int, batch_size: int, dtype: str, packed: bool = True) -> dict[str, Any]:
    from candor.backends.hf import HFBackend

    # packed=False: nn.Linear's own kernels, the same loop (the candor-stock baseline)
    backend = HFBackend.from_pretrained(MODEL, batch_size=batch_size, dtype=dtype, pack_linears=packed)
    prompts = prompts_for(items, backend)
    params = sampling_params()
    backend.generate(prompts[:1], 1, params)  # warm-up: first-call allocations, decoded vocabulary
    with Timer() as timer:
        gens = backend.generate(prompts, k, params, seeds=list(range(len(prompts))))
    tokens = generated_tokens(gens, params.max_new_tokens)
    return {
        "seconds": timer.wall,
        "cpu_seconds": timer.cpu,
        "tokens": tokens,
        "greedy": [g.greedy.text for g in gens],
        "greedy_token_ids": [list(g.greedy.token_ids) for g in gens],
        "greedy_logprobs": [list(g.greedy.logprobs) for g in gens],
        "samples": [[c.text for c in g.samples] for g in gens],
    }


def run_naive(items: list[Any], k: int, dtype: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from candor.backends.default_model import resolve_embedded

    path = resolve_embedded(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    prompts = prompts_for(items, _RenderOnly())
    # The stop string as end-of-sequence ids (every token whose text contains it): the same
    # semantics as candor's stop set. ``stop_strings=`` would add about 1 s of set-up per call.
    vocab = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    stop_ids = [i for i, text in enumerate(vocab) if any(s in text for s in SETTINGS["stop"])]
    common = {
        "max_new_tokens": SETTINGS["max_new_tokens"],
        "eos_token_id": [tokenizer.eos_token_id, *stop_ids],
        "pad_token_id": tokenizer.pad_token_id,
        "return_dict_in_generate": True,
        "output_logits": True,
    }
    sampled = {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 50}

    def answer(inputs: Any, **kwargs: Any) -> tuple[str, list[float], int]:
        out = model.generate(**inputs, **common, **kwargs)
        new = out.sequences[0, inputs["input_ids"].shape[1] :]
        logprobs = [
            torch.log_softmax(step[0].float(), -1)[tok].item() for step, tok in zip(out.logits, new, strict=False)
        ]
        text = tokenizer.decode(new, skip_special_tokens=True).split("\n")[0].strip()
        return text, logprobs, len(new)

    with torch.inference_mode():
        answer(tokenizer(prompts[0], return_tensors="pt"), do_sample=False)  # warm-up
        greedy, samples, tokens = [], [], 0
        with Timer() as timer:
            for i, prompt in enumerate(prompts):
                inputs = tokenizer(prompt, return_tensors="pt")
                text, _, count = answer(inputs, do_sample=False)
                greedy.append(text)
                tokens += count
                texts = []
                for j in range(k):
                    torch.manual_seed(i * 1000 + j)
                    text, _, count = answer(inputs, **sampled)
                    texts.append(text)
                    tokens += count
                samples.append(texts)
    return {"seconds": timer.wall, "cpu_seconds": timer.cpu, "tokens": tokens, "greedy": greedy, "samples": samples}


def run_annotate(items: list[Any], k: int, batch_size: int, dtype: str) -> dict[str, Any]:
    from candor.annotation.builder import AnnotateConfig, annotate
    from candor.annotation.prompts import TEMPLATES
    from candor.backends.hf import HFBackend

    backend = HFBackend.from_pretrained(MODEL, batch_size=batch_size, dtype=dtype)
    backend.generate(prompts_for(items[:1], backend), 1, sampling_params())  # same warm-up as candor
    config = AnnotateConfig(k=k, params=sampling_params(), batch_size=batch_size)
    with tempfile.TemporaryDirectory() as tmp, Timer() as timer:
        result = annotate(items, backend, Path(tmp) / "records.jsonl", TEMPLATES.get("fewshot"), config, progress=False)
    return {"seconds": timer.wall, "cpu_seconds": timer.cpu, "written": result.written}


class _RenderOnly:
    """Stands in for a backend when only the few-shot template renders (it needs no model)."""

    model_name = MODEL

    def render_chat(self, messages: Any, add_generation_prompt: bool = True) -> str:
        raise NotImplementedError


# -------------------------------------------------------------------- main


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    items = load_items(args.questions)
    if args.path in ("candor", "candor-stock"):
        out = run_candor(items, args.k, args.batch_size, args.dtype, packed=args.path == "candor")
    elif args.path == "naive":
        out = run_naive(items, args.k, args.dtype)
    else:
        out = run_annotate(items, args.k, args.batch_size, args.dtype)
    out["peak_rss_mib"] = peak_rss_mib()
    Path(args.child_out).write_text(json.dumps(out))


def run_child(path: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        cmd = [
            sys.executable,
            __file__,
            "--path",
            path,
            "--child-out",
            tmp.name,
            "--questions",
            str(args.questions),
            "--k",
            str(args.k),
            "--batch-size",
            str(args.batch_size),
            "--threads",
            str(args.threads),
            "--dtype",
            args.dtype,
        ]
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_WAIT_POLICY": omp_wait_policy()})
        return json.loads(Path(tmp.name).read_text())


def omp_wait_policy() -> str:
    return os.environ.get("OMP_WAIT_POLICY", "PASSIVE")


def has_annotate() -> bool:
    try:
        from candor.annotation.builder import annotate  # noqa: F401
    except ImportError:
        return False
    return True


def job_parser(description: str, questions: int = 64, out: Path = RESULTS) -> argparse.ArgumentParser:
    """The options of the annotation job these speed benchmarks share (questions, k, batch, threads, --out)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--questions", type=int, default=questions)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=out)
    return parser


def main() -> None:
    parser = job_parser(__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--paths", default="candor,candor-stock,naive,annotate", help="comma-separated subset to run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each candor path (alternating); the median")
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.path:
        child(args)
        return
    if not DATA.exists():
        print(f"skipped: NQ test data not found at {DATA} (benchmarks need ../shared/data)")
        return

    paths = [p for p in args.paths.split(",") if p != "annotate" or has_annotate()]
    args.load_before = os.getloadavg()
    repeated = [p for p in paths if p.startswith("candor")]
    order = [p for _ in range(max(1, args.repeats)) for p in repeated] + [p for p in paths if p not in repeated]
    attempts: dict[str, list[dict[str, Any]]] = {}
    for path in order:
        print(f"running {path} ...", flush=True)
        run = run_child(path, args)
        attempts.setdefault(path, []).append(run)
        print(f"  {run['seconds']:.1f} s wall, {run['cpu_seconds']:.1f} s CPU, peak RSS {run['peak_rss_mib']:.0f} MiB")
    runs = {path: median_run(tries) for path, tries in attempts.items()}
    args.repeat_seconds = {
        path: {"wall": [round(t["seconds"], 2) for t in tries], "cpu": [round(t["cpu_seconds"], 2) for t in tries]}
        for path, tries in attempts.items() if len(tries) > 1
    }
    report(runs, args)


def median_run(tries: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall time (its CPU time and outputs with it)."""
    return sorted(tries, key=lambda t: t["seconds"])[len(tries) // 2]


def logprob_drift(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest |Δ log-prob| between two runs' greedy answers, over the answers whose tokens are identical."""
    drift = 0.0
    for ids_a, ids_b, lp_a, lp_b in zip(
        a["greedy_token_ids"], b["greedy_token_ids"], a["greedy_logprobs"], b["greedy_logprobs"], strict=True
    ):
        if ids_a == ids_b:
            drift = max([drift, *(abs(x - y) for x, y in zip(lp_a, lp_b, strict=True))])
    return drift


def report(runs: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    from candor.util.cpu import describe  # here, not at the top: the parent loads no torch before its children

    candor, naive = runs.get("candor"), runs.get("naive")
    result: dict[str, Any] = {
        "model": MODEL,
        "questions": args.questions,
        "samples_per_question": args.k,
        "settings": {
            **SETTINGS,
            "template": "fewshot",
            "batch_size": args.batch_size,
            "dtype": args.dtype,
            "torch_threads": args.threads,
            "omp_wait_policy": omp_wait_policy(),
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "machine": describe(),
        },
        # 1/5/15-minute load averages before and after the run: the machine is shared, so wall-clock
        # figures carry the other jobs' load; CPU seconds and same-run ratios are steadier.
        "load_average": {
            "before": [round(x, 2) for x in args.load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    if candor:
        result["candor_seconds"] = round(candor["seconds"], 2)
        result["candor_cpu_seconds"] = round(candor["cpu_seconds"], 2)
        result["candor_tokens_per_second"] = round(candor["tokens"] / candor["seconds"], 1)
        result["candor_tokens_per_cpu_second"] = round(candor["tokens"] / candor["cpu_seconds"], 1)
    if naive:
        result["naive_seconds"] = round(naive["seconds"], 2)
        result["naive_cpu_seconds"] = round(naive["cpu_seconds"], 2)
        result["naive_tokens_per_second"] = round(naive["tokens"] / naive["seconds"], 1)
    if candor and naive:
        same = sum(a == b for a, b in zip(candor["greedy"], naive["greedy"], strict=True))
        result["speedup"] = round(naive["seconds"] / candor["seconds"], 2)
        result["cpu_time_speedup"] = round(naive["cpu_seconds"] / candor["cpu_seconds"], 2)
        result["greedy_identical"] = same == len(candor["greedy"])
        result["greedy_identical_count"] = same
    stock = runs.get("candor-stock")
    if candor and stock:
        result["stock_seconds"] = round(stock["seconds"], 2)
        result["stock_cpu_seconds"] = round(stock["cpu_seconds"], 2)
        result["stock_tokens_per_second"] = round(stock["tokens"] / stock["seconds"], 1)
        result["packed_speedup"] = round(stock["seconds"] / candor["seconds"], 2)
        result["packed_cpu_time_speedup"] = round(stock["cpu_seconds"] / candor["cpu_seconds"], 2)
        result["packed_greedy_identical_count"] = sum(
            a == b for a, b in zip(candor["greedy"], stock["greedy"], strict=True)
        )
        result["packed_greedy_logprob_max_abs_diff"] = float(f"{logprob_drift(candor, stock):.2e}")
    if getattr(args, "repeat_seconds", None):
        result["repeats"] = args.repeat_seconds
    result["peak_rss_mib"] = {name: round(run["peak_rss_mib"]) for name, run in runs.items()}
    if "annotate" in runs:
        result["annotate_seconds"] = round(runs["annotate"]["seconds"], 2)
        result["annotate_cpu_seconds"] = round(runs["annotate"]["cpu_seconds"], 2)
    if args.out.exists():  # the profile and steps blocks come from annotate_profile.py / annotate_steps.py: keep them
        previous = json.loads(args.out.read_text())
        for block in ("profile", "steps"):
            if block in previous:
                result[block] = previous[block]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    if naive:
        wall, cpu = naive["seconds"], naive["cpu_seconds"]
        for name, run in runs.items():
            print(
                f"{name:>12}: {run['seconds']:7.1f} s wall = {wall / run['seconds']:5.2f}x naive; "
                f"{run['cpu_seconds']:7.1f} s CPU = {cpu / run['cpu_seconds']:5.2f}x naive"
            )
    if "packed_speedup" in result:
        print(f"packed / stock kernels: {result['packed_speedup']:.2f}x wall, {result['packed_cpu_time_speedup']:.2f}x "
              f"CPU; greedy identical {result['packed_greedy_identical_count']}/{args.questions}, "
              f"max |d logprob| {result['packed_greedy_logprob_max_abs_diff']:.1e}")
    if "greedy_identical_count" in result:
        print(f"greedy answers identical: {result['greedy_identical_count']}/{args.questions}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
