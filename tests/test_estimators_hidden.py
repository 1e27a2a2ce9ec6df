"""Hidden-state estimators on the tiny model: EigenScore and the answer-level probe."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import BlackBox

from candor.annotation.contamination import read_manifest
from candor.annotation.prompts import record_prompts
from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.estimators.eigenscore import eigenscore
from candor.train.probe import AnswerProbe, ProbeConfig, answer_features, train_probe
from candor.util.errors import CandorError


def rec(i: int, samples: list[str], greedy: str = "Paris", correct: int | None = None) -> Record:
    item = QAItem(id=f"q{i}", dataset="toy", split="train", question=f"What is fact {i}?", answers=("Paris",))
    return Record(
        item=item,
        greedy=Completion(greedy),
        samples=[Completion(s) for s in samples],
        greedy_correct=correct,
        provenance={"template": "fewshot"},
    )


def test_eigenscore_by_hand():
    z = np.array([[1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 0.0, 1.0], [2.0, 2.0, 2.0, 5.0]])
    d = z.shape[1]
    j_d = np.eye(d) - np.ones((d, d)) / d
    lam = np.linalg.eigvalsh(z @ j_d @ z.T + 1e-3 * np.eye(3))
    assert eigenscore(z) == pytest.approx(np.mean(np.log(lam)), abs=1e-12)
    # Identical samples: a rank-one covariance, every other eigenvalue is alpha.
    same = np.tile(z[0], (3, 1))
    s = ((z[0] - z[0].mean()) ** 2).sum()
    assert eigenscore(same) == pytest.approx((math.log(3 * s + 1e-3) + 2 * math.log(1e-3)) / 3, abs=1e-9)
    # One sample: its own centred sum of squares.
    assert eigenscore(z[:1]) == pytest.approx(math.log(s + 1e-3), abs=1e-12)


def test_eigenscore_estimator_on_the_tiny_model(tiny_backend):
    recs = [
        rec(0, ["Paris", "Paris", "Paris"]),
        rec(1, ["Paris", "Rome", "a long and different answer"]),
        rec(2, ["Paris"]),
    ]
    est = get_estimator("eigenscore")
    values = est.estimate(recs, tiny_backend)
    prompts, _ = record_prompts(recs, tiny_backend)
    for r, p, v in zip(recs, prompts, values, strict=True):
        states = tiny_backend.hidden_states([p + s.text for s in r.samples], layer=1)  # 2 layers: middle is 1
        assert v == pytest.approx(1 / (1 + math.exp(eigenscore(states))), abs=1e-6)  # batch padding: float32 noise
    assert values[0] > 0.9  # identical samples
    assert values[1] < values[0]


def test_hidden_state_estimators_refuse_black_box_backends(tiny_backend, tmp_path):
    with pytest.raises(CandorError, match="needs hidden states"):
        get_estimator("eigenscore").estimate([rec(0, ["Paris"])], BlackBox(tiny_backend))
    with pytest.raises(CandorError, match="needs a trained probe"):
        get_estimator("probe")
    with pytest.raises(CandorError, match="not a saved answer probe"):
        get_estimator("probe", path=str(tmp_path))


def training_records(n: int) -> list[Record]:
    # Correct answers are "Paris", wrong ones a different word: separable from the answer's hidden state.
    return [rec(i, [], greedy="Paris" if i % 2 == 0 else "Bananas", correct=int(i % 2 == 0)) for i in range(n)]


def test_probe_trains_saves_reloads_and_scores(tiny_backend, tmp_path):
    train = training_records(12) + [rec(99, [], correct=None)]  # an unlabelled record is skipped
    out = tmp_path / "probe"
    probe = train_probe(train, tiny_backend, out, ProbeConfig(feature_cache=str(tmp_path / "cache")))
    assert probe.info.layer == 1 and probe.info.meta["n_train"] == 12
    assert len(read_manifest(out)) == 12
    # The saved probe equals scikit-learn's fitted model on the same features.
    from sklearn.linear_model import LogisticRegression

    feats, _ = answer_features(training_records(12), tiny_backend, 1)
    labels = np.array([i % 2 == 0 for i in range(12)], dtype=int)
    mean, scale = feats.mean(0), np.maximum(feats.std(0), 1e-4)
    ref = LogisticRegression(C=1.0, max_iter=2000).fit((feats - mean) / scale, labels)
    test = [rec(100, [], greedy="Paris"), rec(101, [], greedy="Bananas")]
    tf, _ = answer_features(test, tiny_backend, 1)
    expected = ref.predict_proba((tf - mean) / scale)[:, 1]
    values = get_estimator("probe", path=str(out)).estimate(test, tiny_backend)
    np.testing.assert_allclose(values, expected, atol=1e-6)
    assert values[0] > 0.5 > values[1]
    np.testing.assert_allclose(AnswerProbe.load(out).predict(tf), expected, atol=1e-6)
    # The feature cache was filled and is reused.
    assert any((tmp_path / "cache").rglob("shard-*.npy"))


def test_probe_refuses_one_class_and_another_backbone(tiny_backend, tmp_path):
    with pytest.raises(CandorError, match="both correct and incorrect"):
        train_probe([rec(i, [], correct=1) for i in range(4)], tiny_backend, tmp_path / "p1")
    train_probe(training_records(6), tiny_backend, tmp_path / "p2")
    other = BlackBox(tiny_backend)
    other.white_box = True
    other.model_name = "some-other-model"
    with pytest.raises(CandorError, match="was trained on"):
        get_estimator("probe", path=str(tmp_path / "p2")).estimate([rec(0, [])], other)


def test_candor_train_probe(tiny_model_dir, tmp_path):
    from candor.annotation.records import write_records
    from candor.train.trainers import TrainJob, run_training

    write_records(tmp_path / "train.jsonl", training_records(8))
    job = TrainJob(
        records=tmp_path / "train.jsonl",
        out=tmp_path / "probe",
        model=tiny_model_dir,
        settings={"layer": "2", "C": "0.5", "feature_cache": "none"},
    )
    summary = run_training("probe", job)
    assert summary.config["layer"] == 2 and summary.n_train == 8
    loaded = AnswerProbe.load(tmp_path / "probe")
    assert loaded.info.C == 0.5 and loaded.info.backbone == tiny_model_dir
