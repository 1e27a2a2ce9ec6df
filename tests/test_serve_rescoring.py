"""Re-reading a question's answers alone (candor.serve.rescoring): for which methods, and in pieces.

The re-read pass makes log-probs independent of the requests decoded beside a question. A text-only
method (``consis-lex``) reads texts, which never move with the batch, so it skips the pass; counted here
as the real model passes run while a question is scored (``CountingBackend``).

A re-read runs about one prefill chunk of tokens per step, and serving runs one step per engine call, so
the requests decoding beside a long prompt keep stepping while it is re-read. The pieces are fixed by the
question alone: the numbers are the same bits every time, equal to the one-pass re-read up to float rounding.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest
from helpers import BlackBox
from serve_counting import CountingBackend

from candor.backends.base import DecodeRequest, SamplingParams
from candor.backends.engine.chunked_prefill import DEFAULT_PREFILL_CHUNK, ChunkedPrefill
from candor.backends.hf import HFBackend
from candor.serve import Decoding, HonestModel, rescoring
from candor.serve.confidence_sources import EstimatorSource
from candor.serve.rescoring import Reread, read_alone
from candor.util.errors import CandorError

QUESTIONS = [f"Which city hosted event number {i}?" + " Please." * (i % 3) for i in range(6)]
WAIT = 120
# About 700 tokens: several chunks, and past one key block of the CPU attention kernel.
LONG_PROMPT = "Question: " + " ".join(f"item {i} of the list is red." for i in range(100)) + "\nAnswer:"
SHORT_PROMPT = "Question: What is the largest planet?\nAnswer:"


@pytest.fixture()
def counting_backend(tiny_model, tokenizer) -> CountingBackend:
    return CountingBackend(tiny_model, tokenizer, batch_size=8)


def served(backend: CountingBackend, method: str, samples: int | None) -> HonestModel:
    return HonestModel(
        backend, EstimatorSource(method, samples=samples), template="fewshot", decoding=Decoding(max_new_tokens=8)
    )


@pytest.mark.parametrize(
    "method, samples, rereads",
    [
        ("consis-lex", 3, False),
        ("n-prob", None, True),
        ("mc-entropy", 3, True),
    ],
)
def test_the_answers_are_re_read_only_for_a_method_that_reads_their_log_probs(
    counting_backend, method, samples, rereads
):
    model = served(counting_backend, method, samples)
    assert model.rereads_answers is rereads
    together = [a[0] for a in model.answer_batch(QUESTIONS)]  # decoded side by side in one engine
    scoring = counting_backend.scoring_forwards
    alone = [model.answer(q) for q in QUESTIONS]
    assert [a.confidence for a in together] == [a.confidence for a in alone]  # bit for bit
    assert [a.answer for a in together] == [a.answer for a in alone]
    # One re-read pass per question for a log-prob method; consis-lex runs no model pass at all to score.
    assert scoring == (len(QUESTIONS) if rereads else 0)
    assert counting_backend.scoring_forwards == (2 * len(QUESTIONS) if rereads else 0)


def test_a_method_that_asks_the_model_but_reads_no_answer_log_probs_is_not_re_read(counting_backend):
    """p-true reads next-token log-probs of its own prompt, computed in the question's scoring call alone."""
    model = served(counting_backend, "p-true", None)
    assert not model.rereads_answers
    together = [a[0].confidence for a in model.answer_batch(QUESTIONS[:3])]
    assert together == [model.answer(q).confidence for q in QUESTIONS[:3]]


def test_serving_a_log_prob_method_on_a_generator_without_log_probs_is_refused_at_startup(counting_backend):
    with pytest.raises(CandorError, match="'n-prob' needs logprobs.*with the answers it generates"):
        HonestModel(BlackBox(counting_backend), "n-prob", template="fewshot")
    with pytest.raises(CandorError, match="'mc-entropy' needs logprobs"):
        HonestModel(BlackBox(counting_backend), EstimatorSource("mc-entropy", samples=2), template="fewshot")
    text_only = HonestModel(BlackBox(counting_backend), EstimatorSource("consis-lex", samples=2), template="fewshot")
    assert not text_only.rereads_answers


