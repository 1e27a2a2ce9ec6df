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

See docs/claims.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from candor.annotation.claim_split import split_claims
from candor.annotation.claims import Claim, refine
from candor.backends.base import Backend, Completion
from candor.estimators.claim_scoring import built, claim_estimator_names, not_served_because, score_claims
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
            "claims": [
                {"index": i, "text": c.text, "start": c.start, "end": c.end, "value": v, "below": id(c) in below}
                for i, (c, v) in enumerate(zip(self.claims, self.values, strict=True))
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
        if policy.refine is None:
            spans: list[tuple[int, int] | None] = [(c.start, c.end) for c in claims]
            return ClaimVerdict(method=policy.method, claims=claims, values=values, text=completion.text, spans=spans)
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
        )
