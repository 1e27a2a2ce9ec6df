"""A shared prompt prefix kept once in the slot cache, against a copy of it in every row.

When all prompts of a ``generate`` call start with the same few-shot block,
the slot cache (:mod:`candor.backends.engine.kv_slots`) can keep that block's keys
and values once, and the lean decode step attends to it and to each row's
own columns in two parts merged by their log-sum-exps
(:mod:`candor.backends.engine.prefix_attention`); before, every row's slot held a
copy, written when the row joined, moved when rows were compacted, and read
by every step's attention. On the embedded model's ``fewshot`` template, 55
of a prompt's 66-75 tokens are that block.

Two jobs, each in alternating pairs in one process (``HFBackend.split_prefix``
on, the default, against off):

- ``annotation``: the ``annotate_throughput.py`` job (64 NQ questions, a greedy
  answer and 5 samples, cut at the first newline);
- ``to_token_cap``: the same without the stop string, every row to 32 tokens
  (the setting of the race against lm-polygraph, ``peer_polygraph.py``).

The two arms round differently (split attention is exact algebra, not the
same float sums), so outputs are compared, not required bit-equal: how many
completions have the same tokens, and the largest log-prob difference.

    python -m benchmarks.prefix_split [--questions 64] [--pairs 3] [--threads 2]

Writes ``benchmarks/results/prefix_split.json``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.annotation_job import MODEL, load_items, prompts_for, sampling_params
from benchmarks.common import write_json
from benchmarks.races import alternate_arms, arm_summary, generation_outputs, race_parser, race_report

RESULTS = Path(__file__).resolve().parent / "results" / "prefix_split.json"
ARMS = ("prefix_in_every_row", "prefix_kept_once")  # baseline first


def compare(a: list[tuple[list[int], list[float]]], b: list[tuple[list[int], list[float]]]) -> dict[str, Any]:
    """Completions with the same token ids, and the largest log-prob gap among those."""
    same = [(x, y) for x, y in zip(a, b, strict=True) if x[0] == y[0]]
    gap = max((abs(p - q) for (_, lp), (_, lq) in same for p, q in zip(lp, lq, strict=True)), default=0.0)
    return {"completions": len(a), "same_tokens": len(same), "max_abs_logprob_diff": float(f"{gap:.3g}")}


def race(backend: Any, prompts: list[str], k: int, params: Any, pairs: int) -> dict[str, Any]:
    seeds = list(range(len(prompts)))

    def use(split: bool) -> Callable[[], None]:
        return lambda: setattr(backend, "split_prefix", split)

    try:
        times, seen = alternate_arms(
            lambda: generation_outputs(backend.generate(prompts, k, params, seeds=seeds)),
            {ARMS[0]: use(False), ARMS[1]: use(True)},
            pairs,
        )
    finally:
        backend.split_prefix = True
    result: dict[str, Any] = {"prompts": len(prompts), "generated_tokens": sum(len(ids) for ids, _ in seen[ARMS[1]])}
    result.update({arm: arm_summary(runs) for arm, runs in times.items()})
    for arm in ARMS:
        result[arm]["tokens_per_second"] = round(result["generated_tokens"] / result[arm]["median_wall"], 1)
    result["speedup_wall"] = round(result[ARMS[0]]["median_wall"] / result[ARMS[1]]["median_wall"], 2)
    result["speedup_cpu"] = round(result[ARMS[0]]["median_cpu"] / result[ARMS[1]]["median_cpu"], 2)
    result["outputs"] = compare(seen[ARMS[0]], seen[ARMS[1]])
    return result


def main() -> None:
    args = race_parser(__doc__.split("\n")[0], questions=64, pairs=3, out=RESULTS).parse_args()

    import torch

    from candor.backends.hf import HFBackend
    from candor.backends.tokens import usable_prefix_length

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    backend = HFBackend.from_pretrained(MODEL, batch_size=16)
    if backend.lean_step is None:
        raise SystemExit("this torch build or model has no lean decode step: the prefix is never kept apart")
    params = sampling_params()
    prompts = prompts_for(load_items(args.questions), backend)
    encoded = backend.encode(prompts)
    backend.generate(prompts[:2], 1, params)  # warm-up: packing, the lean step's check
    jobs = {
        "annotation": race(backend, prompts, args.k, params, args.pairs),
        "to_token_cap": race(backend, prompts, args.k, dataclasses.replace(params, stop=()), args.pairs),
    }
    report = race_report(
        MODEL,
        args,
        load_before,
        "python -m benchmarks.prefix_split",
        shared_prefix_tokens=usable_prefix_length(backend.model, encoded, params.max_new_tokens),
        prompt_tokens={"min": min(map(len, encoded)), "max": max(map(len, encoded))},
        jobs=jobs,
    )
    for name, job in jobs.items():
        once, every = job[ARMS[1]], job[ARMS[0]]
        print(
            f"{name}: kept once {once['median_wall']} s / {once['median_cpu']} CPU s, in every row "
            f"{every['median_wall']} / {every['median_cpu']}: {job['speedup_wall']}x wall, {job['speedup_cpu']}x CPU; "
            f"{job['outputs']['same_tokens']}/{job['outputs']['completions']} same tokens, "
            f"max |d log-prob| {job['outputs']['max_abs_logprob_diff']}"
        )
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
