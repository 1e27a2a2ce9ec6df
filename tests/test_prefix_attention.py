"""Attention split at a shared key prefix equals one attention over the joined keys."""

from __future__ import annotations

import pytest
import torch

from candor.backends.engine.prefix_attention import attend_with_shared_prefix, available

SCALE = 0.125


def joined_attention(query, prefix_keys, prefix_values, keys, values, mask):
    """The reference: SDPA over the prefix followed by each row's keys, the prefix unmasked."""
    rows = keys.shape[0]
    return torch.nn.functional.scaled_dot_product_attention(
        query,
        torch.cat([prefix_keys.expand(rows, -1, -1, -1), keys], dim=2),
        torch.cat([prefix_values.expand(rows, -1, -1, -1), values], dim=2),
        attn_mask=torch.cat([mask.new_zeros(rows, 1, 1, prefix_keys.shape[2]), mask], dim=-1),
        scale=SCALE,
    )


def case(rows: int, kv_heads: int, per_head: int, prefix: int, own: int, dtype=torch.float32, seed: int = 0):
    """Inputs as the slot cache gives them: each row's keys a window of a larger buffer, some columns masked."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, kv_heads, per_head, 64, generator=g).to(dtype)
    prefix_keys, prefix_values = (torch.randn(1, kv_heads, prefix, 64, generator=g).to(dtype) for _ in range(2))
    buffer_keys, buffer_values = (torch.randn(rows, kv_heads, own + 7, 64, generator=g).to(dtype) for _ in range(2))
    keys, values = buffer_keys[:, :, 3 : 3 + own], buffer_values[:, :, 3 : 3 + own]
    mask = torch.zeros(rows, 1, 1, own, dtype=dtype)
    mask[::2, :, :, : own - 1] = torch.finfo(dtype).min  # every other row sees only its last column
    # Make the prefix matter as much as the row's own keys for some rows, and dominate for others.
    prefix_keys[:, :, :2] *= 3.0
    return query, prefix_keys, prefix_values, keys, values, mask


@pytest.mark.parametrize(
    "shape",
    [(5, 3, 3, 7, 4), (1, 9, 1, 55, 1), (96, 3, 3, 55, 21), (4, 2, 1, 1, 6)],
    ids=["grouped", "one-row", "annotation-batch", "one-prefix-column"],
)
def test_float32_equals_one_attention_over_the_joined_keys(shape):
    inputs = case(*shape)
    got = attend_with_shared_prefix(*inputs, SCALE)
    expected = joined_attention(*inputs)
    assert got.shape == expected.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_bfloat16_stays_within_one_rounding_step():
    inputs = case(8, 3, 3, 20, 9, dtype=torch.bfloat16)
    got = attend_with_shared_prefix(*inputs, SCALE)
    expected = joined_attention(*[x.float() for x in inputs])
    assert got.dtype == torch.bfloat16
    assert float((got.float() - expected).abs().max()) <= 2 * 2**-8 * (1 + float(expected.abs().max()))


def test_the_prefix_weighs_in():
    """Dropping the prefix (a wrong merge) would change the output: the test above can fail."""
    query, prefix_keys, prefix_values, keys, values, mask = case(5, 3, 3, 7, 4)
    got = attend_with_shared_prefix(query, prefix_keys, prefix_values, keys, values, mask, SCALE)
    own_only = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=SCALE)
    assert float((got - own_only).abs().max()) > 0.1


def test_runs_on_cpu_only():
    assert available("cpu")
    assert not available("meta")
