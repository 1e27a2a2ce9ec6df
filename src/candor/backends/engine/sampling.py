"""Choosing each row's next token: greedy, or temperature / top-k / top-p sampling from a seeded draw.

Sampling is temperature, then top-k, then top-p, then a draw by inverse CDF
from a uniform taken from the row's own generator (seeded from the prompt's
seed and the sample index), so a prompt's samples never depend on which
prompts share its batch. Log-probs are always those of the raw model
distribution (temperature 1, no truncation), as ``Completion`` requires.

A decode step sorts the top :data:`SHARED_TOP` logits of every row once and
takes the greedy choice, the top-k draw and the reported top log-probs from
that one sort (:func:`pick_tokens`): at the embedded model's 96 rows and 49k
vocabulary, about half the time of separate passes
(``benchmarks/decode_step_parts.py`` measures both).

Constrained rows (:mod:`candor.backends.constraints`) choose from their
logits with the tokens their grammar forbids set to -inf: a greedy row takes
the argmax of those, a sample row draws from that masked distribution (after
temperature, top-k and top-p). The log-probs and top alternatives recorded
are still the model's own, before the mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from candor.backends.base import SamplingParams

# The logits :func:`pick_tokens` sorts in every row, for greedy, top-k and top log-probs alike.
SHARED_TOP = 64


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One token per row: temperature, top-k, top-p, then an inverse-CDF draw at ``uniforms``."""
    values, ids = logits.topk(_kept(params, logits.shape[-1]), dim=-1)  # sorted, largest first
    return sample_from_top(values, ids, uniforms, params)


