"""``elical-claims``: claim confidences from a trained EliCal claim head (docs/claims.md "A trained claim head").

    candor claims -r records.jsonl -o out -e elical-claims --head heads/claims
    get_claim_estimator("elical-claims", head="heads/claims")

The head (:mod:`candor.train.elical.claim_head`) loads its own backbone by the
name it saved and reads each answer's token ids after its prompt: the exact
prompt when the caller gives one (``ClaimContext.prompt``), else the head's
own template rendered on the question (the compound template it was trained
with). It needs no backend, samples or labels. Registered through the
``candor.claim_estimators`` entry point (pyproject.toml), so the claim
registry finds it without importing this stage; torch loads only with a head.

Not served: ``candor serve --claims elical-claims`` is refused (``servable``
False) until the engine pass hands the served answer's hidden states to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from candor.backends.base import Backend
from candor.estimators.claim_base import CLAIM_ESTIMATORS, ClaimContext, ClaimEstimator
from candor.util.errors import CandorError

NAME = "elical-claims"


@CLAIM_ESTIMATORS.register(NAME)
class EliCalClaims(ClaimEstimator):
    """One confidence per claim from a claim head's reading of the answer's hidden states."""

    name = NAME
    servable: ClassVar[bool] = False
    not_served_because: ClassVar[str] = (
        "the claim head reads the answer's hidden states, which the serving engine does not hand to claim "
        "estimators yet; score served records offline with `candor claims -e elical-claims --head DIR`"
    )

    def __init__(self, head: str | Path | Any = None, device: str | None = None, dtype: str | None = None) -> None:
        self.head_source = head
        self.device = device
        self.dtype = dtype
        self._head: Any = None

    @property
    def head(self) -> Any:
        """The loaded :class:`~candor.train.elical.claim_head.ClaimHead` (loaded on first use)."""
        if self._head is None:
            if self.head_source is None:
                raise CandorError(
                    "claim estimator 'elical-claims' needs a trained claim head: on the command line --head <folder>, "
                    "in Python head=<folder> (train one with `candor train elical-claims`)"
                )
            from candor.train.elical.claim_head import ClaimHead

            if isinstance(self.head_source, (str, Path)):
                self._head = ClaimHead.from_pretrained(self.head_source, device=self.device, dtype=self.dtype)
            elif isinstance(self.head_source, ClaimHead):
                self._head = self.head_source
            else:  # a loaded ConfidenceHead
                self._head = ClaimHead(self.head_source)
        return self._head

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if isinstance(self.head_source, (str, Path)):
            out["head"] = str(self.head_source)
        return out

    def _estimate(self, contexts: Sequence[ClaimContext], backend: Backend | None) -> list[np.ndarray]:
        head = self.head
        for ctx in contexts:
            if not ctx.answer.token_ids:
                raise CandorError(f"answer {ctx.id or '?'} has no token ids; the claim head reads the answer's tokens")
        rendered = head.prompts([c.question for c in contexts if not c.prompt])
        at = iter(rendered)
        prompts = [c.prompt or next(at) for c in contexts]
        return head.score(prompts, [c.answer.token_ids for c in contexts], [c.claims for c in contexts])