# ---------------------------------------------------------------- a re-read in pieces


@pytest.fixture(scope="module")
def backend(lively_model, tokenizer):
    return HFBackend(lively_model, tokenizer, batch_size=4, model_name="lively")


@pytest.fixture(scope="module")
def long_answers(backend):
    """A greedy answer and three samples of the long prompt, some longer than one piece."""
    params = SamplingParams(max_new_tokens=90, temperature=1.0, stop=())
    gens = backend.generate([LONG_PROMPT], 3, params, seeds=[7])[0]
    assert max(len(c.token_ids) for c in (gens.greedy, *gens.samples)) > DEFAULT_PREFILL_CHUNK
    return gens


def completions(g):
    return [g.greedy, *g.samples]


def test_a_reread_in_pieces_is_the_same_bits_every_time_and_the_one_pass_numbers(backend, long_answers, monkeypatch):
    reread = Reread(backend, LONG_PROMPT, long_answers)
    steps = 1
    while not reread.step():
        steps += 1
    prompt_tokens = len(backend.encode([LONG_PROMPT])[0])
    answer_tokens = sum(len(c.token_ids) for c in completions(long_answers))
    assert steps >= (prompt_tokens + answer_tokens) // DEFAULT_PREFILL_CHUNK - 3  # pieces, not one pass
    pieces, again = reread.result(), read_alone(backend, LONG_PROMPT, long_answers)
    monkeypatch.setattr(rescoring, "chunking_runs", lambda *_: False)  # a model the chunked cache cannot run
    one_pass = read_alone(backend, LONG_PROMPT, long_answers)
    for made, mine, same, whole in zip(*map(completions, (long_answers, pieces, again, one_pass)), strict=True):
        assert mine.token_ids == made.token_ids and mine.text == made.text
        assert mine.logprobs == same.logprobs and mine.top_logprobs == same.top_logprobs  # bit for bit
        assert len(mine.logprobs) == len(made.token_ids) == len(mine.top_logprobs)
        np.testing.assert_allclose(mine.logprobs, whole.logprobs, atol=1e-4)
        np.testing.assert_allclose(mine.logprobs, made.logprobs, atol=1e-3)
        assert [list(t)[:1] for t in mine.top_logprobs] == [list(t)[:1] for t in whole.top_logprobs]


def test_a_finished_reread_is_refused_before_its_last_step_and_an_empty_one_is_done_at_once(backend, long_answers):
    reread = Reread(backend, LONG_PROMPT, long_answers)
    reread.step()
    with pytest.raises(RuntimeError, match="steps left"):
        reread.result()
    empty = type(long_answers)(None, [], 3)
    assert Reread(backend, LONG_PROMPT, empty).step()


def test_feeding_past_the_room_kept_after_the_prompt_is_refused(backend):
    ids = backend.encode([SHORT_PROMPT])[0]
    prefill = ChunkedPrefill.start(backend, ids, 64, room=4)
    with pytest.raises(ValueError, match="cannot feed"):
        prefill.extend([1, 2], len(ids))  # the prompt is not prefilled yet
    assert prefill.step()
    assert prefill.extend([1, 2, 3, 4], len(ids)).shape[0] == 4
    with pytest.raises(ValueError, match="cannot feed"):
        prefill.extend([1, 2, 3, 4, 5], len(ids))


