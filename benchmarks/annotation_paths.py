"""The ways to run the annotation job (:mod:`benchmarks.annotation_job`), each in its own process.

- ``candor``: ``HFBackend.generate`` on all questions (chunks of ``batch_size``), on prepacked
  weights with each decode step's small ops on one thread (the default);
- ``candor-stock``: the same loop with ``pack_linears=False`` (``nn.Linear``'s own kernels);
- ``naive``: per question one greedy ``model.generate`` call and k sampled calls, the same stop;
- ``annotate``: the full ``candor.annotation.builder.annotate`` (generation, judges, records).

:func:`run_child` runs one path in a fresh subprocess (so its peak RSS is its own; model loading
is outside the timed region) through the hidden ``--path`` mode of ``annotate_throughput.py``,
whose children run :func:`child`. ``annotate_throughput.py`` and ``annotate_dtype.py`` use it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.annotation_job import (
    MODEL,
    SETTINGS,
    RenderOnly,
    generated_tokens,
    load_items,
    omp_wait_policy,
    prompts_for,
    sampling_params,
)
from benchmarks.children import script_command, script_env
from benchmarks.measure import Timer, peak_rss_mib

PATHS = ("candor", "candor-stock", "naive", "annotate")
CHILD_SCRIPT = "benchmarks.annotate_throughput"  # its --path mode runs child()


def run_candor(items: list[Any], k: int, batch_size: int, dtype: str, packed: bool = True) -> dict[str, Any]:
    """candor's decode loop on ``items``: timings, generated tokens, greedy answers (ids, log-probs) and samples."""
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
    """Per question one greedy and ``k`` sampled ``model.generate`` calls (what per-question toolkits do)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from candor.backends.default_model import resolve_embedded

    path = resolve_embedded(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    prompts = prompts_for(items, RenderOnly())
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
    """The full ``annotate`` on ``items`` (generation, judges, records written to a temporary file)."""
    from candor.annotation.builder import AnnotateConfig, annotate
    from candor.annotation.prompts import TEMPLATES
    from candor.backends.hf import HFBackend

    backend = HFBackend.from_pretrained(MODEL, batch_size=batch_size, dtype=dtype)
    backend.generate(prompts_for(items[:1], backend), 1, sampling_params())  # same warm-up as candor
    config = AnnotateConfig(k=k, params=sampling_params(), batch_size=batch_size)
    with tempfile.TemporaryDirectory() as tmp, Timer() as timer:
        result = annotate(items, backend, Path(tmp) / "records.jsonl", TEMPLATES.get("fewshot"), config, progress=False)
    return {"seconds": timer.wall, "cpu_seconds": timer.cpu, "written": result.written}


def child(args: argparse.Namespace) -> None:
    """In the child: run ``args.path`` on the job and write its result to ``args.child_out``."""
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
    """Path ``path`` on the job of ``args`` (questions, k, batch size, threads, dtype) in a fresh process."""
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        cmd = script_command(
            CHILD_SCRIPT,
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
        )
        subprocess.run(cmd, check=True, env={**script_env(), "OMP_WAIT_POLICY": omp_wait_policy()})
        return json.loads(Path(tmp.name).read_text())


def median_run(tries: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall time (its CPU time and outputs with it)."""
    return sorted(tries, key=lambda t: t["seconds"])[len(tries) // 2]


def has_annotate() -> bool:
    """Whether ``candor.annotation.builder.annotate`` is there to run the ``annotate`` path."""
    try:
        from candor.annotation.builder import annotate  # noqa: F401
    except ImportError:
        return False
    return True
