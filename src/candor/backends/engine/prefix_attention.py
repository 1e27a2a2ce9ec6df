"""Attention of one new token per row over a key prefix every row shares, then each row's own keys.

When every prompt of a ``generate`` call starts with the same few-shot
block, every row's keys begin with the same prefix. The slot cache
(:mod:`candor.backends.engine.kv_slots`) can keep that prefix once instead of in
every row's slot; attention then runs in two parts and merges them by their
log-sum-exps (exact softmax algebra):

    out = out_own + w * (out_prefix - out_own),   w = sigmoid(lse_prefix - lse_own),

``w`` being the prefix's share of the softmax mass.

The shared part is one attention call in which the queries of all rows meet
the same keys (a matrix product, not a product per row), and each row's own
part reads only its question and answer columns. Rounding differs from one
attention over the concatenated keys by about one float32 ulp of the output
(``tests/test_prefix_attention.py``): decoding over a split prefix is not
bit-equal to transformers' forward (log-probs move by about 1e-5; tokens
stayed the same in ``benchmarks/prefix_split.py``'s runs).

The log-sum-exp comes from ATen's CPU flash-attention kernel (the kernel
``scaled_dot_product_attention`` runs on CPU), which returns it alongside the
output; :func:`available` says whether this torch build has it. Inside a
decode step's one-thread block (:mod:`candor.backends.engine.op_threads`) the two
attention calls run on all threads (on one for few rows) and the small
copies and merge on one.
"""

from __future__ import annotations

import torch

from candor.backends.engine.op_threads import narrow, widen_for_attention

# ATen's CPU flash attention, which returns (output, logsumexp); the public SDPA call drops the latter.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def available(device: torch.device | str) -> bool:
    """Whether split-prefix attention can run on ``device`` (CPU with ATen's flash kernel)."""
    return _FLASH_CPU is not None and torch.device(device).type == "cpu"


def attend_with_shared_prefix(
    query: torch.Tensor,
    prefix_keys: torch.Tensor,
    prefix_values: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    prefix_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention of ``query`` over ``prefix_keys`` followed by each row's ``keys``.

    ``query``: ``[rows, kv_heads, q, head_dim]`` (the ``q`` query heads that
    share each key head, or ``[rows, heads, 1, head_dim]`` without grouped
    queries); ``prefix_keys`` / ``prefix_values``: ``[1, kv_heads, P,
    head_dim]``, seen by every row; ``keys`` / ``values``: ``[rows, kv_heads,
    T, head_dim]``; ``mask``: additive ``[rows, 1, 1, T]`` over ``keys`` only;
    ``prefix_bias``: additive ``[rows]`` over the whole prefix (0: the row
    sees it; the dtype's lowest value: it does not). Returns ``[rows,
    kv_heads, q, head_dim]`` in ``query``'s dtype.
    """
    assert _FLASH_CPU is not None, "split-prefix attention needs ATen's CPU flash kernel (see available())"
    rows, heads, per_head, dim = query.shape
    narrow()  # inside a decode step's one-thread block, the copies and the merge are small ops
    # Every row's queries of one key head against the shared keys: one call, rows * q queries per head.
    shared = query.transpose(0, 1).reshape(1, heads, rows * per_head, dim)
    widen_for_attention(rows)
    out_prefix, lse_prefix = _FLASH_CPU(shared, prefix_keys, prefix_values, 0.0, False, attn_mask=None, scale=scale)
    out_own, lse_own = _FLASH_CPU(query, keys, values, 0.0, False, attn_mask=mask, scale=scale)
    narrow()
    out_prefix = out_prefix.reshape(heads, rows, per_head, dim).transpose(0, 1)
    lse_prefix = lse_prefix.reshape(heads, rows, per_head).transpose(0, 1)
    # The prefix's share of the softmax mass, exp(lse_prefix) / (exp(lse_prefix) + exp(lse_own)), is a
    # sigmoid of the difference: one stable op, and one lerp merges the two outputs.
    gap = lse_prefix - lse_own
    if prefix_bias is not None:  # a blocked row's prefix weighs exactly 0 (sigmoid of a huge negative)
        gap = gap + prefix_bias.float().view(rows, 1, 1)
    weight = torch.sigmoid(gap).unsqueeze(-1)
    return torch.lerp(out_own.float(), out_prefix.float(), weight).to(query.dtype)
