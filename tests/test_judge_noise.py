"""Judge-noise correction (Rogan–Gladen) and the AUROC label-flip spread, against hand computations."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from candor.estimators.confidences import ConfidenceRow, ConfidenceTable
from candor.evaluation.judge_noise import (
    HandLabels,
    JudgeErrors,
    auroc_flip_spread,
    corrected_accuracy,
    judge_errors,
    judge_noise_report,
    read_hand_labels,
    rogan_gladen,
)
from candor.util.errors import CandorError


def sample(tp: int, fp: int, fn: int, tn: int, by_verdict: bool = False) -> HandLabels:
    verdict = [1] * (tp + fp) + [0] * (fn + tn)
    human = [1] * tp + [0] * fp + [1] * fn + [0] * tn
    return HandLabels(np.array(verdict), np.array(human), by_verdict)


def test_sensitivity_specificity_and_rogan_gladen_by_hand():
    errors = judge_errors(sample(tp=8, fp=2, fn=1, tn=9))
    assert (errors.sensitivity, errors.specificity) == pytest.approx((8 / 9, 9 / 11))
    out = corrected_accuracy([1] * 5 + [0] * 5, sample(8, 2, 1, 9), bootstrap=0)
    assert out["observed"] == 0.5
    assert out["corrected"] == pytest.approx((0.5 + 9 / 11 - 1) / (8 / 9 + 9 / 11 - 1))
    assert out["undefined"] is None


def test_a_sample_drawn_by_verdict_is_reweighted_to_the_judged_rate():
    # PPV = 8/10, FOR = 1/10; at a judged-correct rate p = 0.2:
    # Se = 0.2*0.8 / (0.16 + 0.8*0.1) = 2/3, Sp = 0.8*0.9 / (0.72 + 0.2*0.2) = 0.72/0.76,
    # and the corrected accuracy is p*PPV + (1-p)*FOR = 0.24.
    labels = sample(8, 2, 1, 9, by_verdict=True)
    errors = judge_errors(labels, 0.2)
    assert (errors.sensitivity, errors.specificity) == pytest.approx((2 / 3, 0.72 / 0.76))
    out = corrected_accuracy([1] * 2 + [0] * 8, labels, bootstrap=200)
    assert out["corrected"] == pytest.approx(0.24)
    assert out["ci"][0] <= 0.24 <= out["ci"][1]


def test_undefined_when_the_judge_is_no_better_than_a_coin():
    out = corrected_accuracy([1, 0, 1, 0], sample(tp=3, fp=6, fn=3, tn=4), bootstrap=100)  # Se 0.5, Sp 0.4
    assert out["corrected"] is None and out["ci"] == [None, None]
    assert "undefined" in out["undefined"] and "0.900" in out["undefined"]
    assert np.isnan(rogan_gladen(0.5, 0.5, 0.5)) and rogan_gladen(0.95, 0.9, 0.9) == 1.0  # clipped


def test_interval_covers_the_true_accuracy_in_at_least_90_of_100_simulations():
    truth, se, sp = 0.3, 0.85, 0.9

    def judged(true_labels, rng):
        return np.where(true_labels == 1, rng.random(true_labels.size) < se, rng.random(true_labels.size) >= sp).astype(
            int
        )

    covered = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        evaluated = judged((rng.random(800) < truth).astype(int), rng)
        human = (rng.random(200) < truth).astype(int)  # an independent hand-labelled sample
        labels = HandLabels(judged(human, rng), human)
        low, high = corrected_accuracy(evaluated, labels, bootstrap=500, seed=seed)["ci"]
        covered += low <= truth <= high
    assert covered >= 90


def test_auroc_flip_spread_matches_a_loop_over_the_same_flips():
    rng = np.random.default_rng(0)
    y = (rng.random(60) < 0.4).astype(int)
    conf = np.clip(0.3 * y + rng.random(60) * 0.7, 0, 1)
    errors = JudgeErrors(0.8, 0.9)
    out = auroc_flip_spread(conf, y, errors, draws=200, seed=5)
    draws = np.random.default_rng(5)
    keep = np.where(y == 1, 0.8, 0.9)
    values = [roc_auc_score(np.where(draws.random(60) < keep, y, 1 - y), conf) for _ in range(200)]
    assert out["auroc"] == pytest.approx(roc_auc_score(y, conf))
    assert out["mean"] == pytest.approx(np.mean(values)) and out["sd"] == pytest.approx(np.std(values, ddof=1))
    assert [out["low"], out["high"]] == pytest.approx(list(np.quantile(values, [0.025, 0.975])))
    perfect = auroc_flip_spread(conf, y, JudgeErrors(1.0, 1.0), draws=20)
    assert perfect["sd"] == pytest.approx(0.0, abs=1e-12) and perfect["mean"] == pytest.approx(out["auroc"])


def table() -> ConfidenceTable:
    rows = [ConfidenceRow(f"r{i}", "a" if i % 2 else "b", int(i % 3 == 0), {"m": (i % 5) / 5}) for i in range(30)]
    return ConfidenceTable(rows)


def test_hand_labels_take_the_verdict_from_the_confidences_or_the_row(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_text('{"id": "r0", "human": 1}\n\n{"id": "elsewhere", "human": 0, "judge": 1}\n')
    labels = read_hand_labels(path, table())
    assert labels.verdict.tolist() == [1, 1] and labels.human.tolist() == [1, 0] and not labels.by_verdict
    doc = tmp_path / "labels.json"
    doc.write_text(
        json.dumps(
            {"sampled_by_verdict": True, "labels": [{"id": "r0", "human": 1}, {"id": "r1", "human": 0}]}, indent=1
        )
    )
    assert read_hand_labels(doc, table()).by_verdict


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ('{"id": "r0", "human": 1}\n{"id": "r1"}\n', ":2:", '"human" \\(0 or 1\\)'),
        ('{"id": "r0", "human": 1}\nnot json\n', ":2:", "not JSON"),
        ('{"id": "nowhere", "human": 1}\n', ":1:", 'no "judge" verdict'),
    ],
)
def test_bad_hand_labels_name_the_file_and_line(tmp_path, text, where, message):
    path = tmp_path / "labels.jsonl"
    path.write_text(text)
    with pytest.raises(CandorError, match=message) as err:
        read_hand_labels(path, table())
    assert f"{path}{where}" in str(err.value)


def test_report_has_every_dataset_pooled_and_every_method():
    labels = sample(8, 2, 1, 9)
    out = judge_noise_report(table(), labels, bootstrap=50, draws=20)
    assert set(out["accuracy"]) == {"a", "b", "all"} and set(out["auroc_flip"]["m"]) == {"a", "b", "all"}
    assert out["accuracy"]["all"]["observed"] == pytest.approx(10 / 30)
    assert out["hand_labels"]["sensitivity"] == pytest.approx(8 / 9)


def test_a_row_says_when_its_sensitivity_comes_from_hand_labels_of_other_datasets(tmp_path):
    # Labels for rows of dataset "b" only (r1, r3, ... are "a"; r0, r2, ... are "b"), one from no dataset known.
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "human": int(i % 3 == 0)}) + "\n" for i in (0, 2, 4, 6, 8)))
    labels = read_hand_labels(path, table())
    assert labels.counts_by_dataset() == {"b": 5}
    out = judge_noise_report(table(), labels, bootstrap=20, draws=5)
    assert out["accuracy"]["b"]["hand_labels_note"] is None  # its own labels
    note = out["accuracy"]["a"]["hand_labels_note"]
    assert "other datasets" in note and "0 of 5 from a" in note
    assert out["accuracy"]["all"]["hand_labels_note"] is None and out["hand_labels"]["from"] == {"b": 5}
    # a label known only by its own "judge" verdict (no dataset): the row cannot say whose, and says that
    path.write_text('{"id": "elsewhere", "human": 0, "judge": 0}\n{"id": "r0", "human": 1}\n')
    unknown = read_hand_labels(path, table())
    assert (
        "unknown datasets"
        in judge_noise_report(table(), unknown, bootstrap=0, draws=5)["accuracy"]["a"]["hand_labels_note"]
    )


def test_the_tables_show_the_dropped_bootstrap_draws_and_the_hand_labels_note():
    from candor.evaluation.trust import judge_rows

    # A judge barely better than a coin: many resampled judges are not, and their draws are dropped.
    labels = sample(3, 2, 2, 3)
    out = judge_noise_report(table(), labels, bootstrap=200, draws=10)
    dropped = out["accuracy"]["all"]["draws_dropped"]
    assert dropped > 0 and out["accuracy"]["all"]["draws"] == 200
    accuracy, flips = judge_rows({"judge_noise": out})
    header = accuracy[0]
    row = dict(zip(header, next(r for r in accuracy if r[0] == "all"), strict=True))
    assert row["bootstrap draws dropped"] == f"{dropped} of 200" and row["n"] == "30"
    assert "draws left out" in flips[0]
    a_row = dict(zip(header, next(r for r in accuracy if r[0] == "a"), strict=True))
    assert "unknown datasets" in a_row["note"]  # sample() built labels with no datasets
