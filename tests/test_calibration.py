"""Calibrators: each reduces held-out ECE on miscalibrated data; hand and reference checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

from candor.evaluation.calibration import CALIBRATORS, get_calibrator, load_calibrator, logit, save_calibrator, sigmoid
from candor.evaluation.metrics import ece
from candor.util.errors import CandorError


def synthetic(true_p, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.01, 0.99, n)
    correct = (rng.uniform(size=n) < true_p(conf)).astype(int)
    return conf, correct


def squared(c: np.ndarray) -> np.ndarray:
    return c**2


def tempered(c: np.ndarray, t: float = 2.5) -> np.ndarray:
    return sigmoid(logit(c) / t)


@pytest.mark.parametrize(
    ("name", "true_p"),
    [
        ("platt", squared),
        ("isotonic", squared),
        ("histogram", squared),
        # A temperature cannot move 0.5, so it is tested on data it can fix.
        ("temperature", tempered),
        ("platt", tempered),
        ("isotonic", tempered),
        ("histogram", tempered),
    ],
)
def test_calibrators_reduce_heldout_ece(name: str, true_p) -> None:
    dev_conf, dev_correct = synthetic(true_p, 3000, seed=0)
    test_conf, test_correct = synthetic(true_p, 3000, seed=1)
    before = ece(test_conf, test_correct)
    cal = get_calibrator(name).fit(dev_conf, dev_correct)
    after = ece(cal.predict(test_conf), test_correct)
    assert before > 0.1
    assert after < 0.5 * before
    assert after < 0.05


@pytest.mark.parametrize("t_true", [0.5, 2.0, 4.0])
def test_temperature_recovers_known_t(t_true: float) -> None:
    conf, correct = synthetic(lambda c: tempered(c, t_true), 20000, seed=2)
    cal = get_calibrator("temperature").fit(conf, correct)
    assert cal.temperature_ == pytest.approx(t_true, rel=0.1)


def test_platt_equals_sklearn_on_logits_and_recovers_parameters() -> None:
    a, b = 0.5, -1.0
    conf, correct = synthetic(lambda c: sigmoid(a * logit(c) + b), 20000, seed=3)
    cal = get_calibrator("platt").fit(conf, correct)
    reference = LogisticRegression(C=1e4).fit(logit(conf)[:, None], correct)
    grid = np.linspace(0.0, 1.0, 101)
    assert cal.predict(grid) == pytest.approx(reference.predict_proba(logit(grid)[:, None])[:, 1], abs=1e-9)
    assert cal.model.coef_[0, 0] == pytest.approx(a, abs=0.05)
    assert cal.model.intercept_[0] == pytest.approx(b, abs=0.08)


def test_isotonic_is_monotone_and_clipped() -> None:
    conf, correct = synthetic(squared, 500, seed=4)
    cal = get_calibrator("isotonic").fit(conf * 0.5 + 0.25, correct)  # fitted on [0.255, 0.745]
    grid = np.linspace(0.0, 1.0, 201)
    out = cal.predict(grid)
    assert np.all(np.diff(out) >= 0)
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert out[0] == out[1] == cal.predict([0.255])[0]  # below the fitted range: clipped to its edge


def test_histogram_hand() -> None:
    conf, correct = [0.05, 0.06, 0.55, 0.56], [0, 1, 1, 1]
    centre = get_calibrator("histogram").fit(conf, correct)
    # bin 0 -> 1/2, bin 5 -> 2/2, empty bin 3 -> its centre 0.35
    assert centre.predict([0.01, 0.52, 0.33]) == pytest.approx([0.5, 1.0, 0.35])
    glob = get_calibrator("histogram", empty="global").fit(conf, correct)
    assert glob.predict([0.01, 0.52, 0.33]) == pytest.approx([0.5, 1.0, 0.75])
    assert get_calibrator("histogram", n_bins=2).fit(conf, correct).predict([1.0, 0.0]) == pytest.approx([1.0, 0.5])
    with pytest.raises(CandorError, match="empty-bin rule"):
        get_calibrator("histogram", empty="zero")


@pytest.mark.parametrize("name", CALIBRATORS.names())
def test_predict_before_fit_and_bad_input(name: str) -> None:
    cal = get_calibrator(name)
    with pytest.raises(CandorError, match="before predict"):
        cal.predict([0.5])
    assert cal.fit([0.1, 0.4, 0.6, 0.9], [0, 0, 1, 1]) is cal
    with pytest.raises(CandorError, match="NaN"):
        cal.predict([0.5, float("nan")])
    with pytest.raises(CandorError, match=r"\[0, 1\]"):
        cal.predict([1.5])
    with pytest.raises(CandorError, match="0/1 labels"):
        cal.fit([0.1, 0.9], [0, 3])
    out = cal.predict([0.0, 0.3, 1.0])
    assert out.shape == (3,) and np.all((out >= 0) & (out <= 1))


@pytest.mark.parametrize("name", ["platt", "temperature"])
def test_single_class_fit_is_an_error(name: str) -> None:
    with pytest.raises(CandorError, match="both correct and wrong"):
        get_calibrator(name).fit([0.2, 0.7], [1, 1])


def test_registry_and_factory_errors() -> None:
    assert CALIBRATORS.names() == ["histogram", "isotonic", "platt", "temperature"]
    with pytest.raises(CandorError, match="unknown calibrator 'beta'"):
        get_calibrator("beta")
    with pytest.raises(CandorError, match="bad options"):
        get_calibrator("isotonic", n_bins=5)


@pytest.mark.parametrize("name", sorted(CALIBRATORS.names()))
def test_saved_calibrator_predicts_the_same(name, tmp_path):
    conf, correct = synthetic(squared, 400, seed=3)
    cal = get_calibrator(name).fit(conf, correct)
    probe = np.linspace(0.0, 1.0, 101)
    path = save_calibrator(tmp_path / f"{name}.json", cal, fitted_on="dev.jsonl")
    loaded = load_calibrator(path)
    np.testing.assert_allclose(loaded.predict(probe), cal.predict(probe), atol=1e-12)
    assert json.loads(path.read_text())["fitted_on"] == "dev.jsonl"


def test_isotonic_and_platt_equal_scikit_learn_after_reload(tmp_path):
    conf, correct = synthetic(squared, 300, seed=5)
    probe = np.linspace(0.001, 0.999, 57)
    iso = load_calibrator(save_calibrator(tmp_path / "i.json", get_calibrator("isotonic").fit(conf, correct)))
    reference = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(conf, correct)
    np.testing.assert_allclose(iso.predict(probe), reference.predict(probe), atol=1e-12)
    platt = load_calibrator(save_calibrator(tmp_path / "p.json", get_calibrator("platt").fit(conf, correct)))
    ref = LogisticRegression(C=1e4).fit(logit(conf)[:, None], correct)
    np.testing.assert_allclose(platt.predict(probe), ref.predict_proba(logit(probe)[:, None])[:, 1], atol=1e-9)


def test_saving_unfitted_or_loading_garbage_is_a_clear_error(tmp_path):
    with pytest.raises(CandorError, match="fit it before saving"):
        save_calibrator(tmp_path / "x.json", get_calibrator("platt"))
    (tmp_path / "bad.json").write_text('{"name": "platt"}')
    with pytest.raises(CandorError, match="bad.json"):
        load_calibrator(tmp_path / "bad.json")
    (tmp_path / "worse.json").write_text("{not json")
    with pytest.raises(CandorError, match="malformed JSON"):
        load_calibrator(tmp_path / "worse.json")


# ---------------------------------------------------------------- cases the mutation run found untested


def test_logit_is_the_log_odds() -> None:
    np.testing.assert_allclose(logit(np.array([0.5, 0.9, 0.2])), [0.0, np.log(9.0), np.log(0.25)], atol=1e-12)


def test_settings_survive_saving_and_out_of_range_states_are_clipped(tmp_path) -> None:
    conf, correct = synthetic(squared, 200, 4)
    cal = get_calibrator("histogram", n_bins=5, empty="global").fit(conf, correct)
    path = save_calibrator(tmp_path / "nested" / "dir" / "hist.json", cal)  # parent folders are made
    again = load_calibrator(path)
    assert (again.n_bins, again.empty) == (5, "global")
    np.testing.assert_array_equal(again.predict(conf), cal.predict(conf))
    assert get_calibrator("platt").fit(conf, correct).to_dict()["settings"] == {"C": 1e4}
    state = {"name": "histogram", "settings": {"n_bins": 2}, "state": {"bin_values": [-0.5, 1.5]}}
    path.write_text(json.dumps(state))
    assert load_calibrator(path).predict([0.1, 0.9]).tolist() == [0.0, 1.0]
    path.write_text(json.dumps({"name": "temperature", "state": {"temperature": 2.0}}))  # no settings: defaults
    assert load_calibrator(path).predict([0.5]).tolist() == [0.5]
    path.write_text(json.dumps({**state, "state": {"bin_values": [0.5] * 3}}))
    with pytest.raises(CandorError, match="3 bin values for 2 bins"):
        load_calibrator(path)
    path.write_text(json.dumps({"name": "histogram"}))
    with pytest.raises(CandorError, match="not a saved calibrator: missing or bad field 'state'"):
        load_calibrator(path)
    with pytest.raises(CandorError, match="nope.json: no such calibrator file"):
        load_calibrator(tmp_path / "nope.json")


def test_one_example_is_a_single_class_error() -> None:
    with pytest.raises(CandorError, match="all 1 are 1"):
        get_calibrator("platt").fit([0.7], [1])


def test_temperature_bounds() -> None:
    # Confidence that says nothing about correctness: the best temperature is the largest allowed.
    cal = get_calibrator("temperature").fit([0.9, 0.1, 0.9, 0.1], [0, 1, 1, 0])
    assert cal.temperature_ == pytest.approx(100.0, rel=1e-4)
    for t_min, t_max in ((0.0, 10.0), (5.0, 5.0)):
        with pytest.raises(CandorError, match="0 < t_min < t_max, got"):
            get_calibrator("temperature", t_min=t_min, t_max=t_max)


def test_histogram_settings_and_single_example_bins() -> None:
    one = get_calibrator("histogram", n_bins=1).fit([0.2, 0.4, 0.9], [1, 0, 1])
    np.testing.assert_allclose(one.predict([0.0, 1.0]), [2 / 3, 2 / 3])
    single = get_calibrator("histogram", n_bins=2).fit([0.1, 0.9, 0.8], [0, 1, 0])  # one example in [0, 0.5)
    np.testing.assert_allclose(single.predict([0.2, 0.7]), [0.0, 0.5])
    lone = get_calibrator("histogram", n_bins=2).fit([0.1, 0.9, 0.8], [1, 1, 0])
    assert lone.predict([0.2]).tolist() == [1.0]
    with pytest.raises(CandorError, match="needs n_bins ≥ 1, got 0"):
        get_calibrator("histogram", n_bins=0)
    with pytest.raises(CandorError, match="known: centre, global"):
        get_calibrator("histogram", empty="middle")
