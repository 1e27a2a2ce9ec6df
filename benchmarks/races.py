"""Same-process races of two arms of ``generate``: their options, the alternating runs, and the results file.

One process and alternation put the arms under the same load on a shared machine; the numbers
to read are the same-run ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.measure import Timer
from candor.util.cpu import describe


def race_parser(description: str, *, questions: int, pairs: int, out: Path) -> argparse.ArgumentParser:
    """The options of a same-process race of ``generate`` arms (questions, pairs, k, threads, --out)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--questions", type=int, default=questions)
    parser.add_argument("--pairs", type=int, default=pairs)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=out)
    return parser


def race_report(
    model: str, args: argparse.Namespace, load_before: tuple[float, ...], command: str, **sections: Any
) -> dict[str, Any]:
    """A same-process race's results file: its settings, the load around it, ``sections``, command and note."""
    return {
        "model": model,
        "samples_per_question": args.k,
        "torch_threads": args.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "machine": describe(),
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        **sections,
        "command": command,
        "note": "one process, arms alternating; read the same-run ratios, not the seconds (a shared 2-core machine)",
    }


def alternate_arms(
    run: Callable[[], list[Any]], arms: dict[str, Callable[[], None]], pairs: int
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[Any]]]:
    """Run ``run`` ``pairs`` times under each arm (its setter called first), alternating which goes first.

    Returns each arm's (wall, CPU) seconds per run and the outputs of its first run. One
    process and alternation put the arms under the same load on a shared machine.
    """
    names = list(arms)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    seen: dict[str, list[Any]] = {}
    for i in range(pairs):
        for name in names if i % 2 == 0 else names[::-1]:
            arms[name]()
            with Timer() as timer:
                out = run()
            times[name].append((timer.wall, timer.cpu))
            seen.setdefault(name, out)
    return times, seen


def generation_outputs(gens: list[Any]) -> list[tuple[list[int], list[float]]]:
    """Every completion's token ids and log-probs, greedy first then samples, prompt by prompt."""
    return [(list(c.token_ids), list(c.logprobs)) for g in gens for c in [g.greedy, *g.samples]]


def race_generate(
    backend: Any, prompts: list[str], k: int, params: Any, pairs: int, arms: dict[str, Callable[[], None]]
) -> dict[str, Any]:
    """``backend.generate`` under two arms (baseline first), alternating: medians, ratios, equal outputs.

    The ratios are the baseline's median over the second arm's; the outputs are token ids and log-probs.
    """
    seeds = list(range(len(prompts)))
    times, seen = alternate_arms(
        lambda: generation_outputs(backend.generate(prompts, k, params, seeds=seeds)), arms, pairs
    )
    baseline, new = list(arms)
    tokens = sum(len(ids) for ids, _ in seen[new])
    result: dict[str, Any] = {"prompts": len(prompts), "generated_tokens": tokens}
    result.update({arm: arm_summary(runs) for arm, runs in times.items()})
    result["speedup_wall"] = round(result[baseline]["median_wall"] / result[new]["median_wall"], 2)
    result["speedup_cpu"] = round(result[baseline]["median_cpu"] / result[new]["median_cpu"], 2)
    result["outputs_bit_equal"] = seen[new] == seen[baseline]
    result.update(output_agreement(seen[baseline], seen[new]))
    return result


def output_agreement(
    first: list[tuple[list[int], list[float]]], second: list[tuple[list[int], list[float]]]
) -> dict[str, Any]:
    """How far two runs' completions agree when not bit for bit: equal token ids, and the log-prob gap on those."""
    same = [(a, b) for a, b in zip(first, second, strict=True) if a[0] == b[0]]
    gaps = [abs(x - y) for (_, lp_a), (_, lp_b) in same for x, y in zip(lp_a, lp_b, strict=True)]
    return {
        "completions": len(first),
        "completions_same_tokens": len(same),
        "max_logprob_gap_same_tokens": float(f"{max(gaps, default=0.0):.3g}"),
    }


def arm_summary(runs: list[tuple[float, float]]) -> dict[str, Any]:
    """One arm's runs: wall and CPU seconds of each, and their medians."""
    return {
        "wall": [round(w, 2) for w, _ in runs],
        "cpu": [round(c, 2) for _, c in runs],
        "median_wall": round(statistics.median(w for w, _ in runs), 2),
        "median_cpu": round(statistics.median(c for _, c in runs), 2),
    }
