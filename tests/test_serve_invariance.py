"""Issue 23's last acceptance gap: under concurrency, every confidence equals that of its question asked alone.

Through the real server (``serve_in_thread``) and the official ``openai`` client: 24 concurrent mixed
requests (plain, streamed, sampled replies with ``n``, a stop string, multi-prompt completions) against
each question asked alone, for n-prob (the greedy answer's log-probs), mc-entropy (the samples'
log-probs) and an EliCal head (the question's prefill). Equal bit for bit: each question's scoring runs
alone in the engine, on log-probs re-read over its own rows (candor.serve.rescoring).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from candor.backends.hf import HFBackend  # noqa: E402
from candor.serve import Decoding, HonestModel  # noqa: E402
from candor.serve.confidence_sources import EstimatorSource, HeadSource  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402

QUESTIONS = [f"Which city hosted event number {i}?" + " Please." * (i % 3) for i in range(8)]


def midway(values) -> float:
    v = sorted(values)
    return (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def mixed_requests(client: openai.OpenAI) -> list:
    """24 requests over the 8 questions, each returning [(question, confidence value)] per choice."""

    def chat(q: str, **extra):
        resp = client.chat.completions.create(model="candor", messages=[{"role": "user", "content": q}], **extra)
        return [(q, c.model_extra["confidence"]["value"]) for c in resp.choices]

    def stream(q: str):
        chunks = list(
            client.chat.completions.create(model="candor", messages=[{"role": "user", "content": q}], stream=True)
        )
        finals = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
        return [(q, f.model_extra["confidence"]["value"]) for f in finals]

    def complete(qs: list[str]):
        resp = client.completions.create(model="candor", prompt=qs, max_tokens=5)
        return [(qs[c.index], c.model_extra["confidence"]["value"]) for c in resp.choices]

    calls = []
    for i, q in enumerate(QUESTIONS):
        calls.append(lambda q=q: chat(q))
        calls.append(lambda q=q: stream(q))
        if i % 2:
            calls.append(lambda q=q, i=i: chat(q, temperature=0.8, n=2, seed=i))
        else:
            calls.append(lambda q=q: chat(q, stop=[" "], max_tokens=5))
    calls[5:5] = [lambda: complete(QUESTIONS[:3]), lambda: complete(QUESTIONS[5:])]
    return calls


def served_confidences(model: HonestModel) -> list[tuple[str, float]]:
    with serve_in_thread(create_app(model, ServeSettings(max_tokens=16))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
        calls = mixed_requests(client)
        assert len(calls) >= 16
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            return [pair for got in pool.map(lambda call: call(), calls) for pair in got]


def assert_each_equals_alone(model: HonestModel) -> None:
    alone = {q: model.answer(q).confidence for q in QUESTIONS}  # one question at a time
    served = served_confidences(model)
    assert {q for q, _ in served} == set(QUESTIONS)
    different = [(q, value, alone[q]) for q, value in served if value != alone[q]]
    assert not different, different


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    return HFBackend(tiny_model, tokenizer, batch_size=16)


@pytest.mark.parametrize("method, samples", [("n-prob", None), ("mc-entropy", 3)])
def test_answer_level_confidences_under_concurrency_equal_the_question_alone(backend, method, samples):
    model = HonestModel(
        backend, EstimatorSource(method, samples=samples), template="fewshot", decoding=Decoding(max_new_tokens=8)
    )
    model.threshold = None
    values = [model.answer(q).confidence for q in QUESTIONS]
    from candor.serve import Threshold

    model.threshold = Threshold(midway(values))  # some questions abstain, some are answered (and replied to)
    assert_each_equals_alone(model)


def test_head_confidences_under_concurrency_equal_the_question_alone(tiny_model_dir, backend, tmp_path):
    from candor.train.common import load_causal_lm
    from candor.train.elical import ConfidenceHead, HeadConfig

    lm, tokenizer = load_causal_lm(tiny_model_dir, device="cpu")
    head = ConfidenceHead.create(lm, tokenizer, HeadConfig(backbone=tiny_model_dir, template="fewshot"), seed=5)
    source = HeadSource(head.save_pretrained(tmp_path / "head"))
    model = HonestModel(
        backend,
        source,
        threshold=midway(source.score_questions(QUESTIONS)),
        template="fewshot",
        decoding=Decoding(max_new_tokens=8),
    )
    assert_each_equals_alone(model)


def test_reading_answers_alone_keeps_their_tokens_and_gives_the_generations_log_probs(backend):
    """The re-read log-probs are the generated ones up to float rounding, and the same bits every time."""
    from candor.backends.base import SamplingParams
    from candor.backends.engine.shared_prefix import SharedPrefix
    from candor.serve.confidence_sources import question_item
    from candor.serve.rescoring import read_alone

    model = HonestModel(backend, "n-prob", template="fewshot")
    prompts = [model.template(question_item(q), backend) for q in QUESTIONS[:3]]
    prefix = SharedPrefix.of(backend, prompts)
    assert prefix is not None and len(prefix.ids) > 50  # the few-shot block
    gens = backend.generate(prompts, 3, SamplingParams(max_new_tokens=8), seeds=[1, 2, 3])
    for prompt, g in zip(prompts, gens, strict=True):
        once, again, whole = (
            read_alone(backend, prompt, g, prefix),
            read_alone(backend, prompt, g, prefix),
            read_alone(backend, prompt, g),
        )
        for made, mine, same, unsplit in zip(
            [g.greedy, *g.samples],
            [once.greedy, *once.samples],
            [again.greedy, *again.samples],
            [whole.greedy, *whole.samples],
            strict=True,
        ):
            assert mine.token_ids == made.token_ids and mine.text == made.text
            assert mine.logprobs == same.logprobs and mine.top_logprobs == same.top_logprobs  # bit for bit
            np.testing.assert_allclose(mine.logprobs, made.logprobs, atol=1e-4)
            np.testing.assert_allclose(mine.logprobs, unsplit.logprobs, atol=1e-4)
            assert [list(t)[:2] for t in mine.top_logprobs] == [list(t)[:2] for t in made.top_logprobs]
