"""benchmarks/advice_balanced.py (issue 46): the starter split, the ECE ratio and the verdict, without a model."""

from __future__ import annotations

import importlib

import numpy as np
import pytest


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.advice_balanced")


def test_the_starter_split_is_a_deterministic_partition_by_question_hash(bench):
    from candor.data import load_items
    from candor.data.splits import hash_unit

    items = load_items("starter")
    parts = bench.starter_split(items)
    ids = [i.id for side in ("train", "dev", "test") for i in parts[side]]
    assert sorted(ids) == sorted(i.id for i in items)  # every question once
    assert {i.split for i in parts["test"]} == {"test"}
    for item in parts["test"]:
        assert hash_unit(item.question, "advice-balanced") >= bench.CUTS["dev"]
    shares = {side: len(v) / len(items) for side, v in parts.items()}
    assert shares["train"] == pytest.approx(0.60, abs=0.06) and shares["test"] == pytest.approx(0.25, abs=0.06)
    again = bench.starter_split(list(reversed(items)))
    assert {i.id for i in again["test"]} == {i.id for i in parts["test"]}


def test_the_ece_ratio_is_the_seed_mean_ece_over_defaults_with_a_paired_interval(bench):
    from candor.evaluation.metrics import ece

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 120)
    default = {"number": (np.full(120, 0.9), y)}
    seeds = [{"number": (np.clip(y * 0.6 + 0.2 + rng.normal(0, s, 120), 0, 1), y)} for s in (0.05, 0.1)]
    out = bench.ece_ratio(default, seeds, "number", 200)
    expected = np.mean([ece(s["number"][0], y) for s in seeds]) / ece(default["number"][0], y)
    assert out["ratio"] == pytest.approx(expected, abs=1e-4)
    assert out["ci95"][0] <= out["ratio"] <= out["ci95"][1] and out["undefined_resamples"] == 0
    conf = bench.mean_confidence([s["number"][0] for s in seeds], 200)
    assert conf["mean_confidence"] == pytest.approx(np.mean([s["number"][0] for s in seeds]), abs=1e-4)
    assert 0 <= conf["mean_confidence_ci"][0] <= conf["mean_confidence"] <= conf["mean_confidence_ci"][1] <= 1


@pytest.mark.parametrize(
    ("ci", "words"),
    [((0.2, 0.45), "cuts ECE at least 2x"), ((0.6, 0.9), "does not cut"), ((0.3, 1.2), "too small to decide")],
)
def test_the_verdict_follows_the_interval_and_names_a_small_test_set(bench, ci, words):
    payload = {
        "advice": {"ece_ratio_to_default": {"ScoreNumber": {"ratio": sum(ci) / 2, "ci95": list(ci)}}},
        "split": {"test": {"n": 121}},
        "honestybench_mini_reference": {"by_format": {"ScoreNumber": {"ratio": 0.84, "accuracy": 0.11}}},
    }
    text = bench.verdict(payload)
    assert words in text and "the ratio was 0.84" in text
    assert bench.verdict({"split": {"test": {"n": 5}}}) == "not yet measured"
