"""The deployment: the operator's options that shape answers, carried by every model a server runs.

``candor serve --threshold 0.3 --claims claim-prob`` says how this deployment answers,
whatever folder it serves. A :class:`Deployment` holds those options and
:meth:`Deployment.apply` is the one place they are put on a model: on the first one at
startup and on every successor a reload loads (:meth:`Deployment.successor`), so a
reload changes the folder and never the operator's choices.

The version a deployed model answers under names both: the folder's version, and,
when the deployment overrides anything, ``+opts.`` and a short digest of its options
(``20260601T120000Z-3f9a2b+opts.1c2d3e4f``). A reload of a new folder changes the
first part; a restart with other options changes the second.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from candor.serve.claim_answers import ClaimPolicy
from candor.serve.factory import check_threshold
from candor.serve.honest_folder import read_config
from candor.serve.model import HonestModel
from candor.serve.thresholds import Threshold
from candor.util.errors import CandorError

DIGEST_HEX = 8  # hex digits of the options digest in a version


def claim_options(policy: ClaimPolicy) -> dict[str, Any]:
    """A claim policy's fields, the claim head among them when one is given (``--claim-head``, its folder)."""
    return {name: value for name, value in asdict(policy).items() if name != "head" or value is not None}


@dataclass(frozen=True)
class Deployment:
    """What the operator chose for every model this server answers with (None: the model's own, as built or saved)."""

    threshold: float | None = None  # abstain below this confidence, whatever the folder's threshold
    claims: ClaimPolicy | None = None  # a confidence per claim (--claims, --refine, --claim-threshold, --claim-head)
    max_new_tokens: int | None = None  # the answer's length cap when a request names none

    def __post_init__(self) -> None:
        check_threshold(self.threshold)
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise CandorError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")

    def options(self) -> dict[str, Any]:
        """The options this deployment sets (those left to the folder are absent)."""
        chosen: dict[str, Any] = {
            "threshold": self.threshold,
            "claims": None if self.claims is None else claim_options(self.claims),
            "max_new_tokens": self.max_new_tokens,
        }
        return {name: value for name, value in chosen.items() if value is not None}

    @property
    def digest(self) -> str:
        """A short digest of :meth:`options` ("" when the deployment sets none)."""
        options = self.options()
        if not options:
            return ""
        canonical = json.dumps(options, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_HEX]

    def version(self, folder_version: str) -> str:
        """The version a model saved as ``folder_version`` answers under in this deployment."""
        return f"{folder_version}+opts.{self.digest}" if self.digest else folder_version

    def apply(self, model: HonestModel) -> HonestModel:
        """Put the deployment's options on ``model`` (as loaded or built, not yet serving) and name its version."""
        if self.threshold is not None:
            model.threshold = Threshold(self.threshold)
        if self.max_new_tokens is not None:
            model.decoding = replace(model.decoding, max_new_tokens=self.max_new_tokens)
        if self.claims is not None:
            model.serve_claims(self.claims)
        model.version = self.version(model.version)
        return model

    def successor(self, folder: Path, current: HonestModel, **backend_kwargs: Any) -> HonestModel:
        """The honest model saved in ``folder``, with this deployment's options.

        It keeps the current generator when the folder names the same one (model, backend, no
        adapter on either side), so a reload of a new head loads no second model.
        """
        generator = read_config(folder)["generator"]
        same = (
            generator.get("model") == current.backend.model_name
            and not generator.get("adapter")
            and not getattr(current.backend, "adapter", None)
            and generator.get("backend", "hf") == current.backend_name
        )
        if same:
            loaded = HonestModel.from_pretrained(folder, backend=current.backend)
        else:
            loaded = HonestModel.from_pretrained(folder, **backend_kwargs)
        return self.apply(loaded)
