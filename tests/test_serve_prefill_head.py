"""Issue 24 item 2: one prefill for confidence and answer.

Where the generator prefills the very prompt an EliCal head reads (same weights, same template), the head's
linear layer reads the hidden state that prefill computed: a declined question frees its rows there, an
answered one keeps decoding from the same KV cache, and the head loads no backbone of its own. Equal to the
head's own pass (``ConfidenceHead.predict``) within 1e-5; elsewhere the separate pass is kept and said so.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from serve_counting import CountingBackend

from candor.backends.base import LIVE_DECODE
from candor.backends.hf import HFBackend
from candor.serve import Decoding, HonestModel, Threshold
from candor.serve.confidence_sources import HeadSource

QUESTIONS = [f"Who discovered element number {i}?" + " Exactly." * (i % 3) for i in range(8)]


def make_head(tiny_model_dir, folder, *, layer=-1, template="fewshot", mode="head", seed=3):
    from candor.train.common import load_causal_lm
    from candor.train.elical import ConfidenceHead, HeadConfig

    lm, tokenizer = load_causal_lm(tiny_model_dir, device="cpu")
    lora = {"r": 2, "alpha": 4, "targets": ["q_proj", "v_proj"]} if mode == "lora" else None
    config = HeadConfig(backbone=tiny_model_dir, template=template, layer=layer, mode=mode, lora=lora)
    return ConfidenceHead.create(lm, tokenizer, config, seed=seed).save_pretrained(folder)


class SeparateOnly(HFBackend):
    """The real hf backend without a live engine: the head must run its own pass."""

    capabilities = HFBackend.capabilities - {LIVE_DECODE}


@pytest.mark.parametrize("layer", [-1, 1])
def test_the_head_read_from_the_generators_prefill_equals_its_own_pass(tiny_model_dir, tmp_path, layer):
    from candor.train.elical import ConfidenceHead

    folder = make_head(tiny_model_dir, tmp_path / "head", layer=layer)
    own = ConfidenceHead.from_pretrained(folder, device="cpu").predict(QUESTIONS)
    backend = CountingBackend.from_pretrained(tiny_model_dir, device="cpu")
    source = HeadSource(folder)
    model = HonestModel(
        backend,
        source,
        threshold=Threshold(float(np.median(own))),
        template="fewshot",
        decoding=Decoding(max_new_tokens=4),
    )
    assert model.prefill_reader is not None
    answers = [a[0] for a in model.answer_batch(QUESTIONS)]
    np.testing.assert_allclose([a.confidence for a in answers], own, atol=1e-5, rtol=0)
    assert not source.ran_own_pass  # no backbone of its own was loaded or run
    declined = [q for q, a in zip(QUESTIONS, answers, strict=True) if a.abstained]
    assert 0 < len(declined) < len(QUESTIONS)
    assert all(backend.tokens_for(q) == 0 for q in declined)  # prefilled, never decoded
    # The answered ones decode from the prefill's cache: the same text as a generator that never read a head.
    apart_backend = SeparateOnly.from_pretrained(tiny_model_dir, device="cpu")
    separate = HonestModel(
        apart_backend,
        HeadSource(folder),
        threshold=model.threshold,
        template="fewshot",
        decoding=Decoding(max_new_tokens=4),
    )
    assert separate.prefill_reader is None
    for q, fused, apart in zip(QUESTIONS, answers, [a[0] for a in separate.answer_batch(QUESTIONS)], strict=True):
        assert fused.abstained == apart.abstained and fused.answer == apart.answer, q
        assert fused.confidence == pytest.approx(apart.confidence, abs=1e-5)


def test_the_separate_pass_is_kept_and_said_so_where_the_prefill_is_not_the_heads(tiny_model_dir, tmp_path, caplog):
    backend = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    cases = {
        "template": (make_head(tiny_model_dir, tmp_path / "chat", template="chat"), "template"),
        "lora": (make_head(tiny_model_dir, tmp_path / "lora", mode="lora"), "LoRA mode"),
    }
    for folder, reason in cases.values():
        with caplog.at_level(logging.INFO, logger="candor.serve.model"):
            caplog.clear()
            model = HonestModel(backend, HeadSource(folder), template="fewshot", decoding=Decoding(max_new_tokens=3))
        assert model.prefill_reader is None
        assert any(
            "EliCal head" in r.message and reason in r.message and "separate pass" in r.message for r in caplog.records
        ), caplog.text
        answer = model.answer(QUESTIONS[0])  # the separate pass still answers
        assert 0.0 <= answer.confidence <= 1.0 and model.source.ran_own_pass
    other = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    other.model_name = "another-model"
    model = HonestModel(other, HeadSource(make_head(tiny_model_dir, tmp_path / "h")), template="fewshot")
    assert model.prefill_reader is None