def sample_from_top(
    values: torch.Tensor, ids: torch.Tensor, uniforms: torch.Tensor, params: SamplingParams
) -> torch.Tensor:
    """:func:`sample_tokens` from each row's top logits, sorted largest first (``values``, ``ids``).

    Only the first ``top_k`` columns are read (all when ``top_k`` is 0).
    """
    k = _kept(params, values.shape[-1])
    values, ids = values[:, :k], ids[:, :k]
    probs = torch.softmax(values / params.temperature, dim=-1)
    if params.top_p < 1.0:
        # Keep a token while the mass ranked above it is still below top_p (always keeps the first).
        mass_before = probs.cumsum(-1) - probs
        probs = probs.masked_fill(mass_before >= params.top_p, 0.0)
    cdf = probs.cumsum(-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(-1)
    # At most the last token of positive probability (rounding can put the target at the cdf's end, past the
    # tokens top-p or a grammar's mask left at zero).
    last = (probs > 0).sum(-1, keepdim=True).sub_(1).clamp_(min=0)
    choice = torch.minimum(torch.searchsorted(cdf, target, right=True), last)
    return ids.gather(1, choice).squeeze(1)


def _kept(params: SamplingParams, vocab: int) -> int:
    """How many of the top logits ``params`` samples from."""
    return params.top_k if 0 < params.top_k < vocab else vocab


def row_seed(prompt_seed: int, sample: int) -> int:
    """A well-mixed 63-bit seed for one sample row of one prompt."""
    state = np.random.SeedSequence([prompt_seed % (1 << 64), sample]).generate_state(1, dtype=np.uint64)
    return int(state[0]) & ((1 << 63) - 1)


def row_uniforms(prompt_seed: int, sample: int, steps: int) -> list[float]:
    """The uniform draws of one sample row, one per step (float32 values, as the draw uses them)."""
    generator = torch.Generator().manual_seed(row_seed(prompt_seed, sample))
    return torch.rand(steps, generator=generator).tolist()


def pick_tokens(
    logits: torch.Tensor,
    samplers: Sequence[tuple[SamplingParams, list[int], list[float]]],
    top_logprobs: int,
    masked: tuple[list[int], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, tuple[list[list[int]], list[list[float]]] | None]:
    """Chosen tokens, their log-probs under the raw (temperature 1) distribution, and the top-k there.

    Every row is greedy except those listed in ``samplers``: for each sampling
    setting, the rows that sample with it and their uniforms for this step.
    ``masked``: the constrained rows and their logits with the forbidden tokens
    at -inf (row i of the tensor is ``rows[i]``); those rows choose from them,
    while every log-prob and top alternative is read from ``logits``.

    One partial sort of every row, of a fixed :data:`SHARED_TOP` logits,
    serves the greedy choice, top-k sampling and the reported top log-probs
    (each its own pass over the vocabulary otherwise); a larger ``top_k``
    (or 0) or ``top_logprobs`` sorts apart. The sort's size is fixed, not
    taken from the settings in the batch, because the order a sort gives
    equal logits depends on its size: so a row's tokens never depend on the
    rows beside it. A greedy row whose two best logits tie takes ``argmax``'s
    first index.
    """
    vocab = logits.shape[-1]
    values, ids = logits.topk(min(SHARED_TOP, vocab), dim=-1)
    tokens = _greedy_from_top(logits, values, ids)
    sources = [_Choices(logits=logits, values=values, ids=ids, rows={})]
    if masked is not None and masked[0]:
        rows, masked_logits = masked
        masked_values, masked_ids = masked_logits.topk(min(SHARED_TOP, vocab), dim=-1)
        index = torch.tensor(rows, device=logits.device)
        tokens[index] = _greedy_from_top(masked_logits, masked_values, masked_ids)
        sources[0].skip.update((j, None) for j in rows)
        rows_here = {j: i for i, j in enumerate(rows)}
        sources.append(_Choices(logits=masked_logits, values=masked_values, ids=masked_ids, rows=rows_here))
    for params, rows, uniforms in samplers:
        if params.temperature <= 0:
            continue
        for source in sources:
            picked = [(j, u) for j, u in zip(rows, uniforms, strict=True) if source.has(j)]
            if picked:
                out = [j for j, _ in picked]
                tokens[torch.tensor(out, device=logits.device)] = source.draw(
                    [source.position(j) for j in out], [u for _, u in picked], params
                )
    chosen = logits.gather(1, tokens.unsqueeze(1)).squeeze(1)
    log_z = torch.logsumexp(logits, dim=-1)
    top = None
    if top_logprobs:
        k = min(top_logprobs, vocab)
        if k > values.shape[-1]:
            values, ids = logits.topk(k, dim=-1)
        top = (ids[:, :k].tolist(), (values[:, :k] - log_z.unsqueeze(1)).tolist())
    return tokens, chosen - log_z, top


@dataclass
class _Choices:
    """Logits rows choose from and their sorted top: the batch's own (``rows`` empty: every row not in ``skip``),
    or the masked rows' (``rows`` maps a batch row to its row here)."""

    logits: torch.Tensor
    values: torch.Tensor
    ids: torch.Tensor
    rows: dict[int, int]
    skip: dict[int, None] = field(default_factory=dict)

    def has(self, row: int) -> bool:
        return row in self.rows if self.rows else row not in self.skip

    def position(self, row: int) -> int:
        return self.rows[row] if self.rows else row

    def draw(self, positions: list[int], uniforms: list[float], params: SamplingParams) -> torch.Tensor:
        index = torch.tensor(positions, device=self.logits.device)
        draws = torch.tensor(uniforms, dtype=torch.float32, device=self.logits.device)
        if _kept(params, self.logits.shape[-1]) <= self.values.shape[-1]:
            return sample_from_top(self.values[index], self.ids[index], draws, params)
        return sample_tokens(self.logits[index], draws, params)


def _greedy_from_top(logits: torch.Tensor, values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each row's ``argmax`` from its sorted top logits: the first index of the largest, as ``argmax`` picks."""
    tokens = ids[:, 0].clone()
    if values.shape[-1] > 1:
        tied = (values[:, 0] == values[:, 1]).nonzero().squeeze(1)
        if tied.numel():  # the sort's order among equal logits is not argmax's
            tokens[tied] = logits[tied].argmax(dim=-1)
    return tokens
