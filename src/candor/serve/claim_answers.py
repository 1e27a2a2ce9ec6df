"""``candor serve --claims METHOD``: a confidence for each claim of a long answer, and refinement.

An answer of more than one claim (split by the ``sentence`` decomposer,
:func:`candor.annotation.claim_split.split_claims`) gets one confidence per claim
from a claim estimator (:mod:`candor.estimators.claim_scoring`), computed on the
answer as generated, in the engine thread, the question alone. With ``refine``,
the claims below ``threshold`` are removed (``remove``) or marked ``[?…]``
(``mark``), and the returned text is the refined one; the removed claims are
listed in the ``confidence`` object. An answer of one claim is left as it is: its
answer-level confidence already speaks for it. With ``factuality_alpha`` the
threshold is the one tuned on dev answers with a factuality guarantee
(:mod:`candor.serve.factuality`), which then travels in the ``confidence`` object.

See docs/claims.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from candor.annotation.claim_split import split_claims
from candor.annotation.claims import Claim, refine
from candor.backends.base import Backend, Completion
from candor.estimators.claim_scoring import built, claim_estimator_names, score_claims
from candor.serve.factuality import FactualityGuarantee, check_alpha
from candor.util.errors import CandorError

REFINE_MODES = ("remove", "mark")


@dataclass(frozen=True)
class ClaimPolicy:
    """Which claim estimator scores an answer's claims, and whether low ones are removed or marked."""

    method: str
    refine: str | None = None  # None: report the claims only
    threshold: float = 0.5  # claims below it are refined away (claim values, not the answer's threshold)
    decomposer: str = "sentence"
    factuality_alpha: float | None = None  # refine at the threshold tuned for this alpha (the model's guarantee)

    def __post_init__(self) -> None:
        if self.method not in claim_estimator_names():
            raise CandorError(f"unknown claim method {self.method!r}; known: {', '.join(claim_estimator_names())}")
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
    """An answer's claims with their confidences, and the text returned (refined or as generated)."""

    method: str
    claims: list[Claim]
    values: list[float]
    text: str
    removed: list[Claim] = field(default_factory=list)
    refine: str | None = None
    factuality: FactualityGuarantee | None = None

    def describe(self) -> dict[str, Any]:
        """The claim part of a choice's ``confidence`` object; ``start``/``end`` index the answer as generated."""
        value = dict(zip((id(c) for c in self.claims), self.values, strict=True))
        return {
            "claim_method": self.method,
            "claims": [
                {"text": c.text, "start": c.start, "end": c.end, "value": v}
                for c, v in zip(self.claims, self.values, strict=True)
            ],
            "claim_refine": self.refine,
            "removed_claims": [
                {"text": c.text, "start": c.start, "end": c.end, "value": value[id(c)]} for c in self.removed
            ],
            "factuality": None if self.factuality is None else self.factuality.describe(),
        }


class ClaimJudge:
    """A policy's estimator built once for the generator, checked at startup.

    ``guarantee``: the factuality guarantee a policy with ``factuality_alpha`` refines by (its threshold).
    """

    def __init__(self, policy: ClaimPolicy, backend: Backend, guarantee: FactualityGuarantee | None = None) -> None:
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
        self.estimator = built(policy.method, backend, {})
        self.estimator.check_backend(backend)
        if self.estimator.min_samples:  # the served answer has no samples of its own to compare claims with
            raise CandorError(
                f"claim method {policy.method!r} reads sampled answers, which serving does not make "
                "per claim; serve a claim method that reads the answer itself"
            )

    def judge(self, completion: Completion, prompt: str, question: str) -> ClaimVerdict | None:
        """The answer's claims scored (and refined); None for an answer of one claim or none."""
        policy = self.policy
        claims = split_claims(completion.text, completion, policy.decomposer, decode=self.backend.decode)
        if len(claims) <= 1:
            return None
        values = [
            float(v)
            for v in score_claims(self.estimator, completion, claims, self.backend, prompt=prompt, question=question)
        ]
        text, removed = completion.text, []
        if policy.refine is not None:
            text, removed = refine(completion.text, claims, values, self.threshold, policy.refine)  # type: ignore[arg-type]
        return ClaimVerdict(
            method=policy.method,
            claims=claims,
            values=values,
            text=text,
            removed=removed,
            refine=policy.refine,
            factuality=self.guarantee,
        )
