"""The live engine with and without the template's shared prefix (issue 24): requests/s at concurrency 32.

In process, the embedded model on the CPU: ``--requests`` served-question
requests (the ``fewshot`` prompt of a starter question, the greedy answer
plus ``n-prob``'s samples, ``--max-new-tokens``, seeded per question) are
submitted at once to a live engine holding ``--concurrency`` requests' rows,
opened with the template's prefix (``prefix_on``: run once, each prompt
prefilled past it) or without (``prefix_off``: every prompt prefilled
whole). The arms alternate for ``--repeats`` rounds (a shared CPU drifts);
each finished round is written at once and a rerun skips the rounds already
there for the same setup (``--redo`` measures again). The two arms' token ids
must agree and their log-probs within 1e-5, or the run fails.

    PYTHONPATH=src python -m benchmarks.live_prefix [--requests 32] [--repeats 2]

Results: ``benchmarks/results/live_prefix.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, logger, setup_logging, write_json
from candor.backends.base import DecodeRequest, Generations, SamplingParams
from candor.backends.hf import HFBackend
from candor.data import load_items
from candor.serve import HonestModel
from candor.serve.answering import question_seed
from candor.serve.confidence_sources import question_item

ARMS = ("prefix_off", "prefix_on")


def requests(model: HonestModel, count: int, max_new_tokens: int) -> list[DecodeRequest]:
    items = load_items("starter")
    questions = [items[i % len(items)].question for i in range(count)]
    params = SamplingParams(max_new_tokens=max_new_tokens, stop=model.template.stop)
    return [
        DecodeRequest(
            prompt=model.template(question_item(q), model.backend),
            n=model.source.samples,
            params=params,
            greedy=True,
            seed=question_seed(q),
        )
        for q in questions
    ]


def run_arm(backend: HFBackend, reqs: list[DecodeRequest], rows: int, prefix: list[int] | None) -> tuple[float, list]:
    """Seconds until every request has finished, and the results (the prefix's own run included)."""
    start = time.perf_counter()
    with backend.live_engine(max_rows=rows, shared_prefix=prefix) as engine:
        futures = [engine.submit(r) for r in reqs]
        results = [f.result() for f in futures]
    return time.perf_counter() - start, results


def same(a: list[Generations], b: list[Generations]) -> None:
    for ga, gb in zip(a, b, strict=True):
        for x, y in zip([ga.greedy, *ga.samples], [gb.greedy, *gb.samples], strict=True):
            assert x.token_ids == y.token_ids, "the arms decoded different tokens"
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5, rtol=1e-5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32, help="requests whose rows the engine holds")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a shared CPU)")
    parser.add_argument("--redo", action="store_true", help="measure again the rounds already stored")
    parser.add_argument("--out", default=str(RESULTS / "live_prefix.json"))
    args = parser.parse_args()
    setup_logging()
    import torch

    torch.set_num_threads(args.threads)
    setup = {k: getattr(args, k) for k in ("model", "requests", "concurrency", "max_new_tokens", "threads")}
    out = Path(args.out)
    payload: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if payload.get("setup") != setup or args.redo:
        payload = {"setup": setup, "rounds": []}
    backend = HFBackend.from_pretrained(args.model, device="cpu")
    model = HonestModel(backend, "n-prob", template="fewshot")
    reqs = requests(model, args.requests, args.max_new_tokens)
    shared = model.shared_prefix()
    assert shared is not None, "the fewshot template has no shared prefix on this model"
    prefix = shared.ids
    rows = args.concurrency * (1 + model.source.samples)
    run_arm(backend, reqs[:2], rows, None)  # warm-up
    reference: list[Generations] | None = None
    while len(payload["rounds"]) < args.repeats:
        seconds: dict[str, float] = {}
        for arm in ARMS:
            took, results = run_arm(backend, reqs, rows, prefix if arm == "prefix_on" else None)
            seconds[arm] = took
            if reference is None:
                reference = results
            else:
                same(reference, results)
            logger.info("%s: %.1f s, %.2f req/s", arm, took, len(reqs) / took)
        payload["rounds"].append({arm: {"seconds": s, "requests_per_s": len(reqs) / s} for arm, s in seconds.items()})
        payload["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
        payload["command"] = "PYTHONPATH=src python -m benchmarks.live_prefix " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in setup.items()
        )
        payload["prompt_tokens"] = {
            "prompt_mean": float(np.mean([len(backend.encode([r.prompt])[0]) for r in reqs])),
            "shared_prefix": len(prefix),
        }
        write_json(out, payload)
    on = [r["prefix_on"]["requests_per_s"] for r in payload["rounds"]]
    off = [r["prefix_off"]["requests_per_s"] for r in payload["rounds"]]
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    payload["summary"] = {
        "prefix_on_rps": float(np.median(on)),
        "prefix_off_rps": float(np.median(off)),
        "ratio_on_over_off": float(np.median(ratios)),
    }
    write_json(out, payload)
    print(
        f"prefix on {payload['summary']['prefix_on_rps']:.2f} req/s, off {payload['summary']['prefix_off_rps']:.2f}"
        f" req/s: {payload['summary']['ratio_on_over_off']:.2f}x ({os.path.basename(args.out)})"
    )


if __name__ == "__main__":
    main()
