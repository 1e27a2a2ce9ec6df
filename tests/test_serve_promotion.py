"""Issue 64, defect 12: ``candor adapt`` proposes, a held-out check promotes (``candor.serve.promotion``).

The comparison is paired by question at a stated level; ``POST /admin/reload`` refuses a folder marked
kept (409, the OpenAI error shape) unless the body says ``"force": true`` (tiny real model, real HTTP).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from candor.serve.promotion import (
    KEPT,
    PROMOTABLE,
    NotPromotable,
    check_promotable,
    compare,
    not_compared,
)
from candor.util.errors import CandorError

pytest.importorskip("scipy")


def held_out(n: int = 60, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Labels, a sharp score (ranks them well) and a blurred one (ranks them badly), one record per question."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.35).astype(int)
    sharp = y + rng.normal(0, 0.5, n)
    blurred = y + rng.normal(0, 3.0, n)
    return y, sharp, blurred, [f"question {i}" for i in range(n)]


def test_a_worse_adapted_head_is_kept_and_a_better_one_promotable() -> None:
    y, sharp, blurred, questions = held_out()
    worse = compare(serving=sharp, adapted=blurred, correct=y, questions=questions, level=0.1)
    assert worse.status == KEPT and not worse.promotable
    assert worse.difference < 0 and worse.p_value > 0.1 and worse.lower_bound < 0
    assert worse.questions == worse.labels == 60 and worse.correct == int(y.sum())
    better = compare(serving=blurred, adapted=sharp, correct=y, questions=questions, level=0.1)
    assert better.status == PROMOTABLE and better.p_value <= 0.1 and better.lower_bound > 0
    assert better.difference == pytest.approx(-worse.difference)
    assert "promotable: held-out AUROC" in better.words() and "p = " in better.words()


def test_a_tie_is_kept_and_the_decision_is_seeded() -> None:
    y, sharp, _, questions = held_out()
    tie = compare(sharp, sharp, y, questions, 0.1)
    assert tie.status == KEPT and tie.difference == 0 and tie.p_value == 1.0
    a = compare(sharp[::-1].copy(), sharp, y, questions, 0.1, seed=3)
    assert a == compare(sharp[::-1].copy(), sharp, y, questions, 0.1, seed=3)


def test_the_resampled_unit_is_the_question() -> None:
    """A question served five times is one resampled unit: 12 questions, 60 records."""
    y, sharp, blurred, _ = held_out(12, seed=1)
    by_record = compare(blurred, sharp, y, [f"q{i}" for i in range(12)], 0.1)
    rep = 5
    repeated = [f"q{i}" for i in range(12) for _ in range(rep)]
    many = compare(np.repeat(blurred, rep), np.repeat(sharp, rep), np.repeat(y, rep), repeated, 0.1)
    assert (many.questions, many.labels) == (12, 60)
    # the same AUROCs, and the same uncertainty: repeats add no evidence when they move together
    assert many.difference == pytest.approx(by_record.difference)
    assert many.p_value == pytest.approx(by_record.p_value, abs=0.03)
    split = compare(
        np.repeat(blurred, rep), np.repeat(sharp, rep), np.repeat(y, rep), [f"r{i}" for i in range(60)], 0.1
    )
    assert split.p_value < many.p_value  # treating each record as a question would overstate the evidence


def test_a_comparison_that_cannot_be_made_is_kept_with_its_reason() -> None:
    _, sharp, blurred, questions = held_out()
    one_class = compare(sharp, blurred, np.ones(60, dtype=int), questions, 0.1)
    assert one_class.status == KEPT and one_class.p_value is None and "all correct" in one_class.reason
    unscored = not_compared("the serving confidence could not score them", 0.1, 60, 60, 20)
    assert unscored.status == KEPT and "could not score them" in unscored.words()
    with pytest.raises(CandorError, match="one serving score, adapted score and label per held-out record"):
        compare(sharp[:3], blurred, np.ones(60), questions, 0.1)
    with pytest.raises(CandorError, match="level must be in"):
        compare(sharp, blurred, np.ones(60), questions, 1.0)


def the_mark(status: str) -> dict:
    y, sharp, blurred, questions = held_out()
    serving, adapted = (sharp, blurred) if status == KEPT else (blurred, sharp)
    return {"version": "v2", "promotion": compare(serving, adapted, y, questions, 0.1).to_dict()}


def test_check_promotable_reads_the_folders_mark(tmp_path) -> None:
    check_promotable(tmp_path)  # a folder candor adapt never wrote
    (tmp_path / "adapt.json").write_text(json.dumps(the_mark(PROMOTABLE)))
    check_promotable(tmp_path)
    (tmp_path / "adapt.json").write_text(json.dumps(the_mark(KEPT)))
    with pytest.raises(NotPromotable, match=r"marked kept by candor adapt: .*held-out AUROC .* \"force\": true"):
        check_promotable(tmp_path)
    (tmp_path / "adapt.json").write_text('{"promotion": ')
    with pytest.raises(NotPromotable, match="cannot be read as JSON"):
        check_promotable(tmp_path)
    (tmp_path / "adapt.json").unlink()
    os.mkfifo(tmp_path / "adapt.json")  # never opened: a FIFO would hang the reload
    with pytest.raises(NotPromotable, match="not a regular file inside the folder"):
        check_promotable(tmp_path)


# ---------------------------------------------------------------- the reload route


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(tiny_model, tokenizer, batch_size=8)


def test_a_reload_of_a_kept_folder_is_refused_unless_forced(backend, tmp_path) -> None:
    """Fails on 4132585: the kept folder reloaded with 200, and ``force`` was an unknown field (400)."""
    pytest.importorskip("fastapi")
    from candor.serve import HonestModel
    from candor.serve.http.app import ServeSettings, create_app
    from candor.serve.http.server import serve_in_thread
    from tests.test_serve_app import KEY, post
    from tests.test_serve_feedback import honest_model, save
    from tests.test_serve_reload import ADMIN

    save(honest_model(backend, 0.0), tmp_path / "honest", "v1")
    for name, status in (("kept", KEPT), ("better", PROMOTABLE)):
        save(honest_model(backend, 0.0), tmp_path / name, f"v-{name}")
        (tmp_path / name / "adapt.json").write_text(json.dumps(the_mark(status)))
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, honest_folder=tmp_path / "honest", honest_root=tmp_path)
    app = create_app(HonestModel.from_pretrained(tmp_path / "honest", backend=backend), settings)
    with serve_in_thread(app) as url:
        status, body = post(f"{url}/admin/reload", {"honest": "kept"}, key=ADMIN)
        assert status == 409, body
        error = body["error"]
        assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "honest", "not_promotable")
        assert "marked kept by candor adapt" in error["message"] and '"force": true' in error["message"]
        assert str(tmp_path) not in error["message"]
        assert app.state.service.current.version == "v1"  # the running model stays
        status, body = post(f"{url}/admin/reload", {"honest": "kept", "force": "yes"}, key=ADMIN)
        assert status == 400 and body["error"]["param"] == "force", body
        status, body = post(f"{url}/admin/reload", {"honest": "better"}, key=ADMIN)
        assert status == 200 and body["model_version"] == "v-better" and body["forced"] is False, body
        status, body = post(f"{url}/admin/reload", {"honest": "kept", "force": True}, key=ADMIN)
        assert status == 200 and body["model_version"] == "v-kept" and body["forced"] is True, body
        status, body = post(f"{url}/admin/reload", {"honest": "kept", "forse": True}, key=ADMIN)
        assert status == 400 and "a reload takes only 'honest' and 'force'" in body["error"]["message"]
