"""``candor serve --claims METHOD``: a confidence for each claim of a long answer, and refinement.

An answer of more than one claim (split by the ``sentence`` decomposer,
:func:`candor.annotation.claim_split.split_claims`) gets one confidence per claim
from a claim estimator (:mod:`candor.estimators.claim_scoring`), computed on the
answer as generated, in the engine thread, the question alone. With ``refine``,
the claims below ``threshold`` are removed (``remove``) or marked ``[?…]``
(``mark``), and the returned text is the refined one. The ``confidence``
object carries each claim's span in the returned text and its value, never a
removed claim's text (the record log keeps that for the operator); after a
refinement ``scores_returned_text`` is False. An answer of one claim is left as it is: its
answer-level confidence already speaks for it. With ``factuality_alpha`` the
threshold is the one tuned on dev answers with a factuality guarantee
(:mod:`candor.serve.factuality`), which then travels in the ``confidence`` object.

A method that reads a trained claim head (``elical-claims``) is given it with
``head`` (``--claim-head``) and reads the served model's own pass over the
answer (:meth:`~candor.estimators.claim_base.ClaimEstimator.serve_on`, which says
the path in the startup log). ``claim_calibrated`` is True only where the
method's values are probabilities fitted on labels for this request: a head
with a stage 2 on labels, its template the served one, a question asked alone.

See docs/claims.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from candor.annotation.claim_split import split_claims
from candor.annotation.claims import Claim, refine
from candor.backends.base import Backend, Completion
from candor.estimators.claim_scoring import (
    built,
    claim_estimator_names,
    not_served_because,
    reads_claim_head,
    score_claims,
)
from candor.serve.factuality import FactualityGuarantee, check_alpha
from candor.serve.shapes import QUESTION
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

REFINE_MODES = ("remove", "mark")


@dataclass(frozen=True)
class ClaimPolicy:
    """Which claim estimator scores an answer's claims, and whether low ones are removed or marked."""

    method: str
    refine: str | None = None  # None: report the claims only
    threshold: float = 0.5  # claims below it are refined away (claim values, not the answer's threshold)
    decomposer: str = "sentence"
    factuality_alpha: float | None = None  # refine at the threshold tuned for this alpha (the model's guarantee)
    head: str | None = None  # the claim head folder of a method that reads one (--claim-head)

    def __post_init__(self) -> None:
        if self.method not in claim_estimator_names():
            raise CandorError(f"unknown claim method {self.method!r}; known: {', '.join(claim_estimator_names())}")
        if reads_claim_head(self.method) and self.head is None:
            raise CandorError(
                f"--claims {self.method} needs --claim-head DIR (a claim head from `candor train {self.method}`)"
            )
        if self.head is not None and not reads_claim_head(self.method):
            readers = [n for n in claim_estimator_names() if reads_claim_head(n)]
            raise CandorError(
                f"--claim-head is read only by --claims {' or '.join(readers) or 'a claim-head method'}, "
                f"not by {self.method}"
            )
        refused = not_served_because(self.method)
        if refused is not None:
            raise CandorError(f"--claims {self.method} is not served: {refused}")
        if self.refine is not None and self.refine not in REFINE_MODES:
            raise CandorError(f"--refine must be one of {', '.join(REFINE_MODES)}; got {self.refine!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise CandorError(f"--claim-threshold must be in [0, 1]; got {self.threshold}")
        if self.factuality_alpha is not None:
            check_alpha(self.factuality_alpha)
            if self.refine != "remove":
                raise CandorError(
                    "--factuality-alpha needs --refine remove: the guarantee is about the claims left in the text"
                )


@dataclass
class ClaimVerdict:
    """An answer's claims with their confidences, and the text returned (refined or as generated).

    ``spans`` gives each claim's ``[start, end)`` in the returned ``text`` (None for
    a removed claim); ``removed`` holds the claims below the threshold (removed,
    or marked with ``mark``).
    """

    method: str
    claims: list[Claim]
    values: list[float]
    text: str
    spans: list[tuple[int, int] | None]
    removed: list[Claim] = field(default_factory=list)
    refine: str | None = None
    factuality: FactualityGuarantee | None = None
    calibrated_on: str | None = None  # what the values are calibrated probabilities for; None: scores

    @property
    def refined(self) -> bool:
        """Whether the returned text differs from the answer as generated (a claim removed or marked)."""
        return self.refine is not None and bool(self.removed)

    def describe(self) -> dict[str, Any]:
        """The claim part of a choice's ``confidence`` object: spans into the returned text and values only.

        No claim's text is in it: a removed claim is named by its index and value
        alone, so a client never sees its words (the record log keeps them for the
        operator, :meth:`for_record`).
        """
        below = {id(c) for c in self.removed}
        claims = [
            {"index": i, "start": None if s is None else s[0], "end": None if s is None else s[1], "value": v}
            for i, (s, v) in enumerate(zip(self.spans, self.values, strict=True))
        ]
        return {
            "claim_method": self.method,
            "claim_refine": self.refine,
            "claim_calibrated": self.calibrated_on is not None,
            "claim_calibrated_on": self.calibrated_on,
            "claims": claims,
            "removed_claims": [
                {"index": i, "value": v}
                for i, (c, v) in enumerate(zip(self.claims, self.values, strict=True))
                if id(c) in below
            ],
            "refined": None if not self.refined else self.counts(),
            "factuality": None if self.factuality is None else self.factuality.describe(),
        }

    def counts(self) -> dict[str, Any]:
        """How the text was refined: the mode, and how many claims were kept and removed (or marked)."""
        done = "removed" if self.refine == "remove" else "marked"
        return {"mode": self.refine, "kept": len(self.claims) - len(self.removed), done: len(self.removed)}

    def for_record(self) -> dict[str, Any]:
        """The claims as the served record keeps them, for the operator: each claim's text and its span in the
        answer as generated, its value, and whether it was removed or marked."""
        below = {id(c) for c in self.removed}
        return {
            "claim_method": self.method,
            "claim_refine": self.refine,
            "claim_calibrated": self.calibrated_on is not None,
            "claim_calibrated_on": self.calibrated_on,
            "claims": [
                {"index": i, "text": c.text, "start": c.start, "end": c.end, "value": v, "below": id(c) in below}
                for i, (c, v) in enumerate(zip(self.claims, self.values, strict=True))
            ],
            "factuality": None if self.factuality is None else self.factuality.describe(),
        }


class ClaimJudge:
    """A policy's estimator built once for the generator, checked at startup.

    ``guarantee``: the factuality guarantee a policy with ``factuality_alpha`` refines by (its threshold);
    ``template``: the name of the template the served prompts are rendered with.
    """

    def __init__(
        self,
        policy: ClaimPolicy,
        backend: Backend,
        guarantee: FactualityGuarantee | None = None,
        template: str = "",
    ) -> None:
        if (policy.factuality_alpha is None) != (guarantee is None) or (
            guarantee is not None and not guarantee.matches(policy.method, policy.factuality_alpha)  # type: ignore[arg-type]
        ):
            raise CandorError(
                "a claim policy with --factuality-alpha needs the guarantee tuned for its method and alpha"
            )
        self.policy = policy
        self.guarantee = guarantee
        self.threshold = policy.threshold if guarantee is None else guarantee.threshold
        self.backend = backend
        self.estimator = built(policy.method, backend, {} if policy.head is None else {"head": policy.head})
        self.estimator.check_backend(backend)
        if self.estimator.min_samples:  # the served answer has no samples of its own to compare claims with
            raise CandorError(
                f"claim method {policy.method!r} reads sampled answers, which serving does not make "
                "per claim; serve a claim method that reads the answer itself"
            )
        self.serving = self.estimator.serve_on(backend, template)
        if guarantee is not None and self.serving.unlike_offline is not None:
            raise CandorError(
                f"--factuality-alpha with --claims {policy.method}: the guarantee was tuned on the values `candor "
                f"claims` computes, which are not the served ones here ({self.serving.unlike_offline})"
            )
        logger.info("claims: %s", self.serving.path)

    def judge(self, completion: Completion, prompt: str, question: str, shape: str = QUESTION) -> ClaimVerdict | None:
        """The answer's claims scored (and refined); None for an answer of one claim or none.

        ``shape`` is the request's (:mod:`candor.serve.shapes`): the values are calibrated for a question asked
        alone at most.
        """
        policy = self.policy
        calibrated_on = self.serving.calibrated_on if shape == QUESTION else None
        claims = split_claims(completion.text, completion, policy.decomposer, decode=self.backend.decode)
        if len(claims) <= 1:
            return None
        values = [
            float(v)
            for v in score_claims(self.estimator, completion, claims, self.backend, prompt=prompt, question=question)
        ]
        if policy.refine is None:
            spans: list[tuple[int, int] | None] = [(c.start, c.end) for c in claims]
            return ClaimVerdict(
                method=policy.method,
                claims=claims,
                values=values,
                text=completion.text,
                spans=spans,
                calibrated_on=calibrated_on,
            )
        refined = refine(completion.text, claims, values, self.threshold, policy.refine)  # type: ignore[arg-type]
        return ClaimVerdict(
            method=policy.method,
            claims=claims,
            values=values,
            text=refined.text,
            spans=refined.spans,
            removed=refined.removed,
            refine=policy.refine,
            factuality=self.guarantee,
            calibrated_on=calibrated_on,
        )
