"""The built-in claim-level estimators (docs/claims.md "Claim-level confidences").

Token reductions over a claim's tokens (``Claim.tokens``), as lm-polygraph's
claim estimators compute them, converted to confidences at the edge:

- ``claim-prob``: ``exp(sum of the claim's token log-probs)`` (lm-polygraph
  ``MaximumClaimProbability`` gives ``-sum``);
- ``claim-perplexity``: ``exp(mean token log-prob)`` (``PerplexityClaim``: ``-mean``);
- ``claim-max-entropy``: ``exp(-max token entropy)``, the entropy (nats) of the
  model's full next-token distribution, from one teacher-forced pass of the
  answer after its prompt (``MaxTokenEntropyClaim``: the max).

And, reading more than the answer's tokens:

- ``claim-ptrue``: the model asked whether the claim is true ("Proposed answer:
  {claim}" after the question, candor's ``p-true`` prompt), P(True);
- ``claim-consistency``: the share of the ``k`` sampled answers that support
  the claim, a sample supporting it when a consistency judge finds one of the
  sample's sentences equivalent to it (``judge``, default ``lexical-echo``);
- ``claim-ccp`` lives in :mod:`candor.estimators.claim_ccp`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.annotation.claims import sentence_spans
from candor.annotation.judges import DEFAULT_CONSISTENCY_JUDGE, get_consistency_judge
from candor.backends.base import LOGPROBS, NEXT_TOKEN_LOGPROBS, Backend
from candor.estimators.claim_base import CLAIM_ESTIMATORS, ClaimContext, ClaimEstimator
from candor.estimators.ptrue import LABELS, PTRUE_CUE, PTRUE_QUESTION
from candor.util.errors import CandorError
from candor.verbal.distribution import candidate_distribution
from candor.verbal.formats import render_turns


def claim_token_values(ctx: ClaimContext, per_token: Sequence[float], what: str) -> list[np.ndarray]:
    """``per_token`` (one value per answer token) at each claim's tokens."""
    values = np.asarray(per_token, dtype=float)
    out = []
    for claim in ctx.claims:
        if not claim.tokens:
            raise CandorError(f"answer {ctx.id or '?'}: claim {claim.text!r} rests on no token; cannot reduce {what}")
        if max(claim.tokens) >= len(values):
            raise CandorError(f"answer {ctx.id or '?'}: claim {claim.text!r} names a token past the answer's end")
        out.append(values[claim.tokens])
    return out


class _LogprobReduction(ClaimEstimator):
    requires = frozenset({LOGPROBS})

    def reduce(self, logprobs: np.ndarray) -> float:
        raise NotImplementedError

    def _estimate(self, contexts: Sequence[ClaimContext], backend: Backend | None) -> list[np.ndarray]:
        return [
            np.array([self.reduce(lp) for lp in claim_token_values(ctx, ctx.answer.logprobs, "log-probs")])
            for ctx in contexts
        ]


@CLAIM_ESTIMATORS.register("claim-prob")
class ClaimProbability(_LogprobReduction):
    """exp(sum of the claim's token log-probs)."""

    name = "claim-prob"

    def reduce(self, logprobs: np.ndarray) -> float:
        return float(np.exp(np.sum(logprobs)))


@CLAIM_ESTIMATORS.register("claim-perplexity")
class ClaimPerplexity(_LogprobReduction):
    """exp(mean of the claim's token log-probs) = 1 / perplexity."""

    name = "claim-perplexity"

    def reduce(self, logprobs: np.ndarray) -> float:
        return float(np.exp(np.mean(logprobs)))


@CLAIM_ESTIMATORS.register("claim-max-entropy")
class ClaimMaxEntropy(ClaimEstimator):
    """exp(-the largest full-vocabulary token entropy over the claim's tokens)."""

    name = "claim-max-entropy"
    needs_backend = True
    needs_prompt = True

    def _estimate(self, contexts: Sequence[ClaimContext], backend: Backend | None) -> list[np.ndarray]:
        entropies = answer_entropies(contexts, backend)
        return [
            np.array([np.exp(-np.max(h)) for h in claim_token_values(ctx, ent, "entropies")])
            for ctx, ent in zip(contexts, entropies, strict=True)
        ]


