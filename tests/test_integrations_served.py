"""What the framework adapters share (candor.integrations.served): the typed confidence and a refusal read as text."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402

from candor.integrations.served import ServedConfidence, answer, choice_confidence, refusal_as_text  # noqa: E402

CONFIDENCE = {"value": 0.25, "abstained": True, "method": "n-prob", "threshold": 0.5}


def completion(message: dict) -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "candor",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message, "confidence": CONFIDENCE}],
        }
    )


def test_a_refusal_becomes_the_answers_text_and_the_confidence_stays_on_the_choice():
    refused = completion({"role": "assistant", "content": None, "refusal": "I am not sure."})
    read = refusal_as_text(refused)
    assert read.choices[0].message.content == "I am not sure." and read.choices[0].message.refusal is None
    assert choice_confidence(read.choices[0]) == CONFIDENCE
    assert refused.choices[0].message.refusal == "I am not sure.", "the original is not changed"


def test_a_streamed_refusal_becomes_text_and_an_answer_is_left_alone():
    chunk = ChatCompletionChunk.model_validate(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "candor",
            "choices": [{"index": 0, "delta": {"refusal": "I am not sure."}, "finish_reason": "stop"}],
        }
    )
    assert refusal_as_text(chunk).choices[0].delta.content == "I am not sure."
    answered = completion({"role": "assistant", "content": "Paris"})
    assert refusal_as_text(answered) is answered
    assert (
        refusal_as_text("plain text from a server that is not OpenAI's")
        == "plain text from a server that is not OpenAI's"
    )


def test_the_confidence_is_typed_from_the_object_or_the_headers():
    typed = ServedConfidence.from_object(CONFIDENCE)
    assert typed.value == 0.25 and typed.abstained is True and typed.details["method"] == "n-prob"
    assert ServedConfidence.from_object(None) is None and ServedConfidence.from_object({"method": "x"}) is None
    headers = {"X-Candor-Confidence": "0.734512", "x-candor-abstained": "false", "x-candor-model-version": "v1"}
    from_headers = ServedConfidence.from_headers(headers)
    assert from_headers.value == 0.734512 and from_headers.abstained is False
    assert from_headers.details["model_version"] == "v1"
    assert ServedConfidence.from_headers({"content-type": "application/json"}) is None
    shown = answer("I am not sure.", typed)
    assert shown.text == "I am not sure." and shown.abstained is True and shown.confidence is typed
    assert answer(None, None).text == "" and answer(None, None).abstained is False
