"""Scoring claims: build a claim estimator by name and run it on one answer or on records.

See docs/claims.md "Claim-level confidences".

- :func:`score_claims` for one answer (a server holding a completion and its
  prompt): ``score_claims("claim-prob", completion, claims, backend, prompt=…)``;
- :func:`score_record_claims` for records that carry claims (``Record.claims``).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import candor.estimators.claim_ccp  # noqa: F401  (registers claim-ccp)
import candor.estimators.claim_methods  # noqa: F401  (registers the token, p-true and consistency ones)
from candor.annotation.claims import Claim
from candor.annotation.records import Record
from candor.backends.base import Backend, Completion
from candor.estimators.claim_base import CLAIM_ESTIMATORS, ClaimContext, ClaimEstimator, contexts_from_records
from candor.util.errors import CandorError


def get_claim_estimator(name: str, **options: Any) -> ClaimEstimator:
    """Build a registered claim estimator, e.g. ``get_claim_estimator("claim-ccp", judge="llm", backend=b)``."""
    return CLAIM_ESTIMATORS.build(name, **options)


def built(method: str | ClaimEstimator, backend: Backend | None, options: dict[str, Any]) -> ClaimEstimator:
    """``method`` itself, or the named estimator, given ``backend`` when it takes one (the default judge's model)."""
    if isinstance(method, ClaimEstimator):
        if options:
            raise CandorError(f"options {sorted(options)} given with an estimator already built; build it with them")
        return method
    factory = CLAIM_ESTIMATORS.get(method)
    if backend is not None and "backend" in inspect.signature(factory).parameters:
        options = {"backend": backend, **options}
    return factory(**options)


def claim_estimator_names() -> list[str]:
    return CLAIM_ESTIMATORS.names()


def not_served_because(name: str) -> str | None:
    """Why ``candor serve --claims NAME`` refuses the named estimator, or None when it can serve it."""
    factory = CLAIM_ESTIMATORS.get(name)
    estimator = getattr(factory, "func", factory)  # a functools.partial registers a configured class
    if getattr(estimator, "servable", True):
        return None
    return str(getattr(estimator, "not_served_because", "")) or "it cannot score a served answer"


def reads_claim_head(name: str) -> bool:
    """Whether the named estimator reads a trained claim head (``head=``; ``--claim-head``)."""
    factory = CLAIM_ESTIMATORS.get(name)
    return bool(getattr(getattr(factory, "func", factory), "reads_claim_head", False))


def score_record_claims(
    method: str | ClaimEstimator, records: Sequence[Record], backend: Backend | None = None, **options: Any
) -> list[list[float]]:
    """Per record, one confidence per claim (``record.claims`` order)."""
    estimator = built(method, backend, options)
    contexts = contexts_from_records(records, backend if estimator.needs_backend else None)
    return [v.tolist() for v in estimator.estimate(contexts, backend)]


def score_claims(
    method: str | ClaimEstimator,
    completion: Completion,
    claims: Sequence[Claim],
    backend: Backend | None = None,
    *,
    prompt: str = "",
    question: str = "",
    samples: Sequence[Completion] = (),
    **options: Any,
) -> list[float]:
    """One confidence per claim of one answer.

    ``prompt`` is the exact text the answer was generated from (the estimators
    that re-run the model read it), ``question`` the user's question (claim
    p-true), ``samples`` the sampled answers (claim self-consistency).
    Options go to the estimator (``judge``, ``backend``…).
    """
    estimator = built(method, backend, options)
    if estimator.needs_prompt and not prompt:
        raise CandorError(f"claim estimator {estimator.name!r} re-runs the model: pass the answer's prompt")
    ctx = ClaimContext(prompt=prompt, question=question, answer=completion, claims=list(claims), samples=list(samples))
    return estimator.estimate([ctx], backend)[0].tolist()
