"""``ensemble`` (logistic stacking on dev) and ``debias=length`` (length residual, recalibrated on dev).

Each number is checked against a hand computation or scikit-learn fitted here on the same features.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from candor.annotation.records import Record, write_records
from candor.backends.base import Completion
from candor.cli.scoring import parse_estimator_options
from candor.data.items import QAItem
from candor.estimators import ESTIMATORS, get_estimator, score_into
from candor.estimators.confidences import read_confidences
from candor.util.errors import CandorError

ROOT = Path(__file__).resolve().parents[1]


def record(rid: str, n_tokens: int, n_prob: float, correct: int | None = None) -> Record:
    """A record whose greedy answer has ``n_tokens`` tokens, each of probability ``n_prob`` (so n-prob = n_prob)."""
    item = QAItem(id=rid, dataset="toy", split="test", question=f"Question {rid}?", answers=("x",))
    greedy = Completion(text="an answer", token_ids=list(range(n_tokens)), logprobs=[math.log(n_prob)] * n_tokens)
    return Record(item=item, greedy=greedy, samples=[], greedy_correct=correct)


# s = n-prob; least squares of s on n over this dev: b = -0.7 / 5 = -0.14, a = 0.65 + 0.14 * 2.5 = 1.0,
# residuals 0.04, -0.12, 0.12, -0.04.
DEV = [record("d1", 1, 0.9, 1), record("d2", 2, 0.6, 0), record("d3", 3, 0.7, 1), record("d4", 4, 0.4, 0)]
TEST = [record("t1", 2, 0.8), record("t2", 4, 0.3)]  # residuals 0.8 - 0.72 = 0.08 and 0.3 - 0.44 = -0.14
DEV_RESIDUALS = np.array([0.04, -0.12, 0.12, -0.04])
TEST_RESIDUALS = np.array([0.08, -0.14])
BIG_DEV = [record(f"b{i}", 1 + i % 7, 0.2 + 0.07 * (i % 11), int(i % 3 == 0)) for i in range(40)]


def platt_reference(train: np.ndarray, labels: np.ndarray, new: np.ndarray) -> np.ndarray:
    """scikit-learn's L2 logistic regression on columns standardized by the dev mean and sd."""
    mean, sd = train.mean(axis=0), train.std(axis=0)
    model = LogisticRegression(C=1.0).fit((train - mean) / sd, labels)
    return model.predict_proba((new - mean) / sd)[:, 1]


def test_debias_keeps_the_residual_of_the_length_line_fitted_on_dev():
    est = get_estimator("n-prob", debias="length", debias_dev=DEV)
    np.testing.assert_allclose(est.residuals(TEST, None), TEST_RESIDUALS, atol=1e-12)
    assert est.line == pytest.approx((1.0, -0.14))
    assert est.name == "n-prob" and est.describe()["debias"] == {
        "covariate": "length",
        "dev_size": 4,
        "intercept": 1.0,
        "slope": -0.14,
    }


def test_debias_maps_the_residual_to_zero_one_by_the_dev_calibrator():
    values = get_estimator("n-prob", debias="length", debias_dev=DEV).estimate(TEST)
    expected = platt_reference(DEV_RESIDUALS[:, None], np.array([1, 0, 1, 0]), TEST_RESIDUALS[:, None])
    np.testing.assert_allclose(values, expected, atol=1e-6)
    assert values[0] > values[1]  # the larger residual is the surer answer, though t2's raw ordering agrees too


def test_debias_changes_the_ranking_length_explains():
    # Raw n-prob ranks the short answer first; once length is taken out the long one has the larger residual.
    test = [record("short", 1, 0.85), record("long", 4, 0.5)]  # residuals 0.85 - 0.86 = -0.01, 0.5 - 0.44 = 0.06
    raw = get_estimator("n-prob").estimate(test)
    debiased = get_estimator("n-prob", debias="length", debias_dev=DEV).estimate(test)
    assert raw[0] > raw[1] and debiased[0] < debiased[1]


def test_debias_is_refused_without_dev_or_with_an_unknown_covariate():
    with pytest.raises(CandorError, match="debias_dev=FILE"):
        get_estimator("n-prob", debias="length")
    with pytest.raises(CandorError, match="without n-prob.debias=length"):
        get_estimator("n-prob", debias_dev=DEV)
    with pytest.raises(CandorError, match="unknown debias covariate 'width'"):
        get_estimator("n-prob", debias="width", debias_dev=DEV)


def test_ensemble_is_the_logistic_stack_of_its_members_on_dev():
    est = get_estimator("ensemble", members="n-prob,length", dev=BIG_DEV)
    values = est.estimate(TEST)

    def features(records):
        return np.array([[math.exp(r.greedy.logprobs[0]), 1 / (1 + len(r.greedy.token_ids))] for r in records])

    y = np.array([r.greedy_correct for r in BIG_DEV])
    np.testing.assert_allclose(values, platt_reference(features(BIG_DEV), y, features(TEST)), atol=1e-6)
    weights = est.describe()["weights"]
    assert set(weights) == {"n-prob", "length", "intercept"}
    x = features(BIG_DEV)
    model = LogisticRegression(C=1.0).fit((x - x.mean(axis=0)) / x.std(axis=0), y)
    assert weights["n-prob"] == pytest.approx(model.coef_[0][0], abs=1e-4)
    assert weights["intercept"] == pytest.approx(model.intercept_[0], abs=1e-4)


