"""Choosing each row's next token: greedy, or temperature / top-k / top-p sampling from a seeded draw.

Sampling is temperature, then top-k, then top-p, then a draw by inverse CDF
from a uniform taken from the row's own generator (seeded from the prompt's
seed and the sample index), so a prompt's samples never depend on which
prompts share its batch. Log-probs are always those of the raw model
distribution (temperature 1, no truncation), as ``Completion`` requires.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from candor.backends.base import SamplingParams


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One token per row: temperature, top-k, top-p, then an inverse-CDF draw at ``uniforms``."""
    vocab = logits.shape[-1]
    k = params.top_k if 0 < params.top_k < vocab else vocab
    values, ids = logits.topk(k, dim=-1)  # sorted, largest first
    probs = torch.softmax(values / params.temperature, dim=-1)
    if params.top_p < 1.0:
        # Keep a token while the mass ranked above it is still below top_p (always keeps the first).
        mass_before = probs.cumsum(-1) - probs
        probs = probs.masked_fill(mass_before >= params.top_p, 0.0)
    cdf = probs.cumsum(-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(-1)
    choice = torch.searchsorted(cdf, target, right=True).clamp_(max=k - 1)
    return ids.gather(1, choice).squeeze(1)


def row_seed(prompt_seed: int, sample: int) -> int:
    """A well-mixed 63-bit seed for one sample row of one prompt."""
    state = np.random.SeedSequence([prompt_seed % (1 << 64), sample]).generate_state(1, dtype=np.uint64)
    return int(state[0]) & ((1 << 63) - 1)


def row_uniforms(prompt_seed: int, sample: int, steps: int) -> list[float]:
    """The uniform draws of one sample row, one per step (float32 values, as the draw uses them)."""
    generator = torch.Generator().manual_seed(row_seed(prompt_seed, sample))
    return torch.rand(steps, generator=generator).tolist()


def pick_tokens(
    logits: torch.Tensor, samplers: Sequence[tuple[SamplingParams, list[int], list[float]]], top_logprobs: int
) -> tuple[torch.Tensor, torch.Tensor, tuple[list[list[int]], list[list[float]]] | None]:
    """Chosen tokens, their log-probs under the raw (temperature 1) distribution, and the top-k there.

    Every row is greedy except those listed in ``samplers``: for each sampling
    setting, the rows that sample with it and their uniforms for this step.
    """
    tokens = logits.argmax(dim=-1)
    for params, rows, uniforms in samplers:
        if params.temperature > 0:
            index = torch.tensor(rows, device=logits.device)
            draws = torch.tensor(uniforms, dtype=torch.float32, device=logits.device)
            tokens[index] = sample_tokens(logits[index], draws, params)
    chosen = logits.gather(1, tokens.unsqueeze(1)).squeeze(1)
    log_z = torch.logsumexp(logits, dim=-1)
    top = None
    if top_logprobs:
        values, ids = logits.topk(min(top_logprobs, logits.shape[-1]), dim=-1)
        top = (ids.tolist(), (values - log_z.unsqueeze(1)).tolist())
    return tokens, chosen - log_z, top
