"""Top-k log-probs per generated token: from the hf backend, in records, and absent from older records."""

from __future__ import annotations

import math

import torch

from candor.backends.base import DEFAULT_TOP_LOGPROBS, Completion, SamplingParams
from candor.backends.engine import decoded_vocab

PROMPT = "Question: Who wrote Hamlet?\nAnswer:"


def test_greedy_top_logprobs_match_a_direct_forward_pass(tiny_backend, tiny_model, tokenizer) -> None:
    gen = tiny_backend.generate([PROMPT], 2, SamplingParams(max_new_tokens=4), greedy=True, seeds=[3])[0]
    greedy = gen.greedy
    assert len(greedy.top_logprobs) == len(greedy.token_ids) > 0
    ids = tokenizer(PROMPT, add_special_tokens=True)["input_ids"]
    vocab = decoded_vocab(tokenizer)
    for step, token in enumerate(greedy.token_ids):
        with torch.no_grad():
            logits = tiny_model(torch.tensor([ids + greedy.token_ids[:step]])).logits[0, -1].float()
        reference = torch.log_softmax(logits, -1)
        values, top_ids = reference.topk(DEFAULT_TOP_LOGPROBS)
        expected = {}
        for i, v in zip(top_ids.tolist(), values.tolist(), strict=True):
            expected.setdefault(vocab[i], v)
        got = greedy.top_logprobs[step]
        assert set(got) == set(expected)
        assert all(math.isclose(got[t], expected[t], abs_tol=1e-4) for t in expected)
        # The greedy token is the most likely one, with the same log-prob as recorded for it.
        assert math.isclose(max(got.values()), greedy.logprobs[step], abs_tol=1e-5)
        assert vocab[token] in got
    for sample in gen.samples:
        assert len(sample.top_logprobs) == len(sample.token_ids)
        assert all(len(pos) <= DEFAULT_TOP_LOGPROBS and max(pos.values()) <= 0 for pos in sample.top_logprobs)


def test_top_logprobs_can_be_turned_off(tiny_model, tokenizer) -> None:
    from candor.backends.hf import HFBackend

    backend = HFBackend(tiny_model, tokenizer, top_logprobs=0)
    gen = backend.generate([PROMPT], 1, SamplingParams(max_new_tokens=3), greedy=True)[0]
    assert gen.greedy.top_logprobs == [] and gen.samples[0].top_logprobs == []
    assert "top_logprobs" not in gen.greedy.to_dict()


def test_records_keep_top_logprobs_and_older_records_still_load() -> None:
    comp = Completion(
        "Paris",
        token_ids=[1, 2],
        tokens=["Par", "is"],
        logprobs=[-0.5, -0.1],
        top_logprobs=[{"Par": -0.5, "Lon": -1.2}, {"is": -0.1}],
    )
    again = Completion.from_dict(comp.to_dict())
    assert again == comp
    old = {"text": "Paris", "token_ids": [1], "tokens": ["Paris"], "logprobs": [-0.3]}
    loaded = Completion.from_dict(old)
    assert loaded.top_logprobs == [] and loaded.to_dict() == old
