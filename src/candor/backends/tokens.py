"""Token and KV-cache helpers shared by the ``hf`` backend, the verbalized scorer and EliCal.

Every path that feeds token ids to a transformers model must agree on the
same few details, or the same prompt gives different numbers on different
paths:

- encoding: the tokenizer's special tokens, without doubling a BOS that the
  (chat-templated) prompt already starts with;
- padding on either side, with position ids counted over real tokens only,
  so left and right padding give the same logits;
- the keyword under which ``forward`` takes a cache (transformers 5 renamed
  ``past_key_values`` to ``cache``) and a fresh cache for the model;
- when a token prefix shared by all rows is worth a forward pass of its own.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from candor.util.errors import CandorError

# A prefix shared by all rows shorter than this is not worth a separate forward pass.
MIN_SHARED_PREFIX = 8

PAD_SIDES = ("left", "right")


# ---------------------------------------------------------------- encoding


def _drop_doubled_bos(tokenizer: Any, ids: list[int]) -> bool:
    bos = tokenizer.bos_token_id
    return bos is not None and ids[:2] == [bos, bos]


def encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids with the tokenizer's special tokens, without doubling a BOS the text already has."""
    encoded = tokenizer(list(texts), add_special_tokens=True)["input_ids"]
    return [list(ids[1:]) if _drop_doubled_bos(tokenizer, list(ids)) else list(ids) for ids in encoded]


def encode_with_offsets(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """:func:`encode` of one text, with each token's character span ``(start, end)``."""
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [(int(s), int(e)) for s, e in enc["offset_mapping"]]
    if _drop_doubled_bos(tokenizer, ids):
        ids, offsets = ids[1:], offsets[1:]
    return ids, offsets


# ---------------------------------------------------------------- padding and positions


def pad_batch(
    seqs: Sequence[Sequence[int]], pad_id: int, side: str = "left", device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` padded on ``side`` ("left" or "right") to the longest sequence."""
    if side not in PAD_SIDES:
        raise CandorError(f"padding side must be 'left' or 'right', got {side!r}")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        if not seq:
            continue
        cols = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[row, cols] = torch.tensor(list(seq), dtype=torch.long)
        mask[row, cols] = 1
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
    return ids, mask


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip padding: the count of real tokens before each one (0 on padding)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Per row, the index of the last position whose mask is 1 (left or right padding alike)."""
    return mask.shape[-1] - 1 - mask.flip(-1).argmax(-1)


def shared_prefix_length(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix common to all sequences, leaving each at least one token."""
    limit = min(len(s) for s in seqs) - 1
    first = seqs[0]
    length = 0
    while length < limit and all(s[length] == first[length] for s in seqs):
        length += 1
    return length


def usable_prefix_length(model: Any, encoded: Sequence[Sequence[int]], extra_tokens: int = 0) -> int:
    """The shared token prefix worth computing once for ``encoded`` (0 when not worth it or not safe)."""
    if len(encoded) < 2:
        return 0
    length = shared_prefix_length(encoded)
    if length < MIN_SHARED_PREFIX:
        return 0
    window = getattr(model.config, "sliding_window", None)
    if window is not None and max(len(s) for s in encoded) + extra_tokens > window:
        return 0  # sliding-window caches stay on the plain path, as in generation
    return length


# ---------------------------------------------------------------- the model's forward


def base_model(model: Any) -> Any:
    """The plain transformers model inside DDP-style (``.module``) and PEFT wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _forward_parameters(model: Any) -> set[str]:
    try:
        return set(inspect.signature(base_model(model).forward).parameters)
    except (TypeError, ValueError):
        return set()


def cache_keyword(model: Any) -> str:
    """The keyword the model's ``forward`` takes its KV cache under (``cache`` since transformers 5)."""
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


def accepts_logits_to_keep(model: Any) -> bool:
    """Whether the model's ``forward`` takes ``logits_to_keep`` (PEFT's forward passes it through)."""
    return "logits_to_keep" in _forward_parameters(model)


def new_cache(model: Any) -> Any:
    """An empty ``DynamicCache`` for ``model`` (per-layer types where transformers knows them)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=base_model(model).config)
    except TypeError:  # older transformers: no per-layer config
        return DynamicCache()


# ---------------------------------------------------------------- shared-prefix forward passes
# For callers that run a model over many prompts without generating (question-level
# features, prompt scoring); generation in the hf backend uses the same two pieces.


def prefill_shared_prefix(model: Any, prefix_ids: Sequence[int]) -> Any:
    """The KV cache of one run of ``model`` over ``prefix_ids`` (batch of one; only the last logits kept)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prefix_ids)], dtype=torch.long, device=device)
    mask = torch.ones_like(ids)
    cache = new_cache(model)
    kwargs: dict[str, Any] = {cache_keyword(model): cache, "use_cache": True}
    if accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = 1
    model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), **kwargs)
    return cache


def shared_prefix_batches(
    model: Any, encoded: Sequence[Sequence[int]], pad_id: int, batch_size: int
) -> Iterator[tuple[list[int], dict[str, Any]]]:
    """Forward keyword arguments for ``encoded`` in length-sorted batches, the shared prefix run once.

    Yields ``(indices, kwargs)``: the positions in ``encoded`` of the batch's
    rows and the arguments of ``model(**kwargs)``. Rows are left-padded, so
    every row's last token is the last column of the output. When the prompts
    share a long enough token prefix, it is computed once and each batch runs
    only the suffixes over a copy of its cache; position ids count real tokens
    only, so the outputs equal those of a plain left-padded batch.
    """
    if not encoded:
        return
    device = next(model.parameters()).device
    prefix = usable_prefix_length(model, encoded)
    prefix_cache = prefill_shared_prefix(model, encoded[0][:prefix]) if prefix else None
    keyword = cache_keyword(model)
    # Similar lengths in a batch waste less on padding.
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        ids, mask = pad_batch([encoded[i][prefix:] for i in indices], pad_id, device=device)
        kwargs: dict[str, Any] = {"input_ids": ids}
        if prefix_cache is None:
            kwargs.update(attention_mask=mask, position_ids=positions_from_mask(mask), use_cache=False)
        else:
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(len(indices))
            full = torch.cat([mask.new_ones(len(indices), prefix), mask], dim=1)
            positions = positions_from_mask(full)[:, -ids.shape[1] :]
            kwargs.update(attention_mask=full, position_ids=positions, use_cache=True)
            kwargs[keyword] = cache
        yield indices, kwargs
