"""The fallback KV cache of the decode loop: transformers' own cache, rows joined by padding.

For models the in-place slot cache (:mod:`candor.backends.engine.kv_slots`) cannot
run (sliding-window or hybrid cache layers, other attention kernels): rows
that end leave by index selection, and new rows join by left-padding the
shorter cache to the longer one (masked, so outputs do not change), which
only plain layers allow; otherwise new rows wait until the batch is empty.
Every step copies the cache (transformers' ``cat``), so this path is slower.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class KVBatch:
    """The running rows' cache, padding mask, positions and next-token logits, rows in slot order."""

    refill_at = 0.5  # joining copies the whole cache: wait until half the rows have left
    # transformers' own cache layers cannot give attention its threads back, and SDPA's CPU
    # kernel in a one-thread block was 30x slower (op_threads): a step keeps every op on torch's threads.
    widens_attention = False
    partial_admission = False  # a prefill's rows join all at once

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.cache: Any = None
        self.mask = torch.empty(0)  # [rows, cache length], 0 on padding
        self.next_pos = torch.empty(0)  # [rows], position id of the next token
        self.logits = torch.empty(0)  # [rows, vocab], for the next pick
        self.rows = 0
        self._freed: list[int] = []

    @property
    def mergeable(self) -> bool:
        # Merging edits per-layer keys/values, which only plain (full-attention) layers have.
        return self.cache is None or all(type(layer) is DynamicLayer for layer in getattr(self.cache, "layers", [None]))

    @property
    def live(self) -> int:
        return self.rows - len(self._freed)

    def admit(
        self,
        cache: Any,
        mask: torch.Tensor,
        logits: torch.Tensor,
        prompts: list[int],
        repeats: list[int],
        shared: int = 0,
    ) -> list[int]:
        """Repeat prompt ``prompts[i]`` of a prefill ``repeats[i]`` times and append its rows; returns their slots.

        ``shared`` (the prefill's leading columns common to all prompts) needs
        nothing here: this cache keeps every row's columns, those included.
        """
        index = torch.tensor([p for p, r in zip(prompts, repeats, strict=True) for _ in range(r)], device=mask.device)
        cache.batch_select_indices(index)  # drops declined prompts, repeats the others once per row
        mask, logits = mask[index], logits[index]
        first = self.rows
        if self.cache is None or self.rows == 0:
            self.cache, self.mask, self.next_pos, self.logits = cache, mask, mask.sum(-1), logits
        else:
            self._merge(cache, mask, logits)
        self.rows += len(index)
        return list(range(first, self.rows))

    def free(self, slots: list[int]) -> None:
        self._freed += slots

    def clear(self) -> None:
        self.cache, self.rows, self._freed = None, 0, []

    def advance(self, tokens: torch.Tensor) -> list[int] | None:
        """Drop the freed rows, then run one step. Returns the new order of the slots if rows were dropped."""
        order = None
        if self._freed:
            freed = set(self._freed)
            order = [s for s in range(self.rows) if s not in freed]
            index = torch.tensor(order, device=self.mask.device)
            self.cache.batch_select_indices(index)
            self.mask, self.next_pos, tokens = self.mask[index], self.next_pos[index], tokens[index]
            self.rows, self._freed = len(order), []
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)
        self.logits = self.backend.forward(tokens.unsqueeze(1), self.mask, self.cache, self.next_pos.unsqueeze(1))
        self.next_pos = self.next_pos + 1
        return order

    def _trim(self) -> None:
        """Drop leading columns that are padding in every row (left by rows that finished)."""
        lead = int(self.mask.any(dim=0).int().argmax())
        if lead == 0:
            return
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]
        self.mask = self.mask[:, lead:]

    def _merge(self, cache: Any, mask: torch.Tensor, logits: torch.Tensor) -> None:
        """Append another prefill's rows, left-padding the shorter cache."""
        self._trim()
        width = max(self.mask.shape[1], mask.shape[1])
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_pad_seq(mine.keys, width), _pad_seq(theirs.keys, width)])
            mine.values = torch.cat([_pad_seq(mine.values, width), _pad_seq(theirs.values, width)])
            theirs.keys = theirs.values = None  # free layer by layer: the peak stays near one copy
        self.mask = torch.cat([_pad_seq(self.mask, width, dim=1), _pad_seq(mask, width, dim=1)])
        self.next_pos = torch.cat([self.next_pos, mask.sum(-1)])
        self.logits = torch.cat([self.logits, logits])


def _pad_seq(tensor: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    """Left-pad ``tensor`` with zeros along ``dim`` (the sequence axis) to ``width``."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
