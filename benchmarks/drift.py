"""The drift alarm looked at after every label: how often it fires falsely, and how soon it fires on a real fall.

Simulated audits (no model): each run is a stream of i.i.d. labels, correct with probability
``accuracy``, and the alarm is looked at after every label (as a ``/metrics`` scraper that
reads between any two labels would). Two rules, on the same streams:

- **betting** (what ``candor serve`` does, :mod:`candor.serve.audit_monitor`): the anytime-valid
  upper bound of :mod:`candor.evaluation.confidence_sequence` at or below the promise;
- **fixed-level** (what it did before): the one-sided Clopper–Pearson upper bound at level δ,
  computed afresh at every look from the 30th label on, below the promise. Each look alone is
  at level δ; looked at every label, it is not.

Scenarios: the accuracy equals the promise (every alarm is false; the rate should be at most
δ), and the accuracy is ``--drop`` below it (labels to alarm: the detection delay).

    python -m benchmarks.drift [--runs 2000] [--labels 5000] [--promise 0.8] [--delta 0.05] [--drop 0.1]

Writes benchmarks/results/drift.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binom

from benchmarks.common import RESULTS, write_json
from candor.evaluation.confidence_sequence import first_crossing, log_capital
from candor.serve.thresholds import clopper_pearson

FIXED_LEVEL_FIRST_LOOK = 30  # the former tracker reported nothing before 30 labels
CHUNK_RUNS = 250  # runs simulated together (bounds the memory: CHUNK_RUNS × labels floats, a few times)

Rule = Callable[[np.ndarray, float, float], np.ndarray]


def betting_alarms(x: np.ndarray, promise: float, delta: float) -> np.ndarray:
    """The label at which the upper bound first reached the promise, per run (0: never)."""
    return first_crossing(log_capital(x, promise, delta, "below"), delta)


def fixed_level_alarms(x: np.ndarray, promise: float, delta: float) -> np.ndarray:
    """The label at which a fresh one-sided Clopper–Pearson upper bound first fell below the promise (0: never).

    The bound of ``k`` correct in ``n`` is below ``p`` exactly when ``P(Binomial(n, p) ≤ k) < δ``,
    so the rule is a critical count per ``n``: the largest ``k`` with that probability below δ.
    """
    n = np.arange(1, x.shape[-1] + 1)
    critical = binom.ppf(delta, n, promise).astype(int) - 1  # the smallest k with P(≤ k) ≥ δ, less one
    critical += binom.cdf(critical + 1, n, promise) < delta  # ppf's rounding, corrected either way
    critical -= (critical >= 0) & (binom.cdf(critical, n, promise) >= delta)
    alarm = (np.cumsum(x, axis=-1) <= critical) & (n >= FIXED_LEVEL_FIRST_LOOK)
    return np.where(alarm.any(axis=-1), alarm.argmax(axis=-1) + 1, 0)


RULES: dict[str, Rule] = {"betting": betting_alarms, "fixed-level": fixed_level_alarms}


def simulate(accuracy: float, promise: float, *, runs: int, labels: int, delta: float, seed: int) -> dict[str, Any]:
    """Every rule's first alarm (0: never) on the same ``runs`` seeded streams of ``labels`` labels."""
    out: dict[str, list[np.ndarray]] = {name: [] for name in RULES}
    for chunk, start in enumerate(range(0, runs, CHUNK_RUNS)):
        rng = np.random.default_rng([seed, chunk])
        x = (rng.random((min(CHUNK_RUNS, runs - start), labels)) < accuracy).astype(float)
        for name, rule in RULES.items():
            out[name].append(rule(x, promise, delta))
    return {name: np.concatenate(parts) for name, parts in out.items()}


def false_alarms(first: np.ndarray) -> dict[str, Any]:
    fired = int((first > 0).sum())
    return {
        "runs": len(first),
        "fired": fired,
        "rate": fired / len(first),
        "ci95": clopper_pearson(fired, len(first)),
    }


def delay(first: np.ndarray) -> dict[str, Any]:
    """Quartiles of labels to alarm; a run that never fired counts as later than every label (None if beyond)."""
    waited = np.where(first > 0, first, np.inf)
    quartiles = np.quantile(waited, [0.25, 0.5, 0.75], method="inverted_cdf")
    q1, median, q3 = (None if np.isinf(q) else int(q) for q in quartiles)
    return {"runs": len(first), "never": int((first == 0).sum()), "q1": q1, "median": median, "q3": q3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--labels", type=int, default=5000, help="labels per run, a look after each")
    p.add_argument("--promise", type=float, default=0.8, help="the promised accuracy of answered questions")
    p.add_argument("--delta", type=float, default=0.05, help="the alarm's level")
    p.add_argument("--drop", type=float, default=0.1, help="how far below the promise the drifted accuracy is")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "drift.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from candor.util.cpu import describe

    args = parse_args(argv)
    sizes = {"runs": args.runs, "labels": args.labels, "delta": args.delta}
    t0 = time.perf_counter()
    null = simulate(args.promise, args.promise, seed=args.seed, **sizes)
    null_s = time.perf_counter() - t0
    drifted = simulate(args.promise - args.drop, args.promise, seed=args.seed + 1, **sizes)
    payload = {
        "command": " ".join(["python -m benchmarks.drift", *(sys.argv[1:] if argv is None else argv)]),
        "promise": args.promise,
        "delta": args.delta,
        "drifted_accuracy": round(args.promise - args.drop, 6),
        "runs": args.runs,
        "labels": args.labels,
        "seed": args.seed,
        "looks": "after every label",
        "rules": {name: {"false_alarms": false_alarms(null[name]), "delay": delay(drifted[name])} for name in RULES},
        "fixed_level_first_look": FIXED_LEVEL_FIRST_LOOK,
        "seconds": {"both_scenarios": round(time.perf_counter() - t0, 1), "at_the_promise": round(null_s, 1)},
        "machine": describe(),
    }
    write_json(args.out, payload)
    for name, rule in payload["rules"].items():
        f, d = rule["false_alarms"], rule["delay"]
        print(
            f"{name:>12}: false alarms {f['fired']}/{f['runs']} = {f['rate']:.4f} "
            f"[{f['ci95'][0]:.4f}, {f['ci95'][1]:.4f}]; labels to alarm at {payload['drifted_accuracy']}: "
            f"median {d['median']} (quartiles {d['q1']}, {d['q3']}; never {d['never']})"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