def answer_entropies(contexts: Sequence[ClaimContext], backend: Backend | None) -> list[np.ndarray]:
    """Full-vocabulary entropy (nats) before each answer token, by one teacher-forced pass."""
    stats_fn = getattr(backend, "token_distribution_stats", None)
    if stats_fn is None:
        raise CandorError(
            f"backend {type(backend).__name__} cannot give full next-token distributions; use the hf backend"
        )
    for ctx in contexts:
        if not ctx.answer.token_ids:
            raise CandorError(f"answer {ctx.id or '?'} has no token ids to score")
    stats = stats_fn([c.prompt for c in contexts], [list(c.answer.token_ids) for c in contexts])
    return [np.asarray(s)[:, 0] for s in stats]


@CLAIM_ESTIMATORS.register("claim-ptrue")
class ClaimPTrue(ClaimEstimator):
    """P(True) of "Proposed answer: {claim}" after the question (candor's p-true prompt)."""

    name = "claim-ptrue"
    needs_backend = True
    requires = frozenset({NEXT_TOKEN_LOGPROBS})

    def _estimate(self, contexts: Sequence[ClaimContext], backend: Backend | None) -> list[np.ndarray]:
        assert backend is not None
        prompts = [
            render_turns(backend, None, claim_ptrue_user(ctx.question, c.text), PTRUE_CUE)
            for ctx in contexts
            for c in ctx.claims
        ]
        flat = candidate_distribution(backend, prompts, LABELS)[:, 0]
        return regroup(flat, contexts)


def claim_ptrue_user(question: str, claim: str) -> str:
    """The user turn of claim p-true: the question, the claim as the proposed answer, the True/False ask."""
    return f"Question: {question}\nProposed answer: {claim}\n{PTRUE_QUESTION}"


def regroup(flat: Sequence[float], contexts: Sequence[ClaimContext]) -> list[np.ndarray]:
    """A flat array of per-claim values cut back into one array per context."""
    out, at = [], 0
    for ctx in contexts:
        out.append(np.asarray(flat[at : at + len(ctx.claims)], dtype=float))
        at += len(ctx.claims)
    return out


@CLAIM_ESTIMATORS.register("claim-consistency")
class ClaimConsistency(ClaimEstimator):
    """Share of the sampled answers with a sentence the consistency judge finds equivalent to the claim."""

    name = "claim-consistency"
    min_samples = 1

    def __init__(self, judge: str = DEFAULT_CONSISTENCY_JUDGE, backend: Backend | None = None) -> None:
        options: dict[str, Any] = {"backend": backend} if judge == "llm" else {}
        if judge == "llm" and backend is None:
            raise CandorError("claim-consistency with judge 'llm' needs the judge's backend")
        self.judge = get_consistency_judge(judge, **options)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "judge": self.judge.describe()}

    def _estimate(self, contexts: Sequence[ClaimContext], backend: Backend | None) -> list[np.ndarray]:
        left, right, owners = [], [], []  # owners: (context, claim, sample) of each judged pair
        for i, ctx in enumerate(contexts):
            sample_claims = [[s.text[a:b] for a, b in sentence_spans(s.text)] for s in ctx.samples]
            for j, claim in enumerate(ctx.claims):
                for s, pieces in enumerate(sample_claims):
                    for piece in pieces:
                        left.append(piece)
                        right.append(claim.text)
                        owners.append((i, j, s))
        verdicts = self.judge.judge(left, right) if left else []
        support = [np.zeros((len(c.claims), len(c.samples))) for c in contexts]
        for (i, j, s), verdict in zip(owners, verdicts, strict=True):
            support[i][j, s] = max(support[i][j, s], verdict)
        return [m.mean(axis=1) for m in support]
