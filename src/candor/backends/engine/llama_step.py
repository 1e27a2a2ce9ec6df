"""One decode step of a Llama model with fewer, larger products than its transformers forward.

A decode step runs one token per row through every layer. transformers'
forward spends, per layer, seven products (q, k, v, o, gate, up, down) and
a few hundred Python calls (module dispatch, keyword plumbing, the
attention interface) on tensors of a few rows. On CPU each product wakes
the OpenMP team, which on the 2-core machine here costs about as much as a
small product (``OMP_WAIT_POLICY=PASSIVE``; see
:mod:`candor.backends.engine.op_threads`). :class:`LlamaDecodeStep` runs the same
ops in the same order on the model's own weights, with q|k|v and gate|up
each as one packed product (:class:`candor.backends.engine.packed_linear.PackedStack`):
four products per layer, and no module dispatch. In float32 its logits and
KV writes are transformers' bit for bit (``tests/test_llama_step.py``); in
bfloat16 a stacked product may round differently in the last bit. Over a
slot cache that keeps a shared prompt prefix apart
(:mod:`candor.backends.engine.kv_slots`), attention runs in two parts merged by
their log-sum-exps (:mod:`candor.backends.engine.prefix_attention`): the KV writes
stay transformers', the logits differ by float32 rounding.

Only exact Llama classes (``LlamaForCausalLM`` and its layers, plain
``nn.Linear`` products, ``sdpa`` attention) qualify, through
:data:`DECODE_STEPS`; anything else (another architecture, a LoRA wrapper,
``eager`` attention) runs transformers' forward. The caller checks the
first step against transformers' forward and keeps it only if they agree
(:meth:`LlamaDecodeStep.agrees`), so a transformers release that changes the
layer's math turns the lean step off instead of changing numbers.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers.models.llama import modeling_llama as llama

from candor.backends.engine.packed_linear import PackedLinears, PackedStack, bytes_fit
from candor.backends.engine.prefix_attention import attend_with_shared_prefix

logger = logging.getLogger(__name__)

# How far the first lean step's logits may lie from transformers' (relative to their largest): float32
# gives the same bits (rounding only, with a split prefix); a 16-bit stacked product may round one last
# bit differently, which the layers carry.
AGREEMENT = {torch.float32: 1e-5}
AGREEMENT_16BIT = 2e-2


class _Layer:
    """One decoder layer's modules and its two stacked products."""

    def __init__(self, layer: Any, qkv: PackedStack, gate_up: PackedStack) -> None:
        attention = layer.self_attn
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.qkv, self.gate_up = qkv, gate_up
        self.o_proj, self.down_proj, self.act = attention.o_proj, layer.mlp.down_proj, layer.mlp.act_fn
        self.head_dim = attention.head_dim
        self.groups = attention.num_key_value_groups
        self.scaling = attention.scaling
        self.q_width = attention.q_proj.out_features
        self.kv_width = attention.k_proj.out_features
        self.intermediate = layer.mlp.gate_proj.out_features


