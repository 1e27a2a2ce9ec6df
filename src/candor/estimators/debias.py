"""``<method>.debias=length``: a confidence with what answer length explains taken out.

See docs/methods.md "Ensembles and debiasing". With an LLM judge, answer length
alone ranks answers about as well as semantic entropy (arXiv 2508.08285), and
length leaks into most estimators. As Uncertainty-LINE does, the score ``s`` is
regressed on the greedy answer's length ``n`` (tokens) over the dev records,
``s ≈ a + b·n`` by least squares, and the residual ``s − (a + b·n)`` is kept;
a logistic calibrator fitted on the dev residuals against the dev labels maps
it back to [0, 1] (:mod:`~candor.estimators.stacking`). Both fits use the
dev records only (``debias_dev``, a records JSONL), never the ones scored (a dev
file that shares a question with them is refused)::

    candor score -r test.jsonl -o conf.jsonl -e n-prob -O n-prob.debias=length -O n-prob.debias_dev=dev.jsonl

Any estimator takes the two options (:data:`~candor.estimators.base.WRAPPERS`);
the wrapped estimator keeps its name and needs, and the options key its cached column.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from candor.annotation.contamination import refuse_dev_overlap
from candor.annotation.records import Record, read_records
from candor.backends.base import Backend
from candor.estimators.base import WRAPPERS, Estimator, OptionWrapper
from candor.estimators.length import answer_length
from candor.estimators.stacking import LogisticFit, fit_logistic
from candor.util.errors import CandorError
from candor.util.registry import Registry

logger = logging.getLogger(__name__)

Covariate = Callable[[Record], float]
COVARIATES: Registry[Covariate] = Registry("debias covariate")
COVARIATES.register("length")(answer_length)


class Debiased(Estimator):
    """``inner``'s confidence with the part a covariate (answer length) explains removed, recalibrated on dev."""

    def __init__(self, inner: Estimator, covariate: str, dev: Sequence[Record], dev_source: str | None = None) -> None:
        self.inner = inner
        self.dev_source = f"{inner.name}.debias_dev" + (f" ({dev_source})" if dev_source else "")
        self.covariate_name = covariate
        self.covariate = COVARIATES.get(covariate)
        self.dev = [r for r in dev if r.greedy_correct is not None]
        self.name = inner.name
        self.level = inner.level
        self.needs_backend = inner.needs_backend
        self.needs_hidden_states = inner.needs_hidden_states
        self.requires = inner.requires
        self.min_samples = inner.min_samples  # type: ignore[misc]
        self.default_samples = inner.default_samples  # type: ignore[misc]
        self.line: tuple[float, float] | None = None  # (a, b) of s ≈ a + b·n
        self.calibrator: LogisticFit | None = None

    def _values(self, records: Sequence[Record]) -> np.ndarray:
        return np.array([self.covariate(r) for r in records], dtype=float)

    def residuals(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        """``s − (a + b·n)`` for ``records`` (fits on dev first; refuses records that share a question with dev)."""
        refuse_dev_overlap((r.item.question for r in self.dev), self.dev_source, (r.item.question for r in records))
        self._fit(backend)
        a, b = self.line  # type: ignore[misc]
        return self.inner.estimate(records, backend) - (a + b * self._values(records))

    def _fit(self, backend: Backend | None) -> None:
        if self.line is not None:
            return
        if len(self.dev) < 3:
            raise CandorError(f"{self.name}.debias: needs at least 3 labelled dev records, got {len(self.dev)}")
        scores = self.inner.estimate(self.dev, backend)
        n = self._values(self.dev)
        b, a = np.polyfit(n, scores, 1) if np.ptp(n) > 0 else (0.0, float(scores.mean()))
        self.line = (float(a), float(b))
        residual = scores - (a + b * n)
        y = np.array([int(r.greedy_correct) for r in self.dev], dtype=int)  # type: ignore[arg-type]
        self.calibrator = fit_logistic(residual[:, None], y, f"{self.name}.debias")
        logger.info(
            "%s.debias=%s: score ≈ %.4g + %.4g·%s on %d dev records",
            self.name,
            self.covariate_name,
            a,
            b,
            self.covariate_name,
            len(self.dev),
        )

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        residual = self.residuals(records, backend)
        return self.calibrator.predict(residual[:, None])  # type: ignore[union-attr]

    def describe(self) -> dict[str, Any]:
        fit = {} if self.line is None else {"intercept": round(self.line[0], 6), "slope": round(self.line[1], 6)}
        return {**self.inner.describe(), "debias": {"covariate": self.covariate_name, "dev_size": len(self.dev), **fit}}


def wrap(estimator: Estimator, options: dict[str, Any]) -> Estimator:
    """Apply ``debias``/``debias_dev`` (both required together) to ``estimator``."""
    covariate, dev = options.get("debias"), options.get("debias_dev")
    if covariate is None:
        raise CandorError(f"{estimator.name}.debias_dev is given without {estimator.name}.debias=length")
    if dev is None:
        raise CandorError(
            f"{estimator.name}.debias={covariate} is fitted on labelled dev records: pass "
            f"-O {estimator.name}.debias_dev=FILE (a records JSONL that is not the one being scored)"
        )
    COVARIATES.get(str(covariate))  # an unknown covariate fails here, naming the known ones
    records = read_records(dev) if isinstance(dev, (str, Path)) else list(dev)
    return Debiased(estimator, str(covariate), records, str(dev) if isinstance(dev, (str, Path)) else None)


WRAPPERS.register("debias")(OptionWrapper(("debias", "debias_dev"), wrap))