def test_a_long_prompts_reread_steps_between_a_short_requests_decode_steps(backend, long_answers):
    """Each engine call runs one piece, and the short request decodes between them."""
    order: list[str] = []
    reread = Reread(backend, LONG_PROMPT, long_answers)

    def piece() -> bool:
        order.append("piece")
        return reread.step()

    params = SamplingParams(max_new_tokens=60, stop=())
    with backend.live_engine(max_rows=8) as engine:
        warm = threading.Event()

        def on_token(sample: int, token: int) -> bool:
            order.append("short token")
            warm.set()
            return True

        short = engine.submit(DecodeRequest(prompt=SHORT_PROMPT, n=0, params=params, on_token=on_token))
        assert warm.wait(WAIT)
        while not engine.call(piece).result(WAIT):
            pass
        short.result(WAIT)
    short_end = len(order) - 1 - order[::-1].index("short token")
    while_short_ran = order[order.index("piece") : short_end]
    assert while_short_ran.count("piece") >= 5, order  # the re-read overlapped the short request's decoding
    pairs = zip(while_short_ran, while_short_ran[1:], strict=False)
    assert all(b == "short token" for a, b in pairs if a == "piece"), order  # a decode step after every piece
    assert reread.result().greedy.logprobs == read_alone(backend, LONG_PROMPT, long_answers).greedy.logprobs


def test_a_long_question_and_short_ones_answered_together_each_get_their_confidence_alone(backend):
    model = HonestModel(
        backend, EstimatorSource("mc-entropy", samples=2), template="fewshot", decoding=Decoding(max_new_tokens=8)
    )
    model.threshold = None
    long_question = " ".join(f"Item {i} of the list is red." for i in range(30)) + " Which item is blue?"
    questions = [long_question, "Which river is longest?", "Who wrote Hamlet?", "What is the capital of Peru?"]
    assert len(backend.encode([model.prepare(long_question, None).prompt])[0]) > 4 * DEFAULT_PREFILL_CHUNK
    alone = [model.answer(q).confidence for q in questions]
    together = [answers[0].confidence for answers in model.answer_batch(questions)]
    assert together == alone


def test_a_reread_over_the_engines_own_chunked_prefill_skips_the_prompt_and_gives_its_numbers(backend):
    kept: list[ChunkedPrefill] = []
    params = SamplingParams(max_new_tokens=40, temperature=1.0, stop=())
    with backend.live_engine(max_rows=8) as engine:
        gens = engine.submit(
            DecodeRequest(prompt=LONG_PROMPT, n=2, params=params, seed=5, on_chunked_prefill=kept.append)
        ).result(WAIT)
        short = engine.submit(
            DecodeRequest(prompt=SHORT_PROMPT, n=0, params=params, on_chunked_prefill=kept.append)
        ).result(WAIT)
    if engine.prefill_chunk is None:
        pytest.skip("chunked prefill does not give the bits of one piece on this machine, so the engine does not chunk")
    assert len(kept) == 1 and kept[0].finished  # the long prompt only: the short one was prefilled in one piece
    assert short.greedy is not None
    handed = Reread(backend, LONG_PROMPT, gens, prefilled=kept[0])
    first = handed.step()
    answer_tokens = sum(len(c.token_ids) for c in completions(gens))
    assert first == (answer_tokens - 3 <= DEFAULT_PREFILL_CHUNK)  # the first step already reads answers
    while not handed.step():
        pass
    again = Reread(backend, LONG_PROMPT, gens, prefilled=kept[0])  # the handed prefill is copied, never written
    while not again.step():
        pass
    computed = read_alone(backend, LONG_PROMPT, gens)
    for made, mine, same, whole in zip(
        *map(completions, (gens, handed.result(), again.result(), computed)), strict=True
    ):
        assert mine.token_ids == made.token_ids
        assert mine.logprobs == same.logprobs  # bit for bit
        np.testing.assert_allclose(mine.logprobs, whole.logprobs, atol=1e-4)
    with pytest.raises(ValueError, match="not this prompt's"):
        Reread(backend, SHORT_PROMPT, short, prefilled=kept[0])
    empty = type(gens)(replace(gens.greedy, text="", token_ids=[], logprobs=[], top_logprobs=[]), [], 10)
    assert Reread(backend, LONG_PROMPT, empty, prefilled=kept[0]).step()  # an empty answer: nothing to read
