"""The KV cache of the rows decoded together, with their padding masks and positions.

Rows leave by index selection and join by left-padding the shorter cache to
the longer one (masked, so outputs do not change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


@dataclass
class KVBatch:
    """The cache, padding mask, next positions and next-token logits of the running rows."""

    cache: DynamicCache
    mask: torch.Tensor  # [rows, cache length], 0 on padding
    next_pos: torch.Tensor  # [rows], position id of the next token
    logits: torch.Tensor  # [rows, vocab], for the next pick

    @property
    def mergeable(self) -> bool:
        # Merging edits per-layer keys/values, which only plain (full-attention) layers have.
        return all(type(layer) is DynamicLayer for layer in getattr(self.cache, "layers", [None]))

    def select(self, index: torch.Tensor) -> None:
        """Keep the rows at ``index`` (in that order)."""
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos, self.logits = self.mask[index], self.next_pos[index], self.logits[index]

    def trim(self) -> None:
        """Drop leading columns that are padding in every row (left by rows that finished)."""
        lead = int(self.mask.any(dim=0).int().argmax())
        if lead == 0:
            return
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]
        self.mask = self.mask[:, lead:]

    def merge(self, other: KVBatch) -> None:
        """Append ``other``'s rows, left-padding the shorter cache."""
        self.trim()
        width = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_pad_seq(mine.keys, width), _pad_seq(theirs.keys, width)])
            mine.values = torch.cat([_pad_seq(mine.values, width), _pad_seq(theirs.values, width)])
            theirs.keys = theirs.values = None  # free layer by layer: the peak stays near one copy
        self.mask = torch.cat([_pad_seq(self.mask, width, dim=1), _pad_seq(other.mask, width, dim=1)])
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.logits = torch.cat([self.logits, other.logits])

    def advance(self, backend: Any, tokens: torch.Tensor) -> None:
        """Run one step: feed each row its token, extend the cache, keep the next logits."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)
        self.logits = backend.forward(tokens.unsqueeze(1), self.mask, self.cache, self.next_pos.unsqueeze(1))
        self.next_pos = self.next_pos + 1


def _pad_seq(tensor: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    """Left-pad ``tensor`` with zeros along ``dim`` (the sequence axis) to ``width``."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
