"""Claim-level estimators: the interface and its registry, beside the answer-level one.

See docs/claims.md "Claim-level confidences".

A claim estimator turns one answer and its claims (a :class:`ClaimContext`)
into one confidence in [0, 1] per claim. Like answer-level estimators it
declares the backend capabilities it needs (``requires``) and is refused
before any work when the backend lacks them; its output is checked (one
finite value in [0, 1] per claim).

The built-in estimators register in :mod:`candor.estimators.claim_methods` and
:mod:`candor.estimators.claim_ccp`; :mod:`candor.estimators.claim_scoring` is
the way in (``score_claims``, ``score_record_claims``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from candor.annotation.claims import Claim
from candor.annotation.prompts import record_prompts
from candor.annotation.records import Record
from candor.backends.base import Backend, Completion, backend_capabilities
from candor.estimators.base import RECORDED
from candor.util.errors import CandorError
from candor.util.registry import Registry


@dataclass
class ClaimContext:
    """One answer to score: the exact prompt it was generated from, the question, the claims, samples."""

    prompt: str
    question: str
    answer: Completion
    claims: list[Claim]
    samples: list[Completion] = field(default_factory=list)
    id: str = ""


@dataclass(frozen=True)
class ServedClaims:
    """How a claim estimator scores a served answer's claims (:meth:`ClaimEstimator.serve_on`).

    ``path``: which computation scores them, in words, for the startup log. ``calibrated_on``: what its
    values are probabilities fitted on labels for (a served question asked alone), in words; None when
    they are scores, not calibrated probabilities. ``unlike_offline``: why the served values are not
    those ``candor claims`` computes on the same answer (a factuality guarantee tuned on those would not
    hold for them); None when they are.
    """

    path: str
    calibrated_on: str | None = None
    unlike_offline: str | None = None


class ClaimEstimator:
    """Base class: ``name``, ``requires``, ``needs_backend``, ``min_samples``, ``servable``, ``reads_claim_head``."""

    name: ClassVar[str] = "claim-estimator"
    requires: frozenset[str] = frozenset()
    needs_backend: ClassVar[bool] = False
    needs_prompt: ClassVar[bool] = False  # re-runs the model on the answer's exact prompt
    min_samples: ClassVar[int] = 0
    # Whether `candor serve --claims NAME` can run it on a served answer; when not, why (the refusal says it).
    servable: ClassVar[bool] = True
    not_served_because: ClassVar[str] = ""
    # Whether it reads a trained claim head (``head=<folder>``; ``--claim-head`` on the command line).
    reads_claim_head: ClassVar[bool] = False
    _tolerance: ClassVar[float] = 1e-6

    def estimate(self, contexts: Sequence[ClaimContext], backend: Backend | None = None) -> list[np.ndarray]:
        """One array of confidences per context, one value per claim."""
        self.check_backend(backend)
        for ctx in contexts:
            if len(ctx.samples) < self.min_samples:
                raise CandorError(
                    f"claim estimator {self.name!r} needs {self.min_samples} sampled answers; "
                    f"answer {ctx.id or '?'} has {len(ctx.samples)}"
                )
        todo = [ctx for ctx in contexts if ctx.claims]
        values = iter(self._estimate(todo, backend) if todo else [])
        out = [self._checked(next(values), ctx) if ctx.claims else np.zeros(0) for ctx in contexts]
        return out

    def check_backend(self, backend: Backend | None) -> None:
        if self.needs_backend and backend is None:
            raise CandorError(f"claim estimator {self.name!r} needs a model backend (pass --model / backend=...)")
        if backend is not None:
            missing = (self.requires - RECORDED) - backend_capabilities(backend)
            if missing:
                raise CandorError(
                    f"claim estimator {self.name!r} needs {', '.join(sorted(missing))}, which the backend "
                    f"{type(backend).__name__} does not offer; use a white-box backend such as hf"
                )

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def serve_on(self, backend: Backend, template: str) -> ServedClaims:
        """Bind to the generator that serves the answers (prompts rendered with ``template``), at startup.

        Raises :class:`CandorError` when it cannot score that generator's answers. The default: the
        method runs on the served answer with the served backend, and its values are scores.
        """
        return ServedClaims(
            f"{self.name} scores each answer's claims in the engine thread, on the answer as generated; "
            "its values are scores, not probabilities calibrated on labels"
        )

    def _estimate(self, contexts: Sequence[ClaimContext], backend: Backend | None) -> list[np.ndarray]:
        raise NotImplementedError

    def _checked(self, values: np.ndarray, ctx: ClaimContext) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        if values.shape != (len(ctx.claims),):
            raise RuntimeError(f"claim estimator {self.name!r} gave {values.shape} values for {len(ctx.claims)} claims")
        bad = ~np.isfinite(values) | (values < -self._tolerance) | (values > 1 + self._tolerance)
        if bad.any():
            raise RuntimeError(f"claim estimator {self.name!r} gave {values[bad][0]!r}, outside [0, 1]")
        return np.clip(values, 0.0, 1.0)


# Later stages add claim estimators through the entry-point group (elical-claims, a trained head).
CLAIM_ESTIMATORS: Registry[Callable[..., ClaimEstimator]] = Registry(
    "claim estimator", plugins="candor.claim_estimators"
)


def contexts_from_records(records: Sequence[Record], backend: Backend | None) -> list[ClaimContext]:
    """A :class:`ClaimContext` per record (records must carry claims); prompts rendered when a backend is given."""
    for rec in records:
        if rec.claims is None:
            raise CandorError(f"record {rec.id!r} has no claims; split its answer first (candor claims split)")
    prompts = record_prompts(records, backend)[0] if backend is not None and records else [""] * len(records)
    return [
        ClaimContext(
            prompt=p,
            question=r.item.question,
            answer=r.greedy,
            claims=list(r.claims or []),
            samples=list(r.samples),
            id=r.id,
        )
        for p, r in zip(prompts, records, strict=True)
    ]
