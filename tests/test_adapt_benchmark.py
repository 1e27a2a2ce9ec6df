"""benchmarks/adapt.py's verdicts (issue 53, defect 7): a guarantee no run exercised is "not exercised", never held."""

from __future__ import annotations

import pytest

pytest.importorskip("scipy")

from benchmarks.adapt import (  # noqa: E402
    NOT_EXERCISED,
    certified_levels,
    goal,
    guarantee_verdict,
    reverdict,
    summarize,
)

FOLDS = ["nq", "hq"]
ALPHA = 0.7


def run(
    fold: str, seed: int, answered_error: float | None, status: str = "kept", worse: bool = False, top: int = 0
) -> dict:
    """One run's record as one_run writes it: every arm with the same metrics, adapt's promotion mark, and the
    adapted head's scores: ``top`` correct answers ranked above 10 wrong ones, held out and on test alike."""
    arm = {
        "auroc": 0.6,
        "ece": 0.05,
        "answered_error": answered_error,
        "coverage": 0.0 if answered_error is None else 0.1,
    }
    conf, correct = [0.9] * top + [0.1] * 10, [1] * top + [0] * 10
    scores = {"held_out": conf, "held_out_correct": correct, "test": conf, "test_correct": correct}
    return {
        "fold": fold,
        "labels": 100,
        "seed": seed,
        "adapted": arm,
        "unadapted": arm,
        "cal_only": arm,
        "promotion": {"status": status, "worse_on_test": worse},
        "scores": scores,
    }


def payload(errors: dict[str, list[float | None]]) -> dict:
    runs = [run(f, s, e) for f, per_seed in errors.items() for s, e in enumerate(per_seed)]
    out = {"alpha": ALPHA, "sizes": {"folds": FOLDS, "seeds": 2}, **summarize(runs, ALPHA, [100], FOLDS)}
    out["goal_at_100_labels"] = goal(out, FOLDS)
    return out


def test_no_answered_run_is_not_exercised() -> None:
    """Fails on the old code: the goal said the answered error was within α in every run when no run answered."""
    result = payload({"nq": [None, None], "hq": [None, None]})
    cell = result["by_labels"]["100"]["adapted"]
    assert (cell["runs"], cell["answered_runs"], cell["guarantee"]) == (4, 0, NOT_EXERCISED)
    assert result["by_domain"]["nq"]["by_labels"]["100"]["adapted"]["guarantee"] == NOT_EXERCISED
    g = result["goal_at_100_labels"]
    assert g["answered_error_within_alpha_every_run"] is False
    assert g["answered_error_within_alpha"] == NOT_EXERCISED and g["adapted_coverage"] == 0.0


def test_answered_runs_are_counted_in_the_verdict() -> None:
    result = payload({"nq": [0.5, None], "hq": [0.9, 0.2]})
    cell = result["by_labels"]["100"]["adapted"]
    assert cell["guarantee"] == "no (1 of 3 answered runs above α)"
    assert result["by_domain"]["nq"]["by_labels"]["100"]["adapted"]["guarantee"] == "yes (1 of 2 runs answered)"
    assert result["goal_at_100_labels"]["answered_error_within_alpha_every_run"] is False
    assert payload({"nq": [0.5, None], "hq": [0.2, 0.1]})["goal_at_100_labels"]["answered_error_within_alpha_every_run"]


def test_reverdict_recomputes_the_verdicts_from_the_counts() -> None:
    result = payload({"nq": [None, None], "hq": [0.2, None]})
    stale = {**result, "notes": []}
    for arms in [*stale["by_labels"].values(), *(d["by_labels"]["100"] for d in stale["by_domain"].values())]:
        for entry in arms.values():
            entry["guarantee"] = "yes"
    stale["goal_at_100_labels"]["answered_error_within_alpha_every_run"] = True
    again = reverdict(stale)
    assert again["by_labels"]["100"]["adapted"]["guarantee"] == "yes (1 of 4 runs answered)"
    assert again["by_domain"]["nq"]["by_labels"]["100"]["adapted"]["guarantee"] == NOT_EXERCISED
    assert again["goal_at_100_labels"] == result["goal_at_100_labels"]
    assert guarantee_verdict(3, 0, 0) == NOT_EXERCISED


def test_a_worse_head_marked_promotable_is_counted_against_the_goal() -> None:
    """Issue 64: how often a head worse on the test questions was promoted, per domain and over every run."""
    runs = [
        run("nq", 0, None, "promotable", worse=False),
        run("nq", 1, None, "kept", worse=True),
        run("hq", 0, None, "kept", worse=True),
        run("hq", 1, None, "kept", worse=False),
    ]
    out = {"alpha": ALPHA, "sizes": {"folds": FOLDS, "seeds": 2}, **summarize(runs, ALPHA, [100], FOLDS)}
    assert out["promotion"]["all"] == {"runs": 4, "promoted": 1, "kept": 3, "worse_on_test": 2, "worse_promoted": 0}
    assert out["by_domain"]["nq"]["promotion"]["100"]["promoted"] == 1
    assert goal(out, FOLDS)["no_worse_head_promoted"] is True
    runs[1]["promotion"]["status"] = "promotable"
    out = {"alpha": ALPHA, "sizes": {"folds": FOLDS, "seeds": 2}, **summarize(runs, ALPHA, [100], FOLDS)}
    assert out["promotion"]["all"]["worse_promoted"] == 1
    assert goal(out, FOLDS)["worse_promoted_runs"] == 1 and goal(out, FOLDS)["no_worse_head_promoted"] is False


def test_the_certified_level_is_the_smallest_every_seed_reaches() -> None:
    """adapt's three sequences each run at δ/3 = 1/30: 10 correct answers on top, no error, certify α = 0.3
    (0.7^10 ≈ 0.028 ≤ 1/30 < 0.75^10 ≈ 0.056); 6 certify 0.45 (0.55^6 ≈ 0.028 ≤ 1/30 < 0.6^6 ≈ 0.047); the domain's
    level is the larger, at which both runs answer their top ones. Wrong answers only certify nothing, and say why."""
    runs = [run("nq", 0, None, top=10), run("nq", 1, None, top=6), run("hq", 0, None, top=0)]
    levels = certified_levels(runs, FOLDS, 0.1)
    assert levels["nq"]["smallest_alpha_by_seed"] == {"0": 0.3, "1": 0.45} and levels["nq"]["alpha"] == 0.45
    assert levels["nq"]["guarantee"] == "yes (2 of 2 runs answered)" and levels["nq"]["answered_runs"] == 2
    assert levels["nq"]["answered_error"]["mean"] == 0.0
    assert levels["hq"]["alpha"] is None and "guarantee" not in levels["hq"]  # no level of the grid certifies
    assert levels["hq"]["held_out_right_by_seed"] == {"0": 0} and "right 0 times of 10" in levels["hq"]["why"]
    assert "why" not in levels["nq"] and levels["nq"]["held_out_right_by_seed"] == {"0": 10, "1": 6}
    assert (
        levels["nq"]["most_confident_held_out_correct_runs"],
        levels["hq"]["most_confident_held_out_correct_runs"],
    ) == (
        2,
        0,
    )