def test_ensemble_passes_each_member_its_options():
    est = get_estimator("ensemble", members="n-prob,length", dev=BIG_DEV, **{"length.dev": DEV})
    length = dict(est.members)["length"]
    assert length.describe()["fit"] == "dev"
    debiased = get_estimator(
        "ensemble", members="n-prob,length", dev=BIG_DEV, **{"n-prob.debias": "length", "n-prob.debias_dev": DEV}
    )
    assert "debias" in dict(debiased.members)["n-prob"].describe()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"members": "n-prob,length"}, "ensemble.dev=FILE"),
        ({"dev": DEV}, "ensemble.members=a,b,c"),
        ({"members": "n-prob", "dev": DEV}, "two or more different"),
        ({"members": "n-prob,ensemble", "dev": DEV}, "cannot contain an ensemble"),
        ({"members": "n-prob,length", "dev": DEV, "prob.x": 1}, "unknown option 'prob.x'"),
        ({"members": "n-prob,nope", "dev": DEV}, "unknown estimator 'nope'"),
    ],
)
def test_ensemble_refuses_what_it_cannot_fit(kwargs, message):
    with pytest.raises(CandorError, match=message):
        get_estimator("ensemble", **kwargs)


def test_cli_options_reach_a_member_through_the_first_dot():
    options = parse_estimator_options(
        ["ensemble.members=n-prob,length", "ensemble.length.dev=d.jsonl", "n-prob.debias=length"],
        ["ensemble", "n-prob"],
    )
    assert options == {
        "ensemble": {"members": "n-prob,length", "length.dev": "d.jsonl"},
        "n-prob": {"debias": "length"},
    }


def test_cache_key_follows_members_their_options_and_the_dev_content(tmp_path, caplog):
    dev = tmp_path / "dev.jsonl"
    write_records(dev, BIG_DEV)
    out = tmp_path / "conf.jsonl"
    opts = {"ensemble": {"members": "n-prob,length", "dev": str(dev)}}
    first = score_into(TEST, ["ensemble"], out, options=opts, progress=False)
    caplog.set_level("INFO", logger="candor.estimators.confidences")
    score_into(TEST, ["ensemble"], out, options=opts, progress=False)
    assert "ensemble: reusing cached confidences" in caplog.text
    for changed in ({**opts["ensemble"], "members": "n-prob,prob"}, {**opts["ensemble"], "length.dev": str(dev)}):
        caplog.clear()
        score_into(TEST, ["ensemble"], out, options={"ensemble": changed}, progress=False)
        assert "ensemble: recomputing (changed: options)" in caplog.text
    write_records(dev, list(reversed(BIG_DEV[:-3])))  # the same path, other content
    caplog.clear()
    score_into(TEST, ["ensemble"], out, options=opts, progress=False)
    assert "ensemble: recomputing (changed: options)" in caplog.text
    stored = read_confidences(out).provenance("ensemble")["estimator"]["weights"]
    assert set(stored) == {"n-prob", "length", "intercept"} and first.rows


def test_registered_and_listed():
    assert "ensemble" in ESTIMATORS.names()


def test_cli_prints_the_weights_and_refuses_an_ensemble_without_dev(tmp_path):
    records, dev = tmp_path / "test.jsonl", tmp_path / "dev.jsonl"
    write_records(records, TEST)
    write_records(dev, BIG_DEV)
    base = [
        sys.executable,
        "-m",
        "candor.cli",
        "score",
        "-r",
        str(records),
        "-o",
        str(tmp_path / "c.jsonl"),
        "-e",
        "ensemble",
        "-O",
        "ensemble.members=n-prob,length",
    ]
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*base, "-O", f"ensemble.dev={dev}"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    weights = json.loads((tmp_path / "c.jsonl.columns.json").read_text())["columns"]["ensemble"]["estimator"]
    assert f"n-prob {weights['weights']['n-prob']:+.4f}" in done.stdout
    refused = subprocess.run(base, capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "ensemble.dev=FILE" in refused.stderr + refused.stdout


# A dev file that shares a question with the records scored (issue 56): the fit would have seen what it scores.
SHARED_DEV = [*BIG_DEV[:10], record("t2", 4, 0.3, 0)]  # t2's question is also in TEST


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "ensemble", "members": "n-prob,length", "dev": SHARED_DEV},
        {"name": "n-prob", "debias": "length", "debias_dev": SHARED_DEV},
    ],
    ids=["ensemble", "debias"],
)
def test_a_dev_set_sharing_a_question_with_the_scored_records_is_refused(kwargs):
    est = get_estimator(**kwargs)
    with pytest.raises(CandorError, match=r"1 of \d+ questions are also in the scored records.*Question t2\?"):
        est.estimate(TEST, None)


def test_cli_refuses_a_dev_file_sharing_questions_naming_both_files_exit_2(tmp_path):
    records, dev = tmp_path / "test.jsonl", tmp_path / "dev.jsonl"
    write_records(records, TEST)
    write_records(dev, SHARED_DEV)
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    common = [sys.executable, "-m", "candor.cli", "score", "-r", str(records), "-o", str(tmp_path / "c.jsonl")]
    for extra in (
        ["-e", "ensemble", "-O", "ensemble.members=n-prob,length", "-O", "ensemble.dev={dev}"],
        ["-e", "n-prob", "-O", "n-prob.debias=length", "-O", "n-prob.debias_dev={dev}"],
    ):
        argv = [*common, *(a.format(dev=dev) for a in extra)]
        refused = subprocess.run(argv, capture_output=True, text=True, env=env)
        assert refused.returncode == 2, refused.stderr
        assert str(dev) in refused.stderr and f"--records {records}" in refused.stderr, refused.stderr
        assert "also in the scored records" in refused.stderr and not (tmp_path / "c.jsonl").exists()
