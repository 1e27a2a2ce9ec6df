"""The decode loop with its small ops on one thread, against every op on torch's threads, in one process.

The same ``HFBackend.generate`` job as ``annotate_throughput.py`` (few-shot NQ
questions, 1 greedy + k samples, prepacked weights), run in alternating pairs:
once with each decode step's small ops on one OpenMP thread (the default,
:mod:`candor.backends.engine.op_threads`) and once with the split off (its size
bound set to 0, so every op runs on torch's threads, as before it). One
process and alternation put both arms under the same load; the medians are
kept. Two settings: cut at the first newline (the annotation job) and run to
the 32-token cap (``peer_polygraph.py``'s capped comparison). The outputs of
the two arms must be bit-equal (token ids and log-probs).

    python -m benchmarks.decode_threads [--questions 32] [--cap-questions 16] [--pairs 6]

Writes ``benchmarks/results/decode_threads.json``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.annotation_job import MODEL, load_items, prompts_for, sampling_params
from benchmarks.common import write_json
from benchmarks.races import race_generate, race_parser, race_report

RESULTS = Path(__file__).resolve().parent / "results" / "decode_threads.json"


def race(backend: Any, prompts: list[str], k: int, params: Any, pairs: int) -> dict[str, Any]:
    """Alternating runs of both arms; their median wall and CPU seconds, and whether the outputs agree."""
    from candor.backends.engine import op_threads

    bound = op_threads.SMALL_OP_ELEMENTS

    def set_bound(value: int) -> Callable[[], None]:
        return lambda: setattr(op_threads, "SMALL_OP_ELEMENTS", value)

    try:
        arms = {"all_threads": set_bound(0), "split": set_bound(bound)}
        return race_generate(backend, prompts, k, params, pairs, arms)
    finally:
        op_threads.SMALL_OP_ELEMENTS = bound


def main() -> None:
    parser = race_parser(__doc__.split("\n")[0], questions=32, pairs=6, out=RESULTS)
    parser.add_argument("--cap-questions", type=int, default=16)
    args = parser.parse_args()

    import torch

    from candor.backends.hf import HFBackend

    torch.set_num_threads(args.threads)
    backend = HFBackend.from_pretrained(MODEL, batch_size=16)
    params = sampling_params()
    capped = dataclasses.replace(params, stop=())
    backend.generate(prompts_for(load_items(2), backend), 1, params)  # warm-up: packing, decoded vocabulary
    load_before = os.getloadavg()
    settings = {
        "first_newline": race(backend, prompts_for(load_items(args.questions), backend), args.k, params, args.pairs),
        "token_cap": race(backend, prompts_for(load_items(args.cap_questions), backend), args.k, capped, args.pairs),
    }
    report = race_report(MODEL, args, load_before, "python -m benchmarks.decode_threads", settings=settings)
    for name, r in settings.items():
        print(
            f"{name}: split {r['split']['median_wall']} s wall / {r['split']['median_cpu']} CPU s, "
            f"all threads {r['all_threads']['median_wall']} / {r['all_threads']['median_cpu']}: "
            f"{r['speedup_wall']}x wall, {r['speedup_cpu']}x CPU; outputs bit-equal: {r['outputs_bit_equal']}"
        )
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
