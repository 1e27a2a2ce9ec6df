"""``elical``: question-level confidence from a trained EliCal head (docs/methods.md "EliCal").

The head reads each record's QA prompt (the template it was trained with) and
needs no answer, samples or backend: it loads its own backbone by the name it
saved. Give the head folder (or a loaded :class:`~candor.train.elical.ConfidenceHead`)::

    get_estimator("elical", head="heads/elical").estimate(records)

The head only means something for the model it was trained on: records whose
provenance names another model are refused (a :class:`CandorError` naming
both) unless ``allow_other_backbone=True`` (``-O elical.allow_other_backbone=1``),
which scores them with a warning. Records that name no model (an import) are
scored with a warning that the match cannot be checked.

``dtype="bfloat16"`` (``-O elical.dtype=bfloat16``) runs the backbone in bf16
when the estimator loads it: about half the cost on CPUs with AVX512-BF16 or
AMX, with confidences that drift by about 1e-3 from float32 (measured in
``benchmarks/elical_cost.py``). Opt-in on CPU; the default follows the loader
(float32 on CPU, bfloat16 on CUDA).

torch and transformers are imported only when a head is loaded, so importing
the estimator registry stays fast.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from candor.annotation.records import Record
from candor.backends.base import Backend
from candor.data.items import QAItem
from candor.estimators.base import ESTIMATORS, Estimator
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)


@ESTIMATORS.register("elical")
class EliCalEstimator(Estimator):
    """Scores records (or, through :meth:`score_questions`, raw questions) with a trained head."""

    name = "elical"
    level = "question"

    def __init__(
        self,
        head: str | Path | Any = None,
        batch_size: int = 16,
        device: str | None = None,
        allow_other_backbone: bool = False,
        dtype: str | None = None,
    ) -> None:
        self.head_source = head
        self.batch_size = batch_size
        self.device = device
        self.dtype = dtype
        self.allow_other_backbone = bool(allow_other_backbone)
        self._head: Any = None

    @property
    def head(self) -> Any:
        """The loaded :class:`~candor.train.elical.ConfidenceHead` (loaded on first use)."""
        if self._head is None:
            if self.head_source is None:
                raise CandorError(
                    "estimator 'elical' needs a trained head: on the command line -O elical.head=<folder>, "
                    "in Python head=<folder> (train one with `candor train elical`)"
                )
            if isinstance(self.head_source, (str, Path)):
                from candor.train.elical import ConfidenceHead

                self._head = ConfidenceHead.from_pretrained(self.head_source, device=self.device, dtype=self.dtype)
            else:
                self._head = self.head_source
            if self._head.config.meta.get("level") == "claim":  # candor.train.elical.claim_head.CLAIM_LEVEL
                raise CandorError(
                    f"estimator 'elical': {self.head_source} is a claim head (`candor train elical-claims`); score "
                    "claims with it (`candor claims -e elical-claims --head DIR`), or give a question head"
                )
        return self._head

    def backbone(self) -> str:
        """The model the head was trained on (read from its folder without loading it)."""
        if isinstance(self.head_source, (str, Path)):
            from candor.train.elical.model import HeadConfig

            return HeadConfig.read(Path(self.head_source)).backbone
        return str(self.head.config.backbone)

    def check_records(self, records: Sequence[Record]) -> None:
        """Refuse (or, when allowed, warn about) records annotated by a model other than the head's backbone."""
        backbone = self.backbone()
        models = {str(r.provenance["model"]) for r in records if r.provenance.get("model")}
        others = sorted(m for m in models if not same_model(m, backbone))
        unnamed = sum(not r.provenance.get("model") for r in records)
        if others and not self.allow_other_backbone:
            raise CandorError(
                f"elical: the head {self.head_source} was trained on {backbone!r}, but the records were annotated "
                f"by {', '.join(repr(m) for m in others)}; its confidences would be about another model's "
                "knowledge (pass -O elical.allow_other_backbone=1 to score them anyway)"
            )
        if others:
            logger.warning(
                "elical: head trained on %r scores records annotated by %s (allowed by option)",
                backbone,
                ", ".join(others),
            )
        if unnamed:
            logger.warning(
                "elical: %d records name no model in their provenance; cannot check that the head's "
                "backbone %r annotated them",
                unnamed,
                backbone,
            )

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        if self.head_source is not None:
            self.check_records(records)
        return self.head.predict(records, batch_size=self.batch_size)

    def score_questions(self, questions: Sequence[str | QAItem]) -> np.ndarray:
        """One confidence per question (a string, or a QA item with its conversation), before any answer exists."""
        if not questions:
            return np.zeros(0, dtype=float)
        return self._checked(np.asarray(self.head.predict(questions, batch_size=self.batch_size)), len(questions))

    def describe(self) -> dict[str, Any]:
        out = {**super().describe()}
        if isinstance(self.head_source, (str, Path)):
            out["head"] = str(self.head_source)
        out["allow_other_backbone"] = self.allow_other_backbone
        if self.dtype is not None:
            out["dtype"] = self.dtype
        return out


def same_weights(head_backbone: str, generator: str) -> bool:
    """Whether a head's backbone and a generator name one model (the embedded default by name or path)."""
    from candor.backends.default_model import is_embedded, resolve_embedded

    names = [str(resolve_embedded(n)) if is_embedded(n) else n for n in (head_backbone, generator)]
    return same_model(*names)


def same_model(a: str, b: str) -> bool:
    """Whether two model names denote one model: equal, or local paths to the same folder."""
    if a == b:
        return True
    pa, pb = Path(a), Path(b)
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()
