"""The front door: candor.EliCal(...).fit(records).predict(questions), the evaluate helper, and HonestModel."""

from __future__ import annotations

import numpy as np
import pytest
from test_elical_train import make_records

import candor
from candor.estimators.confidences import ConfidenceRow, ConfidenceTable
from candor.train.elical import ConfidenceHead
from candor.util.errors import CandorError


def test_elical_fit_predict_save_and_reload(tiny_model_dir, tmp_path):
    est = candor.EliCal(tiny_model_dir, budget=10, mode="head", max_epochs=2, out_dir=tmp_path / "run")
    with pytest.raises(CandorError, match="call fit"):
        est.predict(["Who wrote Hamlet?"])
    assert est.fit(make_records(30), dev=make_records(8, 100)) is est
    questions = ["What is fact number 3 about dogs?", "Who wrote Hamlet?"]
    conf = est.predict(questions)
    assert conf.shape == (2,) and np.all((conf >= 0) & (conf <= 1))
    # The same numbers as the head saved by training, loaded the usual way.
    saved = ConfidenceHead.from_pretrained(tmp_path / "run")
    np.testing.assert_allclose(conf, saved.predict(questions), atol=1e-6)
    est.save_pretrained(tmp_path / "copy")
    np.testing.assert_allclose(candor.EliCal.from_pretrained(tmp_path / "copy").predict(questions), conf, atol=1e-6)
    assert [s.name for s in est.result_.stages] == ["eli", "cal"]


def test_evaluate_refuses_an_unknown_ood_name():
    rows = [ConfidenceRow(f"q{i}", "nq" if i < 20 else "squad", i % 2, {"m": (i % 7) / 7}) for i in range(40)]
    table = ConfidenceTable(rows)
    result = candor.evaluate(table, ood=["squad"])
    assert "ood" in result.columns and "| m |" in result.markdown().replace("**", "")
    with pytest.raises(CandorError, match="squadd"):
        candor.evaluate(table, ood=["squadd"])


def test_honest_model_is_a_front_door_name():
    import candor.serve

    assert "HonestModel" in candor.__all__ and "HonestModel" in dir(candor)
    assert candor.HonestModel is candor.serve.HonestModel
    assert callable(candor.HonestModel.from_pretrained)  # the one way a saved honest folder loads
