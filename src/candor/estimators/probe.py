"""``probe``: P(greedy answer correct) from a trained answer-level linear probe (:mod:`candor.answer_probe`).

Give the probe folder with ``-O probe.path=DIR``. The backend must be the
backbone the probe was trained on, since the probe reads its hidden states.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from candor.backends.base import Backend
from candor.errors import CandorError
from candor.estimators.base import ESTIMATORS, Estimator
from candor.records import Record


@ESTIMATORS.register("probe")
class AnswerProbeEstimator(Estimator):
    """The trained probe's probability that the greedy answer is correct."""

    name = "probe"
    level = "answer"
    needs_backend = True
    needs_hidden_states = True

    def __init__(self, path: str | Path | None = None) -> None:
        if path is None:
            raise CandorError("estimator 'probe' needs a trained probe: -O probe.path=DIR (`candor train probe`)")
        from candor.answer_probe import AnswerProbe

        self.path = Path(path)
        self.probe = AnswerProbe.load(self.path)

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        from candor.answer_probe import answer_features, backbone_name

        assert backend is not None  # checked by estimate()
        info = self.probe.info
        if backbone_name(backend) != info.backbone:
            raise CandorError(
                f"probe {self.path} was trained on {info.backbone!r} hidden states but the backend is "
                f"{backbone_name(backend)!r}; score with --model {info.backbone}"
            )
        features, template = answer_features(records, backend, info.layer)
        if template != info.template:
            raise CandorError(
                f"probe {self.path} was trained on {info.template!r} prompts but these records use {template!r}"
            )
        return self.probe.predict(features)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": str(self.path), "layer": self.probe.info.layer}
