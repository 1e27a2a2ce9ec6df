"""Integrated gradients: which input tokens move the expected confidence μ? (docs/methods.md "ADVICE and ConfTuner")

captum's :class:`~captum.attr.IntegratedGradients` runs on the input
embeddings, toward μ = Σ_c P(c | q, a)·value(c) read at the confidence
position, from a baseline of pad-token embeddings at every position (same
length). A token's attribution is the sum over the embedding dimensions.
By completeness the attributions add up to μ(input) − μ(baseline) up to the
convergence delta captum reports, which shrinks as the steps grow once they
resolve the path. On SmolLM2-135M the path from all-pad embeddings to the
prompt has sharp bumps in μ (a few thousandths of the path wide; its
gradients are right, checked against finite differences), so the delta does
not shrink steadily: on one prompt with a gap of 0.31 it was 2.2 at 32 steps,
0.77 at 64, 0.10 at 128 and 0.40 at 256. The summary reports
``median_delta_over_gap`` and the report warns when it is large.

Tokens are ranked by the size of their attribution (``|a|``, largest first);
the rank of the answer's first token says whether the answer is among what μ
reads. The interpolation steps run ``internal_batch_size`` at a time, so
memory stays that of a small batch whatever the number of steps.

captum is an optional extra: ``pip install -e '.[diagnose]'`` in candor's source folder.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from candor.data.items import QAItem
from candor.diagnose.regions import ANSWER, REGIONS, prompt_regions
from candor.util.errors import CandorError
from candor.util.version import install_hint
from candor.verbal.formats import get_format
from candor.verbal.scorer import LabelScorer

logger = logging.getLogger(__name__)

TOP_K = 10


@dataclass
class AttributionExample:
    """Per-token attributions of μ for one (question, answer)."""

    item_id: str
    answer: str
    tokens: list[str]
    roles: np.ndarray
    scores: np.ndarray
    mu_input: float
    mu_baseline: float
    delta: float

    def ranking(self) -> np.ndarray:
        """Token indices by |attribution|, largest first (ties by position)."""
        return np.argsort(-np.abs(self.scores), kind="stable")

    def top(self, k: int = TOP_K) -> list[dict[str, Any]]:
        return [
            {
                "index": int(i),
                "token": self.tokens[i],
                "region": REGIONS[self.roles[i]],
                "attribution": float(self.scores[i]),
            }
            for i in self.ranking()[:k]
        ]

    @property
    def first_answer_rank(self) -> int:
        """1-based rank of the answer's first token in :meth:`ranking` (0 when there is no answer token)."""
        where = np.flatnonzero(self.roles == ANSWER)
        if not len(where):
            return 0
        return int(np.flatnonzero(self.ranking() == where[0])[0]) + 1

    def region_shares(self) -> dict[str, float]:
        """Share of the total |attribution| on each region."""
        size = np.abs(self.scores)
        total = size.sum() or 1.0
        return {name: float(size[self.roles == k].sum() / total) for k, name in enumerate(REGIONS)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "answer": self.answer,
            "tokens": self.tokens,
            "roles": [REGIONS[r] for r in self.roles],
            "scores": self.scores.tolist(),
            "mu_input": self.mu_input,
            "mu_baseline": self.mu_baseline,
            "delta": self.delta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttributionExample:
        roles = np.array([REGIONS.index(r) for r in d["roles"]], dtype=np.int64)
        return cls(
            item_id=d["item_id"],
            answer=d["answer"],
            tokens=list(d["tokens"]),
            roles=roles,
            scores=np.asarray(d["scores"], dtype=float),
            mu_input=float(d["mu_input"]),
            mu_baseline=float(d["mu_baseline"]),
            delta=float(d["delta"]),
        )


@dataclass
class AttributionResult:
    steps: int
    examples: list[AttributionExample]

    def summary(self, top_k: int = TOP_K) -> dict[str, Any]:
        if not self.examples:
            return {"n": 0, "steps": self.steps}
        ranks = np.array([e.first_answer_rank for e in self.examples])
        shares = [e.region_shares() for e in self.examples]
        gaps = np.array([abs(e.mu_input - e.mu_baseline) for e in self.examples])
        deltas = np.array([abs(e.delta) for e in self.examples])
        return {
            "n": len(self.examples),
            "steps": self.steps,
            "mean_first_answer_rank": float(ranks.mean()),
            "median_first_answer_rank": float(np.median(ranks)),
            "mean_n_tokens": float(np.mean([len(e.tokens) for e in self.examples])),
            f"share_first_answer_in_top{top_k}": float(np.mean((ranks > 0) & (ranks <= top_k))),
            "abs_attribution_share": {r: float(np.mean([s[r] for s in shares])) for r in REGIONS},
            "mean_abs_delta": float(deltas.mean()),
            "mean_abs_mu_gap": float(gaps.mean()),
            # How far completeness is from holding; large values mean the path needs more steps.
            "median_delta_over_gap": float(np.median(deltas / np.maximum(gaps, 1e-12))),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "examples": [e.to_dict() for e in self.examples]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttributionResult:
        return cls(int(d["steps"]), [AttributionExample.from_dict(e) for e in d["examples"]])


def _captum_ig() -> Any:
    try:
        from captum.attr import IntegratedGradients
    except ImportError:
        raise CandorError(
            f"integrated gradients need captum: {install_hint('diagnose')} (or pip install captum)"
        ) from None
    return IntegratedGradients


@contextlib.contextmanager
def _frozen(model: Any) -> Iterator[None]:
    """No parameter gradients inside the block (IG needs input gradients only), restored afterwards."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)


def integrated_gradients(
    backend: Any,
    items: Sequence[QAItem],
    answers: Sequence[str],
    fmt: str = "number",
    variant: str = "default",
    *,
    steps: int = 32,
    internal_batch_size: int = 8,
) -> AttributionResult:
    """IG attributions of μ to each prompt token, for each (item, answer)."""
    if len(items) != len(answers):
        raise CandorError(f"integrated gradients: {len(items)} items but {len(answers)} answers")
    if steps < 1 or internal_batch_size < 1:
        raise CandorError(
            f"integrated gradients: steps and internal_batch_size must be ≥ 1 ({steps}, {internal_batch_size})"
        )
    ig_class = _captum_ig()
    verbal = get_format(fmt)
    scorer = LabelScorer(backend.tokenizer, verbal)
    out = []
    with _frozen(backend.model):
        for item, answer in zip(items, answers, strict=True):
            regions = prompt_regions(backend.tokenizer, item, answer, verbal.key, variant)
            out.append(
                _attribute_one(
                    ig_class, scorer, backend, verbal, regions, item.id, answer.strip(), steps, internal_batch_size
                )
            )
            logger.info("integrated gradients: %d/%d examples", len(out), len(items))
    return AttributionResult(steps, out)


def _attribute_one(
    ig_class: Any,
    scorer: Any,
    backend: Any,
    verbal: Any,
    regions: Any,
    item_id: str,
    answer: str,
    steps: int,
    internal_batch_size: int,
) -> AttributionExample:
    import torch

    model = backend.model
    ids = torch.tensor([regions.ids], dtype=torch.long, device=backend.device)
    mask = torch.ones_like(ids)
    embed = model.get_input_embeddings()
    values = torch.tensor(verbal.values, dtype=torch.float32, device=backend.device)

    def mu(embeds: torch.Tensor) -> torch.Tensor:
        n = embeds.shape[0]
        logp = scorer.log_distribution(model, ids.expand(n, -1), mask.expand(n, -1), inputs_embeds=embeds)
        return logp.float().exp() @ values

    with torch.no_grad():
        x = embed(ids)
        base = embed(torch.full_like(ids, backend.tokenizer.pad_token_id))
        mu_x, mu_b = float(mu(x)[0]), float(mu(base)[0])
    attr, delta = ig_class(mu).attribute(
        x, baselines=base, n_steps=steps, internal_batch_size=internal_batch_size, return_convergence_delta=True
    )
    scores = attr.sum(-1)[0].detach().double().cpu().numpy()
    tokens = [backend.tokenizer.decode([i]) for i in regions.ids]
    return AttributionExample(
        item_id=item_id,
        answer=answer,
        tokens=tokens,
        roles=regions.roles,
        scores=scores,
        mu_input=mu_x,
        mu_baseline=mu_b,
        delta=float(delta[0]),
    )
