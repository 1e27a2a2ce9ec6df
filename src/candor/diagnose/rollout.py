"""Attention rollout: where does the confidence position read from? (docs/methods.md "ADVICE and ConfTuner")

Rollout (Abnar & Zuidema, 2020) treats each layer's head-averaged attention
A_l, mixed with the residual connection as Â_l = ½·A_l + ½·I, as a
row-stochastic transfer matrix and multiplies them from the first layer up:
R = Â_L ⋯ Â_2 Â_1. Row t of R is how much of position t's final state flows,
through all layers, from each input token. The row of the confidence position
(the last prompt token, the ":" of "Confidence:") is split into the mass on
the answer, the question, the template and the first token (BOS).

The model runs with eager attention (the fused kernels return no attention
weights) on one unpadded sequence at a time, so only real tokens take part.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from candor.data.items import QAItem
from candor.diagnose.regions import REGIONS, prompt_regions
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

RESIDUAL = 0.5


def attention_rollout(attentions: Sequence[Any], residual: float = RESIDUAL) -> Any:
    """Rollout ``[T, T]`` of one sequence from per-layer attentions ``[heads, T, T]`` (first layer first).

    Each layer's heads are averaged, mixed as ``(1 - residual)·A + residual·I``
    and its rows renormalized (they already sum to 1 up to rounding); the
    product of row-stochastic matrices is row-stochastic, so every row of the
    result sums to 1.
    """
    import torch

    if not attentions:
        raise CandorError("attention rollout needs at least one layer of attentions")
    result = None
    for layer in attentions:
        a = layer.detach().double()
        if a.dim() != 3 or a.shape[-1] != a.shape[-2]:
            raise CandorError(f"attention rollout: expected [heads, T, T] per layer, got {tuple(a.shape)}")
        mixed = (1 - residual) * a.mean(0) + residual * torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        mixed = mixed / mixed.sum(-1, keepdim=True)
        result = mixed if result is None else mixed @ result
    return result


@contextlib.contextmanager
def eager_attention(model: Any) -> Iterator[None]:
    """Run ``model`` with eager attention inside the block, then restore its implementation."""
    previous = getattr(model.config, "_attn_implementation", None)
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if previous and previous != "eager":
            model.set_attn_implementation(previous)


@dataclass
class RolloutExample:
    """Rollout mass from the confidence position to each region of one prompt."""

    item_id: str
    answer: str
    n_tokens: int
    mass: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "answer": self.answer, "n_tokens": self.n_tokens, "mass": self.mass}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RolloutExample:
        return cls(d["item_id"], d["answer"], int(d["n_tokens"]), {k: float(v) for k, v in d["mass"].items()})


@dataclass
class RolloutResult:
    examples: list[RolloutExample]

    def summary(self) -> dict[str, Any]:
        """Mean mass per region over the examples (they sum to 1), the count, and the same without BOS.

        Rollout through many layers piles nearly all mass on the first token
        (the attention sink), so ``excl_bos`` renormalizes the rest over
        template, question and answer to keep models comparable.
        """
        out: dict[str, Any] = {"n": len(self.examples)}
        for region in REGIONS:
            out[region] = float(np.mean([e.mass[region] for e in self.examples])) if self.examples else float("nan")
        rest = [r for r in REGIONS if r != "bos"]
        out["excl_bos"] = {
            r: float(np.mean([_share(e.mass, r, rest) for e in self.examples])) if self.examples else float("nan")
            for r in rest
        }
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"examples": [e.to_dict() for e in self.examples]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RolloutResult:
        return cls([RolloutExample.from_dict(e) for e in d["examples"]])


def _share(mass: dict[str, float], region: str, among: list[str]) -> float:
    total = sum(mass[r] for r in among)
    return mass[region] / total if total > 0 else float("nan")


def rollout_masses(
    backend: Any, items: Sequence[QAItem], answers: Sequence[str], fmt: str = "number", variant: str = "default"
) -> RolloutResult:
    """Rollout mass from the confidence position to BOS, template, question and answer, per example."""
    import torch

    if len(items) != len(answers):
        raise CandorError(f"rollout: {len(items)} items but {len(answers)} answers")
    model = backend.model
    out = []
    with eager_attention(model), torch.no_grad():
        for item, answer in zip(items, answers, strict=True):
            regions = prompt_regions(backend.tokenizer, item, answer, fmt, variant)
            ids = torch.tensor([regions.ids], dtype=torch.long, device=backend.device)
            attentions = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
            row = attention_rollout([a[0] for a in attentions])[-1].cpu().numpy()
            out.append(RolloutExample(item.id, answer, len(regions.ids), regions.mass(row)))
    logger.info("attention rollout: %d examples", len(out))
    return RolloutResult(out)