class LlamaDecodeStep:
    """A decode step of ``model`` (one new token per row) over a cache whose layers ``update`` as transformers'."""

    def __init__(self, model: Any, layers: list[_Layer]) -> None:
        self.model = model
        self.layers = layers
        self.checked = False  # set once a first step agreed with transformers' forward

    @classmethod
    def build(cls, model: Any, scope: PackedLinears) -> LlamaDecodeStep | None:
        """The step for ``model``, or None if it is not a plain Llama, ``scope`` does not pack, or memory is short."""
        if not _plain_llama(model):
            return None
        layers = []
        for layer in model.model.layers[: model.config.num_hidden_layers]:
            attention, mlp = layer.self_attn, layer.mlp
            qkv = scope.stack((attention.q_proj, attention.k_proj, attention.v_proj))
            gate_up = scope.stack((mlp.gate_proj, mlp.up_proj))
            if qkv is None or gate_up is None:
                return None
            layers.append(_Layer(layer, qkv, gate_up))
        extra = sum(layer.qkv.nbytes() + layer.gate_up.nbytes() for layer in layers)
        if not bytes_fit(extra):
            logger.info("lean decode step off: its stacked weight copies (%d MiB) would not fit", extra >> 20)
            return None
        return cls(model, layers)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, cache: Any, positions: torch.Tensor) -> torch.Tensor:
        """Float32 next-token logits ``[B, V]`` of ``ids`` ``[B, 1]``, writing each layer's key and value to ``cache``.

        ``mask``: the additive attention mask ``[B, 1, 1, T]`` over what the
        cache returns; ``positions``: ``[B, 1]``.
        """
        inner = self.model.model
        rows = ids.shape[0]
        hidden = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(hidden, positions)
        for layer, cached in zip(self.layers, cache.layers, strict=False):
            hidden = hidden + self._attention(layer, layer.input_norm.forward(hidden), cached, mask, cos, sin, rows)
            normed = layer.post_norm.forward(hidden)
            both = layer.gate_up(normed)
            gate, up = both[..., : layer.intermediate], both[..., layer.intermediate :]
            hidden = hidden + layer.down_proj.forward(layer.act(gate) * up)
        hidden = inner.norm.forward(hidden)
        return self.model.lm_head.forward(hidden[:, -1:, :])[:, -1, :].float()

    @staticmethod
    def _attention(
        layer: _Layer,
        x: torch.Tensor,
        cached: Any,
        mask: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rows: int,
    ) -> torch.Tensor:
        """Self-attention of one new token per row, as transformers' sdpa path runs it for a single query."""
        d, q_width, kv_width = layer.head_dim, layer.q_width, layer.kv_width
        qkv = layer.qkv(x)
        query = qkv[..., :q_width].view(rows, 1, -1, d).transpose(1, 2)
        key = qkv[..., q_width : q_width + kv_width].view(rows, 1, -1, d).transpose(1, 2)
        value = qkv[..., q_width + kv_width :].view(rows, 1, -1, d).transpose(1, 2)
        query, key = llama.apply_rotary_pos_emb(query, key, cos, sin)
        split = cached.update_split(key, value) if hasattr(cached, "update_split") else None
        if split is None:
            key, value = cached.update(key, value)
        else:
            key, value = split.keys, split.values
        if layer.groups > 1:  # one query per row: its heads packed per key/value head, no repeated keys
            query = query.reshape(rows, query.shape[1] // layer.groups, layer.groups, d)
        if split is not None and split.prefix_keys is not None:  # the slot cache keeps a shared prefix apart
            out = attend_with_shared_prefix(
                query,
                split.prefix_keys,
                split.prefix_values,
                key,
                value,
                mask[..., split.prefix_keys.shape[2] :],
                layer.scaling,
                split.prefix_bias,
            )
        else:
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=mask, dropout_p=0.0, scale=layer.scaling, is_causal=False
            )
        out = out.reshape(rows, -1, 1, d).transpose(1, 2).contiguous()
        return layer.o_proj.forward(out.reshape(rows, 1, -1).contiguous())

    def agrees(self, lean: torch.Tensor, reference: torch.Tensor) -> bool:
        """Whether a step's logits match transformers' for the same inputs (see :data:`AGREEMENT`)."""
        tolerance = AGREEMENT.get(self.model.dtype, AGREEMENT_16BIT)
        scale = 1.0 + float(reference.abs().max())
        gap = float((lean - reference).abs().max())
        if gap > tolerance * scale:
            logger.warning(
                "lean decode step off: its logits differ from transformers' by %.3g (allowed %.3g); "
                "decoding runs transformers' forward",
                gap,
                tolerance * scale,
            )
            return False
        return True


def _plain_llama(model: Any) -> bool:
    """Exact Llama classes throughout, plain linear layers, sdpa attention: what the step reproduces."""
    if type(model) is not llama.LlamaForCausalLM or model.config._attn_implementation != "sdpa":
        return False
    inner = model.model
    if type(inner.rotary_emb) is not llama.LlamaRotaryEmbedding or type(inner.norm) is not llama.LlamaRMSNorm:
        return False
    if type(model.lm_head) is not torch.nn.Linear:
        return False
    for layer in inner.layers:
        attention, mlp = layer.self_attn, layer.mlp
        if (type(layer), type(attention), type(mlp)) != (llama.LlamaDecoderLayer, llama.LlamaAttention, llama.LlamaMLP):
            return False
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if any(type(norm) is not llama.LlamaRMSNorm for norm in norms):
            return False
        products = (attention.o_proj, mlp.down_proj)
        if any(type(m) is not torch.nn.Linear for m in products):
            return False
    return True


# The lean decode step of each model class that has one.
DECODE_STEPS: dict[type, type[LlamaDecodeStep]] = {llama.LlamaForCausalLM: LlamaDecodeStep}


def lean_decode_step(model: Any, scope: PackedLinears) -> LlamaDecodeStep | None:
    """The lean decode step of ``model`` (None: its class has none, or it does not qualify)."""
    step = DECODE_STEPS.get(type(model))
    return step.build(model, scope) if step is not None else None
