"""Serving re-reads a question's answers alone only for a method that reads their log-probs.

The re-read pass (:mod:`candor.serve.rescoring`) makes log-probs independent of
the requests decoded beside a question. A text-only method (``consis-lex``)
reads texts, which never move with the batch, so it skips the pass; counted here
as the real model passes run while a question is scored (``CountingBackend``).
"""

from __future__ import annotations

import pytest
from helpers import BlackBox
from serve_counting import CountingBackend

from candor.serve import Decoding, HonestModel
from candor.serve.confidence_sources import EstimatorSource
from candor.util.errors import CandorError

QUESTIONS = [f"Which city hosted event number {i}?" + " Please." * (i % 3) for i in range(6)]


@pytest.fixture()
def backend(tiny_model, tokenizer) -> CountingBackend:
    return CountingBackend(tiny_model, tokenizer, batch_size=8)


def served(backend: CountingBackend, method: str, samples: int | None) -> HonestModel:
    return HonestModel(backend, EstimatorSource(method, samples=samples), template="fewshot",
                       decoding=Decoding(max_new_tokens=8))  # fmt: skip


@pytest.mark.parametrize("method, samples, rereads", [
    ("consis-lex", 3, False), ("n-prob", None, True), ("mc-entropy", 3, True),
])  # fmt: skip
def test_the_answers_are_re_read_only_for_a_method_that_reads_their_log_probs(backend, method, samples, rereads):
    model = served(backend, method, samples)
    assert model.rereads_answers is rereads
    together = [a[0] for a in model.answer_batch(QUESTIONS)]  # decoded side by side in one engine
    scoring = backend.scoring_forwards
    alone = [model.answer(q) for q in QUESTIONS]
    assert [a.confidence for a in together] == [a.confidence for a in alone]  # bit for bit
    assert [a.answer for a in together] == [a.answer for a in alone]
    # One re-read pass per question for a log-prob method; consis-lex runs no model pass at all to score.
    assert scoring == (len(QUESTIONS) if rereads else 0)
    assert backend.scoring_forwards == (2 * len(QUESTIONS) if rereads else 0)


def test_a_method_that_asks_the_model_but_reads_no_answer_log_probs_is_not_re_read(backend):
    """p-true reads next-token log-probs of its own prompt, computed in the question's scoring call alone."""
    model = served(backend, "p-true", None)
    assert not model.rereads_answers
    together = [a[0].confidence for a in model.answer_batch(QUESTIONS[:3])]
    assert together == [model.answer(q).confidence for q in QUESTIONS[:3]]


def test_serving_a_log_prob_method_on_a_generator_without_log_probs_is_refused_at_startup(backend):
    with pytest.raises(CandorError, match="'n-prob' needs logprobs.*with the answers it generates"):
        HonestModel(BlackBox(backend), "n-prob", template="fewshot")
    with pytest.raises(CandorError, match="'mc-entropy' needs logprobs"):
        HonestModel(BlackBox(backend), EstimatorSource("mc-entropy", samples=2), template="fewshot")
    text_only = HonestModel(BlackBox(backend), EstimatorSource("consis-lex", samples=2), template="fewshot")
    assert not text_only.rereads_answers
