"""Decoding under a JSON schema against free decoding on the live engine (issue 62): tokens/s, same run.

In process, the embedded model on the CPU: ``--requests`` starter questions,
each asked for a JSON answer (``{"answer": ..., "confidence": ...}``), the
greedy answer plus ``--samples`` seeded samples, ``--max-new-tokens``, all
submitted at once to one live engine holding every row. Two arms alternate
for ``--repeats`` rounds (a shared CPU drifts): ``free`` (no constraint) and
``schema`` (every request under :class:`candor.backends.constraints.JsonConstraint`,
compiled once before the rounds; its grammar cache is what serving keeps).

Two rates per arm:

- ``tokens_per_s``: every generated token (the ending one too) over the wall
  time from the first submit to the last answer, prefills included;
- ``step_tokens_per_s``: the rows decoded in each step over the time spent in
  the steps alone (``DecodeLoop.step``), the rate the mask's cost shows in,
  whatever the two arms' answer lengths.

The ratio reported is schema over free; the goal is at least 0.8. Every
``schema`` answer that ends by its grammar must parse (the run fails
otherwise); answers cut at the token cap are counted.

    PYTHONPATH=src python -m benchmarks.constrained_speed [--requests 16] [--repeats 2]

Results: ``benchmarks/results/constrained_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, logger, setup_logging, write_json
from candor.backends.base import DecodeRequest, Generations, SamplingParams
from candor.backends.constraints import JsonConstraint
from candor.backends.hf import HFBackend
from candor.data import load_items
from candor.util.cpu import describe

ARMS = ("free", "schema")
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 80},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["answer", "confidence"],
}


def requests(
    backend: HFBackend, count: int, samples: int, max_new_tokens: int, constrained: bool
) -> list[DecodeRequest]:
    items = load_items("starter")
    constraint = JsonConstraint.of(SCHEMA) if constrained else None
    out = []
    for i in range(count):
        question = items[i % len(items)].question
        content = f"Answer in JSON with the keys answer and confidence (0-100).\n\n{question}"
        out.append(
            DecodeRequest(
                prompt=backend.render_chat([{"role": "user", "content": content}]),
                n=samples,
                params=SamplingParams(max_new_tokens=max_new_tokens),
                seed=i,
                constraint=constraint,
            )
        )
    return out


class StepClock:
    """Times a decode loop's steps and counts the rows each one decoded."""

    def __init__(self, loop: Any) -> None:
        self.seconds, self.row_steps, self.steps = 0.0, 0, 0
        step: Callable[[], None] = loop.step

        def timed() -> None:
            rows = loop.live_rows
            start = time.perf_counter()
            step()
            self.seconds += time.perf_counter() - start
            self.row_steps += rows
            self.steps += 1

        loop.step = timed


def run_arm(backend: HFBackend, reqs: list[DecodeRequest], rows: int) -> tuple[dict[str, float], list[Generations]]:
    start = time.perf_counter()
    with backend.live_engine(max_rows=rows) as engine:
        clock = StepClock(engine.loop)
        futures = [engine.submit(r) for r in reqs]
        results = [f.result() for f in futures]
    seconds = time.perf_counter() - start
    tokens = sum(c.completion_tokens or 0 for g in results for c in [g.greedy, *g.samples])
    return {
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "step_seconds": clock.seconds,
        "steps": clock.steps,
        "row_steps": clock.row_steps,
        "step_tokens_per_s": clock.row_steps / clock.seconds,
    }, results


def check_schema_answers(results: list[Generations]) -> dict[str, int]:
    """Every schema answer that ended by its grammar parses; the ones cut at the cap are counted."""
    ended, cut = 0, 0
    for gen in results:
        for completion in [gen.greedy, *gen.samples]:
            if completion.finish_reason == "length":
                cut += 1
                continue
            parsed = json.loads(completion.text)
            assert set(parsed) == {"answer", "confidence"}, completion.text
            ended += 1
    return {"parsed": ended, "cut_at_cap": cut}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", default=str(RESULTS / "constrained_speed.json"))
    args = parser.parse_args()
    setup_logging()
    import torch

    torch.set_num_threads(args.threads)
    setup = {k: getattr(args, k) for k in ("model", "requests", "samples", "max_new_tokens", "threads")}
    backend = HFBackend.from_pretrained(args.model, device="cpu")
    arms = {arm: requests(backend, args.requests, args.samples, args.max_new_tokens, arm == "schema") for arm in ARMS}
    backend.grammars.get(JsonConstraint.of(SCHEMA))  # compiled once, as serving keeps it
    rows = args.requests * (1 + args.samples)
    run_arm(backend, arms["schema"][:2], rows)  # warm-up
    rounds = []
    answers: dict[str, int] = {}
    for _ in range(args.repeats):
        measured = {}
        for arm in ARMS:
            measured[arm], results = run_arm(backend, arms[arm], rows)
            if arm == "schema":
                answers = check_schema_answers(results)
            logger.info(
                "%s: %.1f s, %.1f tokens/s, %.1f step tokens/s",
                arm,
                measured[arm]["seconds"],
                measured[arm]["tokens_per_s"],
                measured[arm]["step_tokens_per_s"],
            )
        rounds.append(measured)
    summary = {}
    for rate in ("tokens_per_s", "step_tokens_per_s"):
        ratios = [r["schema"][rate] / r["free"][rate] for r in rounds]
        summary[rate] = {
            "free": float(np.median([r["free"][rate] for r in rounds])),
            "schema": float(np.median([r["schema"][rate] for r in rounds])),
            "ratio_schema_over_free": float(np.median(ratios)),
        }
    payload = {
        "setup": setup,
        "rounds": rounds,
        "summary": summary,
        "schema_answers": answers,
        "goal": "schema / free >= 0.8 (tokens/s)",
        "machine": {**describe(), "python": platform.python_version(), "load_average_at_end": os.getloadavg()},
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip(),
        "command": "PYTHONPATH=src python -m benchmarks.constrained_speed "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in setup.items()),
    }
    write_json(Path(args.out), payload)
    print(
        f"tokens/s: schema {summary['tokens_per_s']['schema']:.1f}, free {summary['tokens_per_s']['free']:.1f}: "
        f"{summary['tokens_per_s']['ratio_schema_over_free']:.2f}x; in decode steps: "
        f"{summary['step_tokens_per_s']['ratio_schema_over_free']:.2f}x ({os.path.basename(args.out)})"
    )


if __name__ == "__main__":
    main()
