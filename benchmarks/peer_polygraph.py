"""candor against lm-polygraph on one job, both measured in one invocation.

The job (the annotation defaults, docs/methods.md "Generation and judging"):

- the first 64 NQ questions of ``shared/data/honestybench/nq/test.jsonl``
  (a speed comparison only: nothing is tuned or evaluated on them);
- the prompt rendered by candor's ``fewshot`` template;
- the embedded default model (SmolLM2-135M) from its local safetensors folder;
- a greedy answer and 5 samples per question (temperature 1, top-p 0.95,
  top-k 50), every token's log-prob kept, at most 32 new tokens.

lm-polygraph runs in its own virtual environment (``--venv``; created with
torch 2.13.0 and lm-polygraph 0.7.0 when it does not exist), through
``UEManager`` with the calculators this job needs: greedy generation with
log-probs (``GreedyProbsCalculator``, attentions and hidden states off: its
attentions path crashes on transformers 5.x) and 5 samples
(``SamplingGenerationCalculator``), feeding MaximumSequenceProbability,
MonteCarloSequenceEntropy and LexicalSimilarity. Batch size 16, as candor's.

Honest differences:

- lm-polygraph generates every answer to the token cap (32) unless EOS comes
  first; candor stops a row at the first newline, which is where the
  few-shot answer ends. So the ratio is also reported with candor forced to
  the same cap (no stop string: every row runs to 32 tokens or EOS).
- lm-polygraph's sampling calculator also asks ``generate`` for hidden
  states (hard-coded); that is its cost, not a setting we can turn off.

Each side runs in its own subprocess; model loading is outside the timed
regions, and the whole-process wall time is reported as well. Results:
``benchmarks/results/peer_polygraph.json`` (both wall times, the ratios, both
greedy outputs).

    python -m benchmarks.peer_polygraph [--venv .polygraph-venv] [--questions 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.annotation_job import DATA, MODEL, RenderOnly, load_items, prompts_for
from benchmarks.children import script_command, script_env
from benchmarks.measure import Timer
from benchmarks.polygraph import DEFAULT_VENV, ensure_venv

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "peer_polygraph.json"
SETTINGS = {"max_new_tokens": 32, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "samples": 5, "batch_size": 16}


# ------------------------------------------------------------------ children


def polygraph_child(job: dict[str, Any]) -> dict[str, Any]:
    """Runs under the polygraph venv: imports nothing from candor."""
    import torch
    from lm_polygraph.defaults.register_default_stat_calculators import register_default_stat_calculators
    from lm_polygraph.estimators import LexicalSimilarity, MaximumSequenceProbability, MonteCarloSequenceEntropy
    from lm_polygraph.utils.builder_enviroment_stat_calculator import BuilderEnvironmentStatCalculator
    from lm_polygraph.utils.dataset import Dataset
    from lm_polygraph.utils.generation_parameters import GenerationParameters
    from lm_polygraph.utils.manager import UEManager
    from lm_polygraph.utils.model import WhiteboxModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(job["threads"])
    s = job["settings"]
    tokenizer = AutoTokenizer.from_pretrained(job["model_path"], padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    hf_model = AutoModelForCausalLM.from_pretrained(job["model_path"], dtype=torch.float32).eval()
    params = GenerationParameters(temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"])
    model = WhiteboxModel(hf_model, tokenizer, job["model_path"], generation_parameters=params)
    data = Dataset(job["prompts"], job["answers"], batch_size=s["batch_size"])
    calculators = register_default_stat_calculators("Whitebox", output_attentions=False, output_hidden_states=False)
    estimators = [MaximumSequenceProbability(), MonteCarloSequenceEntropy(), LexicalSimilarity("rougeL")]
    manager = UEManager(
        data,
        model,
        estimators,
        BuilderEnvironmentStatCalculator(model),
        calculators,
        generation_metrics=[],
        ue_metrics=[],
        processors=[],
        ignore_exceptions=False,
        verbose=False,
        max_new_tokens=s["max_new_tokens"],
    )
    for calc in manager.stat_calculators:  # the simple builder ignores config: 10 samples unless set here
        if hasattr(calc, "samples_n"):
            calc.samples_n = s["samples"]
    with Timer() as timer:
        manager()
    greedy = [str(t) for t in manager.stats["greedy_texts"]]
    tokens = [len(t) for t in manager.stats["greedy_tokens"]]
    return {"seconds": timer.wall, "cpu_seconds": timer.cpu, "greedy": greedy, "greedy_tokens": tokens}


def candor_child(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from candor.backends.base import SamplingParams
    from candor.backends.hf import HFBackend

    torch.set_num_threads(job["threads"])
    s = job["settings"]
    backend = HFBackend.from_pretrained(MODEL, batch_size=s["batch_size"])
    out: dict[str, Any] = {}
    for name, stop in (("stop_at_newline", ("\n",)), ("to_token_cap", ())):
        params = SamplingParams(
            max_new_tokens=s["max_new_tokens"],
            temperature=s["temperature"],
            top_p=s["top_p"],
            top_k=s["top_k"],
            stop=stop,
        )
        backend.generate(job["prompts"][:1], 1, params)  # warm-up: first-call allocations, decoded vocabulary
        with Timer() as timer:
            gens = backend.generate(job["prompts"], s["samples"], params)
        out[name] = {
            "seconds": timer.wall,
            "cpu_seconds": timer.cpu,
            "greedy": [g.greedy.text for g in gens],
            "greedy_tokens": [len(g.greedy.token_ids) for g in gens],
        }
    return out


def run_child(python: str, side: str, job: dict[str, Any]) -> dict[str, Any]:
    """One side in its own process; returns its result plus the whole process's wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_file.write_text(json.dumps(job))
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        env = script_env(env, ROOT / "src") if side == "candor" else script_env(env)
        start = time.perf_counter()
        command = script_command(__spec__.name, "--child", side, str(job_file), str(out_file), python=python)
        subprocess.run(command, check=True, env=env)
        result = json.loads(out_file.read_text())
        result["process_seconds"] = time.perf_counter() - start
        return result


