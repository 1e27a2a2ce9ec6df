"""Token-distribution estimators: entropy, margin, perplexity (teacher-forced on the tiny model, and top-k)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from candor.annotation.prompts import record_prompts
from candor.annotation.records import Record
from candor.backends.base import Completion, SamplingParams
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.util.errors import CandorError


def topk_record(tops: list[dict[str, float]], logprobs: list[float] | None = None) -> Record:
    item = QAItem(id="q1", dataset="toy", split="test", question="Capital of France?", answers=("Paris",))
    greedy = Completion(text="Paris", logprobs=logprobs or [max(t.values()) for t in tops])
    greedy.top_logprobs = tops  # what the backend issue adds to completions
    return Record(item=item, greedy=greedy, samples=[])


def test_topk_entropy_margin_by_hand():
    # Two tokens: probabilities (0.5, 0.25) then (0.9, 0.05).
    tops = [{"a": math.log(0.5), "b": math.log(0.25)}, {"c": math.log(0.9), "d": math.log(0.05)}]
    rec = topk_record(tops)
    h1 = -(0.5 * math.log(0.5) + 0.25 * math.log(0.25))
    h2 = -(0.9 * math.log(0.9) + 0.05 * math.log(0.05))
    mean = get_estimator("token-entropy-mean", source="topk").estimate([rec])[0]
    high = get_estimator("token-entropy-max", source="topk").estimate([rec])[0]
    margin = get_estimator("prob-margin", source="topk").estimate([rec])[0]
    assert mean == pytest.approx(math.exp(-(h1 + h2) / 2), abs=1e-12)
    assert high == pytest.approx(math.exp(-max(h1, h2)), abs=1e-12)
    assert margin == pytest.approx(((0.5 - 0.25) + (0.9 - 0.05)) / 2, abs=1e-12)


def test_topk_single_token_certain_answer_is_fully_confident():
    rec = topk_record([{"a": 0.0}])
    assert get_estimator("token-entropy-mean", source="topk").estimate([rec])[0] == pytest.approx(1.0)
    assert get_estimator("prob-margin", source="topk").estimate([rec])[0] == pytest.approx(1.0)


def test_topk_missing_is_a_clear_error():
    rec = topk_record([{"a": -0.1}])
    rec.greedy.top_logprobs = None
    with pytest.raises(CandorError, match="top-k"):
        get_estimator("token-entropy-mean", source="topk").estimate([rec])
    with pytest.raises(CandorError, match="source"):
        get_estimator("prob-margin", source="nope")


def test_perplexity_is_inverse_perplexity():
    rec = topk_record([{"a": -0.5}, {"b": -1.5}], logprobs=[-0.5, -1.5])
    ppl = math.exp(1.0)
    assert get_estimator("perplexity").estimate([rec])[0] == pytest.approx(1 / ppl, abs=1e-12)
    assert get_estimator("perplexity").estimate([rec])[0] == pytest.approx(get_estimator("n-prob").estimate([rec])[0])


@pytest.fixture()
def generated(tiny_backend):
    items = [
        QAItem(id=f"q{i}", dataset="toy", split="test", question=q, answers=("x",))
        for i, q in enumerate(["Capital of France?", "Who wrote it?"])
    ]
    recs = [Record(item=it, greedy=Completion(""), samples=[], provenance={"template": "fewshot"}) for it in items]
    prompts, _ = record_prompts(recs, tiny_backend)
    gens = tiny_backend.generate(prompts, 0, SamplingParams(max_new_tokens=6), greedy=True)
    for rec, gen in zip(recs, gens, strict=True):
        rec.greedy = gen.greedy
    return recs, prompts


def test_teacher_forced_stats_match_a_manual_forward(tiny_backend, tiny_model, generated):
    recs, prompts = generated
    stats = tiny_backend.token_distribution_stats(prompts, [r.greedy.token_ids for r in recs])
    for rec, prompt, st in zip(recs, prompts, stats, strict=True):
        ids = tiny_backend.tokenizer(prompt)["input_ids"]
        full = torch.tensor([ids + rec.greedy.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(tiny_model(full).logits[0].float(), -1)
        n = len(rec.greedy.token_ids)
        pred = logp[len(ids) - 1 : len(ids) - 1 + n]
        entropy = -(pred.exp() * pred).sum(-1).numpy()
        top = pred.topk(2, -1).values.numpy()
        assert st.shape == (n, 3)
        np.testing.assert_allclose(st[:, 0], entropy, atol=1e-4)
        np.testing.assert_allclose(st[:, 1:], top, atol=1e-4)
        # Greedy decoding picked the top-1 token, so its stored log-prob is the top-1 column.
        np.testing.assert_allclose(st[:, 1], rec.greedy.logprobs, atol=1e-4)


def test_model_source_estimators_agree_with_the_stats(tiny_backend, generated):
    recs, prompts = generated
    stats = tiny_backend.token_distribution_stats(prompts, [r.greedy.token_ids for r in recs])
    mean = get_estimator("token-entropy-mean").estimate(recs, tiny_backend)
    high = get_estimator("token-entropy-max").estimate(recs, tiny_backend)
    margin = get_estimator("prob-margin").estimate(recs, tiny_backend)
    for i, st in enumerate(stats):
        assert mean[i] == pytest.approx(math.exp(-st[:, 0].mean()), abs=1e-9)
        assert high[i] == pytest.approx(math.exp(-st[:, 0].max()), abs=1e-9)
        assert margin[i] == pytest.approx(float((np.exp(st[:, 1]) - np.exp(st[:, 2])).mean()), abs=1e-9)
    # A random tiny model over a 49k vocabulary is nearly uniform: entropy near log(V), confidence tiny.
    assert (mean < 0.01).all()


def test_model_source_needs_a_backend_and_token_ids(tiny_backend, generated):
    recs, _ = generated
    with pytest.raises(CandorError, match="needs a model backend"):
        get_estimator("token-entropy-mean").estimate(recs, None)
    recs[0].greedy.token_ids = []
    with pytest.raises(CandorError, match="no token ids"):
        get_estimator("token-entropy-mean").estimate(recs, tiny_backend)
