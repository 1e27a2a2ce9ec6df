"""The lean Llama decode step: transformers' numbers bit for bit in float32, and only where it qualifies."""

from __future__ import annotations

import logging

import pytest
import torch

from candor.backends.base import SamplingParams
from candor.backends.engine import packed_linear
from candor.backends.engine.llama_step import LlamaDecodeStep, lean_decode_step
from candor.backends.engine.packed_linear import packing_available
from candor.backends.hf import HFBackend

PROMPTS = [
    "Question: What is the largest planet?\nAnswer:",
    "Hello",
    "Question: Who painted the Mona Lisa? Give the full name of the painter, please.\nAnswer:",
    "Once upon a time",
]


def tiny_llama(tokenizer, **config):
    """A 2-layer Llama with random weights scaled up (peaked distributions), of ``config`` overrides."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(LlamaConfig(**{**settings, **config})).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.mul_(20.0)
    return model


def step_both_ways(backend: HFBackend, rows: int = 3, context: int = 9):
    """One decode step over a prefilled cache (left padding on row 0), by the lean step and by transformers.

    Returns (lean logits, transformers' logits, lean KV writes, transformers' KV writes).
    """
    model = backend.model
    with torch.inference_mode(), backend.packed_linears:
        ids = torch.randint(100, 1000, (rows, context), generator=torch.Generator().manual_seed(0))
        pad = torch.ones(rows, context, dtype=torch.long)
        pad[0, :3] = 0
        cache = backend.new_cache()
        positions = (pad.cumsum(1) - 1).clamp(min=0)
        backend.forward(ids, pad, cache, positions)
        mask = torch.zeros(rows, 1, 1, context + 1, dtype=model.dtype)
        mask[0, :, :, :3] = torch.finfo(model.dtype).min
        step = torch.randint(100, 1000, (rows, 1), generator=torch.Generator().manual_seed(1))
        position = positions[:, -1:] + 1
        assert backend.lean_step is not None
        lean = backend.lean_step(step, mask, cache, position)
        lean_kv = [(layer.keys[:, :, -1].clone(), layer.values[:, :, -1].clone()) for layer in cache.layers]
        cache.crop(-1)
        reference = backend.forward(step, mask, cache, position)
        ref_kv = [(layer.keys[:, :, -1].clone(), layer.values[:, :, -1].clone()) for layer in cache.layers]
    return lean, reference, lean_kv, ref_kv


def assert_same_kv(got, expected) -> None:
    for (k1, v1), (k2, v2) in zip(got, expected, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


@pytest.mark.parametrize("config", [{}, {"attention_bias": True, "mlp_bias": True}, {"num_key_value_heads": 4}])
def test_lean_step_gives_transformers_logits_and_kv_bit_for_bit(tokenizer, config):
    backend = HFBackend(tiny_llama(tokenizer, **config), tokenizer)
    lean, reference, lean_kv, ref_kv = step_both_ways(backend)
    assert torch.equal(lean, reference)
    assert_same_kv(lean_kv, ref_kv)


def test_embedded_model_lean_step_is_bit_for_bit():
    backend = HFBackend.from_pretrained("smollm2-135m")
    for rows in (1, 5):
        lean, reference, lean_kv, ref_kv = step_both_ways(backend, rows=rows, context=12)
        assert torch.equal(lean, reference)
        assert_same_kv(lean_kv, ref_kv)


def test_a_dtype_the_cpu_cannot_pack_gets_no_lean_step_and_still_generates(tokenizer, monkeypatch):
    """An AVX2-only CPU has no oneDNN bfloat16 path: transformers' forward decodes, as without packing."""
    can_pack = packed_linear.packing_available

    def no_bfloat16(dtype: torch.dtype = torch.float32) -> bool:
        return dtype != torch.bfloat16 and can_pack(dtype)

    monkeypatch.setattr(packed_linear, "packing_available", no_bfloat16)
    model = tiny_llama(tokenizer).to(torch.bfloat16)
    backend = HFBackend(model, tokenizer)
    assert backend.lean_step is None
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    prompts = ["Question: Who wrote Hamlet?\nAnswer:"]
    got = backend.generate(prompts, 0, params)[0].greedy
    plain = HFBackend(model, tokenizer, pack_linears=False).generate(prompts, 0, params)[0].greedy
    assert got.token_ids == plain.token_ids
    assert got.logprobs == pytest.approx(plain.logprobs, abs=1e-2)  # the same kernels, bf16 rounding apart


