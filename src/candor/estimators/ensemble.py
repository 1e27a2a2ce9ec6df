"""``ensemble``: named estimators' confidences combined by logistic stacking fitted on dev records.

See docs/methods.md "Ensembles and debiasing". Like uqlm's tuned ensemble, the
combination is learned on labelled dev records, never on the records scored::

    candor score -r test.jsonl -o conf.jsonl -e ensemble \\
        -O ensemble.members=n-prob,consis-lex,length -O ensemble.dev=dev.jsonl \\
        -O ensemble.length.dev=dev.jsonl

``members`` (comma-separated) and ``dev`` (a records JSONL with greedy
correctness, sharing no question with the records scored: one shared question is
an error) are required; a member's own options are given as
``ensemble.<member>.<key>=value``. Every option, the members' included, and the
dev file's content key the cached column. The fit (:mod:`~candor.estimators.stacking`)
standardizes each member's dev confidences; the weights (per dev standard
deviation) and the intercept are logged and stored in :meth:`Ensemble.describe`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from candor.annotation.contamination import refuse_dev_overlap
from candor.annotation.records import Record, read_records
from candor.backends.base import Backend
from candor.estimators.base import ESTIMATORS, Estimator, get_estimator
from candor.estimators.stacking import LogisticFit, fit_logistic
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)


def member_names(members: str | Sequence[str] | None) -> list[str]:
    """``"a, b,c"`` → ``["a", "b", "c"]``; at least two distinct members, none of them ``ensemble``."""
    if members is None:
        raise CandorError("ensemble needs its members: -O ensemble.members=a,b,c (two or more estimators)")
    names = [n.strip() for n in (members.split(",") if isinstance(members, str) else members) if n.strip()]
    if len(set(names)) < 2 or len(set(names)) != len(names):
        raise CandorError(
            f"ensemble.members={members!r}: name two or more different estimators, e.g. n-prob,consis-lex"
        )
    if "ensemble" in names:
        raise CandorError("ensemble.members: an ensemble cannot contain an ensemble")
    return names


def member_options(names: Sequence[str], options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"length.dev": f}`` → ``{"length": {"dev": f}}``; an option for no member is an error."""
    out: dict[str, dict[str, Any]] = {name: {} for name in names}
    for key, value in options.items():
        member, dot, field = key.partition(".")
        if not dot or member not in out or not field:
            raise CandorError(
                f"ensemble: unknown option {key!r}; a member's option is <member>.<key> with the "
                f"member among ensemble.members ({', '.join(names)})"
            )
        out[member][field] = value
    return out


@ESTIMATORS.register("ensemble")
class Ensemble(Estimator):
    """Logistic stacking of ``members``' confidences, fitted on ``dev`` (see the module docstring)."""

    name = "ensemble"

    def __init__(
        self,
        members: str | Sequence[str] | None = None,
        dev: str | Path | Sequence[Record] | None = None,
        **options: Any,
    ) -> None:
        names = member_names(members)
        if dev is None:
            raise CandorError(
                "ensemble is fitted on labelled dev records: pass -O ensemble.dev=FILE "
                "(a records JSONL that is not the one being scored)"
            )
        self.dev = read_records(dev) if isinstance(dev, (str, Path)) else list(dev)
        self.dev_source = f"ensemble.dev ({dev})" if isinstance(dev, (str, Path)) else "ensemble.dev"
        self.members = [(n, get_estimator(n, **o)) for n, o in member_options(names, options).items()]
        estimators = [est for _, est in self.members]
        self.needs_backend = any(e.needs_backend for e in estimators)
        self.needs_hidden_states = any(e.needs_hidden_states for e in estimators)
        self.requires = frozenset().union(*(e.requires for e in estimators))
        self.level = "answer" if any(e.level == "answer" for e in estimators) else "question"
        self.min_samples = max(e.min_samples for e in estimators)  # type: ignore[misc]
        self.default_samples = max(e.default_samples for e in estimators)  # type: ignore[misc]
        self.fit: LogisticFit | None = None

    def _features(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        return np.column_stack([est.estimate(records, backend) for _, est in self.members])

    def fitted(self, backend: Backend | None = None) -> LogisticFit:
        """The stacking fit on the dev records (made on first use: members may need the backend)."""
        if self.fit is None:
            labelled = [r for r in self.dev if r.greedy_correct is not None]
            y = np.array([int(r.greedy_correct) for r in labelled], dtype=int)  # type: ignore[arg-type]
            self.fit = fit_logistic(self._features(labelled, backend), y, "ensemble")
            logger.info("ensemble fitted on %d dev records: %s", len(labelled), self.weights())
        return self.fit

    def weights(self) -> dict[str, float]:
        """Each member's weight per dev standard deviation, and the ``intercept`` (empty before the fit)."""
        if self.fit is None:
            return {}
        out = {name: round(float(w), 4) for (name, _), w in zip(self.members, self.fit.coef, strict=True)}
        return {**out, "intercept": round(self.fit.intercept, 4)}

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        refuse_dev_overlap((r.item.question for r in self.dev), self.dev_source, (r.item.question for r in records))
        fit = self.fitted(backend)
        return fit.predict(self._features(records, backend))

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "members": {n: est.describe() for n, est in self.members},
            "dev_size": len(self.dev),
            "weights": self.weights(),
        }