# ------------------------------------------------------------------ main


def build_job(n: int, threads: int) -> dict[str, Any]:
    """The job both sides run: the first ``n`` NQ test questions' few-shot prompts, gold answers, the model."""
    from candor.backends.default_model import resolve_embedded

    items = load_items(n)
    return {
        "prompts": prompts_for(items, RenderOnly()),
        "answers": [item.answers[0] if item.answers else "" for item in items],
        "model_path": str(resolve_embedded(MODEL)),
        "settings": SETTINGS,
        "threads": threads,
    }


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        side, job_file, out_file = sys.argv[2:]
        job = json.loads(Path(job_file).read_text())
        result = polygraph_child(job) if side == "polygraph" else candor_child(job)
        Path(out_file).write_text(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not DATA.exists():
        print(f"skipped: NQ test data not found at {DATA}")
        return
    job = build_job(args.questions, args.threads)
    python = str(ensure_venv(args.venv))
    args.load_before = os.getloadavg()
    print("running lm-polygraph ...", flush=True)
    peer = run_child(python, "polygraph", job)
    print(f"  {peer['seconds']:.1f} s (UEManager), {peer['process_seconds']:.1f} s process", flush=True)
    print("running candor ...", flush=True)
    ours = run_child(sys.executable, "candor", job)
    report(job, peer, ours, args)


def report(job: dict[str, Any], peer: dict[str, Any], ours: dict[str, Any], args: argparse.Namespace) -> None:
    from candor.util.cpu import describe  # here: the polygraph child runs this file in a venv without candor

    newline, capped = ours["stop_at_newline"], ours["to_token_cap"]
    first_lines = [text.strip().split("\n")[0].strip() for text in peer["greedy"]]
    result = {
        "job": {
            "questions": len(job["prompts"]),
            "dataset": "HonestyBench NQ test.jsonl (first rows)",
            "template": "fewshot",
            "model": MODEL,
            **SETTINGS,
            "torch_threads": args.threads,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
            "machine": describe(),
        },
        # 1/5/15-minute load averages around both runs (the machine is shared; CPU-time ratios are steadier).
        "load_average": {
            "before": [round(x, 2) for x in args.load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        "polygraph": {
            "version": "lm-polygraph 0.7.0 (UEManager; GreedyProbsCalculator without attentions or hidden states, "
            "SamplingGenerationCalculator with samples_n=5)",
            "seconds": round(peer["seconds"], 2),
            "cpu_seconds": round(peer["cpu_seconds"], 2),
            "process_seconds": round(peer["process_seconds"], 2),
        },
        "candor": {
            "seconds": round(newline["seconds"], 2),
            "cpu_seconds": round(newline["cpu_seconds"], 2),
            "seconds_to_token_cap": round(capped["seconds"], 2),
            "cpu_seconds_to_token_cap": round(capped["cpu_seconds"], 2),
            "process_seconds_both_runs": round(ours["process_seconds"], 2),
        },
        "ratio_polygraph_to_candor": round(peer["seconds"] / newline["seconds"], 2),
        "ratio_polygraph_to_candor_same_token_cap": round(peer["seconds"] / capped["seconds"], 2),
        "cpu_ratio_polygraph_to_candor": round(peer["cpu_seconds"] / newline["cpu_seconds"], 2),
        "cpu_ratio_polygraph_to_candor_same_token_cap": round(peer["cpu_seconds"] / capped["cpu_seconds"], 2),
        "greedy_first_line_agreement": sum(a == b for a, b in zip(first_lines, newline["greedy"], strict=True)),
        "greedy_capped_agreement": sum(
            a.strip() == b.strip() for a, b in zip(peer["greedy"], capped["greedy"], strict=True)
        ),
        "notes": [
            "lm-polygraph generates every answer to the 32-token cap (or EOS); candor stops at the first newline, "
            "where the few-shot answer ends. ratio_polygraph_to_candor_same_token_cap forces candor to the same "
            "cap (no stop string).",
            "measured on a 2-core machine shared with other jobs: the seconds are noisy, the ratio is from one run",
        ],
        "greedy": {"polygraph": peer["greedy"], "candor": newline["greedy"], "candor_to_token_cap": capped["greedy"]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"lm-polygraph {peer['seconds']:.1f} s, candor {newline['seconds']:.1f} s (ratio "
        f"{result['ratio_polygraph_to_candor']}); candor to the same cap {capped['seconds']:.1f} s (ratio "
        f"{result['ratio_polygraph_to_candor_same_token_cap']}); greedy first lines equal "
        f"{result['greedy_first_line_agreement']}/{len(first_lines)}"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