@pytest.mark.skipif(
    not packing_available(torch.bfloat16), reason="this CPU has no oneDNN bfloat16 path, so no bfloat16 lean step"
)
def test_bfloat16_lean_step_stays_within_rounding(tokenizer):
    backend = HFBackend(tiny_llama(tokenizer).to(torch.bfloat16), tokenizer)
    lean, reference, _, _ = step_both_ways(backend, rows=4)
    assert lean.dtype == torch.float32
    assert float((lean - reference).abs().max()) <= 2e-2 * (1 + float(reference.abs().max()))


def test_generations_are_the_same_with_and_without_the_lean_step(tokenizer):
    backend = HFBackend(tiny_llama(tokenizer), tokenizer, batch_size=2)
    params = SamplingParams(max_new_tokens=10, stop=("y",))
    step = backend.lean_step
    assert step is not None
    lean = backend.generate(PROMPTS, 2, params)
    assert backend.lean_step is step and step.checked  # the first step agreed; the rest ran lean
    backend.lean_step = None
    plain = backend.generate(PROMPTS, 2, params)
    for a, b in zip(lean, plain, strict=True):
        for x, y in zip([a.greedy, *a.samples], [b.greedy, *b.samples], strict=True):
            assert x.token_ids == y.token_ids and x.logprobs == y.logprobs


SHOTS = "Question: What is the capital of France?\nAnswer: Paris\nQuestion: Who wrote Hamlet?\nAnswer: Shakespeare\n"


@pytest.mark.parametrize("shots", ["", SHOTS], ids=["own-prompts", "shared-prefix-kept-once"])
def test_a_lean_step_that_disagrees_is_turned_off_at_its_first_step(tokenizer, caplog, shots):
    backend = HFBackend(tiny_llama(tokenizer), tokenizer, batch_size=2)
    params = SamplingParams(max_new_tokens=8)
    prompts = [shots + p for p in PROMPTS]  # with shots, the call's rows keep the prefix once (kv_slots)
    expected = HFBackend(backend.model, tokenizer, batch_size=2)
    expected.lean_step = None
    want = expected.generate(prompts, 1, params)
    step = backend.lean_step
    assert step is not None
    step.layers[0].scaling *= 2.0  # a different attention: what a transformers release changing the layer would do
    with caplog.at_level(logging.WARNING, logger="candor.backends.engine.llama_step"):
        got = backend.generate(prompts, 1, params)
    assert backend.lean_step is None and "lean decode step off" in caplog.text
    for a, b in zip(got, want, strict=True):  # the first step kept transformers' numbers, the rest ran them
        for x, y in zip([a.greedy, *a.samples], [b.greedy, *b.samples], strict=True):
            assert x.token_ids == y.token_ids and x.logprobs == y.logprobs


def test_stacked_weights_follow_an_in_place_change(tokenizer):
    backend = HFBackend(tiny_llama(tokenizer), tokenizer)
    lean, reference, _, _ = step_both_ways(backend)
    assert torch.equal(lean, reference)
    with torch.no_grad():  # as PEFT's merge writes: through .data, no version bump
        backend.model.model.layers[1].self_attn.k_proj.weight.data.mul_(1.5)
        backend.model.model.layers[0].mlp.up_proj.weight.data.add_(0.01)
    changed, reference2, _, _ = step_both_ways(backend)
    assert not torch.equal(reference2, reference)
    assert torch.equal(changed, reference2)


def test_only_plain_packed_llamas_get_a_lean_step(tokenizer):
    from peft import LoraConfig, get_peft_model

    assert HFBackend(tiny_llama(tokenizer), tokenizer, pack_linears=False).lean_step is None
    eager = tiny_llama(tokenizer, attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"
    assert HFBackend(eager, tokenizer).lean_step is None
    lora = get_peft_model(tiny_llama(tokenizer), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    inner = lora.base_model.model  # the Llama itself, its q and v now LoRA layers
    assert lean_decode_step(inner, HFBackend(inner, tokenizer).packed_linears) is None
    plain = HFBackend(tiny_llama(tokenizer), tokenizer)
    assert isinstance(plain.lean_step, LlamaDecodeStep)


def test_stacked_biases_follow_an_in_place_change(tokenizer):
    backend = HFBackend(tiny_llama(tokenizer, attention_bias=True, mlp_bias=True), tokenizer)
    step_both_ways(backend)  # packs the stacks
    with torch.no_grad():
        backend.model.model.layers[0].self_attn.v_proj.bias.data.add_(0.5)
        backend.model.model.layers[1].mlp.gate_proj.bias.data.sub_(0.25)
    lean, reference, lean_kv, ref_kv = step_both_ways(backend)
    assert torch.equal(lean, reference)
    assert_same_kv(lean_kv, ref_kv)
