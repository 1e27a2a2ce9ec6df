"""``elical-claims``: claim confidences from a trained EliCal claim head (docs/claims.md "A trained claim head").

    candor claims -r records.jsonl -o out -e elical-claims --claim-head heads/claims
    candor serve --claims elical-claims --claim-head heads/claims
    get_claim_estimator("elical-claims", head="heads/claims")

Offline, the head (:mod:`candor.train.elical.claim_head`) loads its own
backbone by the name it saved and reads each answer's token ids after its
prompt: the exact prompt when the caller gives one (``ClaimContext.prompt``),
else the head's own template rendered on the question (the compound template
it was trained with). It needs no backend, samples or labels.

Served (:meth:`EliCalClaims.serve_on`), it loads no backbone: the head's
linear layer reads the served model's own pass over the served prompt's token
ids and the answer's generated ids (:class:`~candor.train.elical.claim_head.ServedClaimHead`,
the backend's :data:`~candor.backends.base.TOKEN_STATES`). That is refused
unless the served weights are the head's backbone, with no adapter.

Registered through the ``candor.claim_estimators`` entry point (pyproject.toml),
so the claim registry finds it without importing this stage; torch loads only
with a head.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from candor.backends.base import TOKEN_STATES, Backend, absolute_layer, backend_capabilities
from candor.estimators.claim_base import CLAIM_ESTIMATORS, ClaimContext, ClaimEstimator, ServedClaims
from candor.util.errors import CandorError

NAME = "elical-claims"


@CLAIM_ESTIMATORS.register(NAME)
class EliCalClaims(ClaimEstimator):
    """One confidence per claim from a claim head's reading of the answer's hidden states."""

    name = NAME
    reads_claim_head: ClassVar[bool] = True

    def __init__(self, head: str | Path | Any = None, device: str | None = None, dtype: str | None = None) -> None:
        self.head_source = head
        self.device = device
        self.dtype = dtype
        self._head: Any = None
        self._served: tuple[Backend, Any] | None = None  # the served backend and the head on its pass

    @property
    def head(self) -> Any:
        """The loaded :class:`~candor.train.elical.claim_head.ClaimHead` (loaded on first use)."""
        if self._head is None:
            self._needs_head()
            from candor.train.elical.claim_head import ClaimHead

            if isinstance(self.head_source, (str, Path)):
                self._head = ClaimHead.from_pretrained(self.head_source, device=self.device, dtype=self.dtype)
            elif isinstance(self.head_source, ClaimHead):
                self._head = self.head_source
            else:  # a loaded ConfidenceHead
                self._head = ClaimHead(self.head_source)
        return self._head

    def _needs_head(self) -> None:
        if self.head_source is None:
            raise CandorError(
                "claim estimator 'elical-claims' needs a trained claim head: on the command line --claim-head "
                "<folder>, in Python head=<folder> (train one with `candor train elical-claims`)"
            )

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if isinstance(self.head_source, (str, Path)):
            out["head"] = str(self.head_source)
        return out

    def serve_on(self, backend: Backend, template: str) -> ServedClaims:
        """Read the head from the served model's own pass over each answer; refused unless that model holds the
        head's backbone weights (no adapter) and can hand over its hidden states over given token ids."""
        from candor.train.elical.claim_head import ClaimHead, ServedClaimHead
        from candor.train.elical.estimator import same_weights

        self._needs_head()
        source = self.head_source
        if isinstance(source, (str, Path)):
            served = ServedClaimHead.from_folder(source)
        else:
            loaded = source.head if isinstance(source, ClaimHead) else source
            served = ServedClaimHead(loaded.config, loaded.head)
        config, generator = served.config, str(backend.model_name)
        adapter = getattr(backend, "adapter", None)
        if not same_weights(config.backbone, generator) or adapter:
            raise CandorError(
                f"--claims {NAME}: the claim head's backbone {config.backbone!r} is not the served weights "
                f"({generator!r}{' with an adapter' if adapter else ''}); the head reads the served model's own "
                "hidden states, so serve the model it was trained on, or train a claim head on this one"
            )
        depth = getattr(backend, "num_hidden_layers", None)
        if TOKEN_STATES not in backend_capabilities(backend) or depth is None:
            raise CandorError(
                f"--claims {NAME}: the {type(backend).__name__} backend cannot hand over its hidden states over "
                f"given token ids ({TOKEN_STATES}); serve it with the hf backend"
            )
        layer = absolute_layer(config.layer, int(depth))
        self._served = (backend, served)
        stages = (config.meta or {}).get("stages", [])
        if "cal" not in stages:
            calibrated_on, said = None, "the head had no stage 2 on labels, so its values are not calibrated"
        elif config.template != template:
            calibrated_on = None
            said = (
                f"the head was trained on the {config.template!r} template but the served prompt is {template!r}: "
                "its values are scores, not calibrated probabilities, for these answers"
            )
        else:
            calibrated_on = f"claims of answers to questions asked alone with the {template!r} template"
            said = f"the served template {template!r} is the head's: values on questions asked alone are calibrated"
        path = (
            f"{NAME} reads the served model's own pass over the served prompt's and the answer's token ids "
            f"(layer {layer}, {served.pooling} pooling, the forward stopped at that layer): no second backbone; {said}"
        )
        unlike = None
        if config.template != template:
            unlike = (
                f"`candor claims -e {NAME}` reads the head's own {config.template!r} template, the served prompt "
                f"is {template!r}"
            )
        return ServedClaims(path, calibrated_on, unlike)

    def _estimate(self, contexts: Sequence[ClaimContext], backend: Backend | None) -> list[np.ndarray]:
        for ctx in contexts:
            if not ctx.answer.token_ids:
                raise CandorError(f"answer {ctx.id or '?'} has no token ids; the claim head reads the answer's tokens")
        answers, claims = [c.answer.token_ids for c in contexts], [c.claims for c in contexts]
        if self._served is not None and backend is self._served[0]:
            if any(not c.prompt for c in contexts):
                raise CandorError(f"{NAME} on the served model reads the answer's exact prompt; none was given")
            return self._served[1].score(backend, [c.prompt for c in contexts], answers, claims)
        head = self.head
        rendered = head.prompts([c.question for c in contexts if not c.prompt])
        at = iter(rendered)
        prompts = [c.prompt or next(at) for c in contexts]
        return head.score(prompts, answers, claims)
