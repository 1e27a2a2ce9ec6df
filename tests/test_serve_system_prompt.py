"""Calibrated for framework traffic: a threshold and calibrator tuned after the deployment's system prompt
make a request with exactly that system prompt (and no earlier turn) ``calibrated: true`` (issue 54 part 4).

Tiny real model, a real honest folder saved and loaded, real HTTP.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from candor.serve import Decoding, HonestModel
from candor.serve.answering import Ask, Reply
from candor.serve.shapes import (
    CONVERSATION,
    QUESTION,
    normalize_system_prompt,
    shape_of,
    shapes_of,
    system_prompts_of,
    system_shape,
)
from candor.util.errors import CandorError

SYSTEM = "You are a helpful assistant.\nAnswer the user's question briefly."
OTHER = "You are a pirate. Answer like one."
QUESTIONS = [f"Which river flows through the city number {i}?" + " Please." * (i % 3) for i in range(12)]


# ---------------------------------------------------------------- shapes


def test_a_request_has_the_system_prompt_shape_only_with_one_system_message_and_no_other_turn():
    shape = system_shape(SYSTEM)
    assert shape.startswith("system:") and len(shape) == len("system:") + 12
    assert shape_of(()) == QUESTION
    assert shape_of((("system", SYSTEM),)) == shape
    assert shape_of((("system", OTHER),)) != shape
    assert shape_of((("system", SYSTEM), ("user", "Hi"), ("assistant", "Hello"))) == CONVERSATION
    assert shape_of((("system", SYSTEM), ("system", SYSTEM))) == CONVERSATION
    assert shape_of((("user", "Hi"), ("assistant", "Hello"))) == CONVERSATION


def test_only_trailing_whitespace_is_ignored_when_system_prompts_are_compared():
    shape = system_shape(SYSTEM)
    assert system_shape(SYSTEM + "\n") == shape and system_shape(SYSTEM + " \t\r\n\n") == shape
    assert normalize_system_prompt(SYSTEM + "\n") == SYSTEM
    for changed in (" " + SYSTEM, SYSTEM.lower(), SYSTEM.replace("\n", " "), SYSTEM.replace("\n", "\r\n")):
        assert system_shape(changed) != shape, changed


def test_the_shapes_and_system_prompts_of_tuning_records():
    histories = [(), (("system", SYSTEM + "\n"),), (("system", SYSTEM),)]
    assert shapes_of(histories) == tuple(sorted((QUESTION, system_shape(SYSTEM))))
    assert system_prompts_of(histories) == {system_shape(SYSTEM): SYSTEM}
    assert shapes_of([]) == (QUESTION,)


# ---------------------------------------------------------------- tuned, saved, served


def dev_records(model: HonestModel, history) -> list:
    """The model's own served records of QUESTIONS asked after ``history``, labelled alternately (both classes)."""
    asks = [Ask(model.prepare(q, None, history), Reply()) for q in QUESTIONS]
    records = [outcome[0].record for outcome in model.answer_asks(asks)]
    return [replace(r, greedy_correct=i % 2 == 0) for i, r in enumerate(records)]


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(tiny_model, tokenizer, batch_size=16)


@pytest.fixture(scope="module")
def tuned_folder(backend, tmp_path_factory):
    """An honest folder whose threshold and Platt calibrator were tuned on questions asked after SYSTEM."""
    model = HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(6))
    model.tune(dev_records(model, (("system", SYSTEM + "\n"),)), "coverage", 0.5, calibrator="platt")
    return model.save_pretrained(tmp_path_factory.mktemp("sysprompt") / "honest")


def test_tuning_after_a_system_prompt_records_its_shape_and_text_in_the_folder(tuned_folder, backend):
    shape = system_shape(SYSTEM)
    config = json.loads((tuned_folder / "honest.json").read_text())
    assert config["tuned_on"] == [shape]
    saved = tuned_folder / "system_prompts" / f"{shape.removeprefix('system:')}.txt"
    assert saved.read_bytes().decode("utf-8") == SYSTEM  # as compared: the trailing newline removed
    loaded = HonestModel.from_pretrained(tuned_folder, backend=backend)
    assert loaded.tuned_on == (shape,) and loaded.system_prompts == {shape: SYSTEM}


def test_a_folder_whose_system_prompt_file_was_edited_is_refused(tuned_folder, backend, tmp_path):
    import shutil

    folder = tmp_path / "edited"
    shutil.copytree(tuned_folder, folder)
    (text,) = (folder / "system_prompts").iterdir()
    text.write_text(OTHER, encoding="utf-8")
    with pytest.raises(CandorError, match="edited"):
        HonestModel.from_pretrained(folder, backend=backend)
    text.unlink()
    with pytest.raises(CandorError, match="cannot be read"):
        HonestModel.from_pretrained(folder, backend=backend)


@pytest.fixture(scope="module")
def server(tuned_folder, backend):
    pytest.importorskip("fastapi")
    from candor.serve.http.app import ServeSettings, create_app
    from candor.serve.http.server import serve_in_thread
    from tests.test_serve_app import KEY

    model = HonestModel.from_pretrained(tuned_folder, backend=backend)
    with serve_in_thread(create_app(model, ServeSettings(api_key=KEY))) as url:
        yield url


def ask_chat(url: str, messages: list[dict]) -> dict:
    from tests.test_serve_app import post

    status, body = post(f"{url}/v1/chat/completions", {"model": "candor", "messages": messages, "max_tokens": 6})
    assert status == 200, body
    return body["choices"][0]["confidence"]


def test_a_framework_request_with_the_tuned_system_prompt_is_calibrated(server):
    """The request an agent framework sends: one system message, one user question."""
    sha = system_shape(SYSTEM).removeprefix("system:")
    for role, text in (("system", SYSTEM), ("system", SYSTEM + "\n\n"), ("developer", SYSTEM)):
        conf = ask_chat(server, [{"role": role, "content": text}, {"role": "user", "content": QUESTIONS[0]}])
        assert conf["calibrated"] is True, (role, text)
        assert conf["computed_on"] == {"shape": f"system:{sha}", "earlier_messages": 1}
        assert conf["calibrated_on"] == (
            f"a platt calibrator fitted on {len(QUESTIONS) // 2} labelled questions asked with the "
            f"deployment's system prompt (sha {sha})"
        )


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": OTHER}],  # another system prompt
        [{"role": "system", "content": " " + SYSTEM}],  # not equal: leading whitespace counts
        [  # the tuned system prompt, then earlier turns
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Who wrote Hamlet?"},
            {"role": "assistant", "content": "Shakespeare."},
        ],
        [],  # the question alone: this folder was tuned only after its system prompt
    ],
    ids=["other-system-prompt", "leading-space", "earlier-turns", "alone"],
)
def test_any_other_request_shape_is_not_calibrated(server, messages):
    conf = ask_chat(server, [*messages, {"role": "user", "content": QUESTIONS[0]}])
    assert conf["calibrated"] is False
    assert conf["calibrated_on"] is None  # where it was fitted is named only where it is calibrated (issue 62)


def test_a_folder_tuned_on_questions_alone_is_not_calibrated_after_a_system_prompt(backend):
    from candor.serve.http.responses import confidence_object

    model = HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(6))
    model.tune(dev_records(model, ()), "coverage", 0.5, calibrator="platt")
    assert model.tuned_on == (QUESTION,) and model.system_prompts == {}
    for history, expect in (((), True), ((("system", SYSTEM),), False)):
        ask = Ask(model.prepare(QUESTIONS[1], None, history), Reply())
        assert confidence_object(model.answer_asks([ask])[0][0], ask)["calibrated"] is expect
