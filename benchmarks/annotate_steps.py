"""Where the annotation decode loop's wall time goes, step by step: full batches, the tail, prefill, admission.

Runs ``HFBackend.generate`` on the job of ``annotate_throughput.py`` (embedded
default, ``fewshot`` template, greedy + k samples, cut at the newline) and
times, without a profiler, every prefill, every admission of rows into the KV
slots and every decode step with the number of rows it ran. It also times one
decode step of the bare model at 1 row and at a full batch, which tells how
much of a step is reading the weights (a step costs about that much whatever
its rows) rather than computing. It merges a ``steps`` section into
``benchmarks/results/annotate_throughput.json``.

    python -m benchmarks.annotate_steps [--questions 64] [--k 5] [--threads 2]
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from benchmarks.annotation_job import MODEL, job_parser, load_items, prompts_for, sampling_params

# Decode steps grouped by the rows they ran.
BUCKETS = ((1, 8), (9, 32), (33, 64), (65, 10_000))


class StepLog:
    """Wall seconds per phase, and each decode step's rows and seconds."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.steps: list[tuple[int, float]] = []

    def wrap(self, owner: Any, name: str, phase: str, rows: Callable[[Any], int] | None = None) -> None:
        original = getattr(owner, name)

        def timed(this: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = original(this, *args, **kwargs)
            seconds = time.perf_counter() - start
            self.phases[phase] += seconds
            self.counts[phase] += 1
            if rows is not None:
                self.steps.append((rows(this), seconds))
            return out

        setattr(owner, name, timed)


def bare_step_seconds(backend: Any, rows: int, context: int = 70, repeats: int = 5) -> float:
    """Median wall seconds of one single-token forward of ``rows`` rows over a ``context``-token cache."""
    import torch

    timings = []
    with torch.inference_mode(), backend.packed_linears:
        ids = torch.randint(100, 1000, (rows, context))
        cache = backend.new_cache()
        backend.model(input_ids=ids, past_key_values=cache, use_cache=True)
        step = torch.randint(100, 1000, (rows, 1))
        for _ in range(repeats):
            start = time.perf_counter()
            backend.model(input_ids=step, past_key_values=cache, use_cache=True)
            timings.append(time.perf_counter() - start)
            cache.crop(-1)  # drop the step just written, so every repeat sees the same context
    return sorted(timings)[len(timings) // 2]


def main() -> None:
    args = job_parser(__doc__.split("\n")[0]).parse_args()

    import torch

    from candor.backends.engine.decode_loop import DecodeLoop
    from candor.backends.engine.kv_slots import SlotKV
    from candor.backends.hf import HFBackend

    torch.set_num_threads(args.threads)
    backend = HFBackend.from_pretrained(MODEL, batch_size=args.batch_size)
    prompts = prompts_for(load_items(args.questions), backend)
    params = sampling_params()
    backend.generate(prompts[:2], 1, params)  # warm-up: first-call allocations, packing, decoded vocabulary

    log = StepLog()
    log.wrap(DecodeLoop, "prefill", "prefill")
    log.wrap(SlotKV, "admit", "admit rows (KV writes)")
    log.wrap(SlotKV, "_compact", "compaction (inside decode steps)")
    log.wrap(SlotKV, "advance", "decode steps", rows=lambda kv: kv.live)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    backend.generate(prompts, args.k, params, seeds=list(range(len(prompts))))
    wall = time.perf_counter() - start

    buckets = []
    for low, high in BUCKETS:
        chosen = [seconds for rows, seconds in log.steps if low <= rows <= high]
        buckets.append(
            {
                "rows": f"{low}-{high}" if high < 10_000 else f"{low}+",
                "steps": len(chosen),
                "seconds": round(sum(chosen), 2),
                "ms_per_step": round(1000 * sum(chosen) / len(chosen), 1) if chosen else None,
            }
        )
    full = max(rows for rows, _ in log.steps)
    section = {
        "command": f"python -m benchmarks.annotate_steps --questions {args.questions} --k {args.k} "
        f"--threads {args.threads}",
        "seconds": round(wall, 2),
        "phases": {phase: {"seconds": round(s, 2), "calls": log.counts[phase]} for phase, s in log.phases.items()},
        "decode_steps_by_rows": buckets,
        "rows_per_step": [rows for rows, _ in log.steps],
        "bare_step_ms": {
            "1 row": round(1000 * bare_step_seconds(backend, 1), 1),
            f"{full} rows": round(1000 * bare_step_seconds(backend, full), 1),
        },
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    out["steps"] = section
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in section.items() if k != "rows_per_step"}, indent=2))


if __name__ == "__main__":
    main()
