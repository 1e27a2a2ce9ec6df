"""Post-hoc calibration: calibrators, and calibrating a confidences file (``candor calibrate``).

A calibrator is a map from confidence to confidence, fitted on a dev split.
They feel like scikit-learn estimators::

    cal = get_calibrator("isotonic").fit(dev_conf, dev_correct)
    test_conf = cal.predict(raw_test_conf)

``fit`` returns the calibrator; ``predict`` returns floats in [0, 1]. Calling
``predict`` before ``fit`` raises :class:`CandorError`. A fitted calibrator is
saved as plain JSON with :func:`save_calibrator` and read back with
:func:`load_calibrator` (no pickles: a calibrator file is safe to share).

:func:`calibrate_tables` applies them to confidences files: each method column
of the dev file fits one calibrator, and the test file gains a column
``<method>+<calibrator>`` with the calibrated values. Dev and test must not
share record ids: a calibrator fitted on the rows it is evaluated on would
report a calibration it does not have.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
from numpy.typing import ArrayLike

from candor.estimators.confidences import ConfidenceTable
from candor.evaluation.metrics import bin_indices, check_arrays, check_confidence
from candor.util.errors import CandorError
from candor.util.files import atomic_write_json
from candor.util.registry import Registry

logger = logging.getLogger(__name__)


CALIBRATORS: Registry[type] = Registry("calibrator")

# Confidences are clipped away from 0 and 1 before taking logits, so 0 and 1 stay finite.
LOGIT_EPS = 1e-6


def logit(confidence: np.ndarray) -> np.ndarray:
    p = np.clip(confidence, LOGIT_EPS, 1.0 - LOGIT_EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # the tanh form never overflows


class Calibrator:
    """Base class: input checks and the fitted-or-not guard."""

    name = ""

    def __init__(self) -> None:
        self._fitted = False

    def fit(self, confidence: ArrayLike, correct: ArrayLike) -> Self:
        conf, y = check_arrays(confidence, correct)
        self._fit(conf, y)
        self._fitted = True
        return self

    def predict(self, confidence: ArrayLike) -> np.ndarray:
        if not self._fitted:
            raise CandorError(f"{self.name} calibrator: call fit(confidence, correct) before predict")
        conf = check_confidence(confidence)
        return np.clip(self._predict(conf), 0.0, 1.0)

    def fit_predict(self, confidence: ArrayLike, correct: ArrayLike) -> np.ndarray:
        return self.fit(confidence, correct).predict(confidence)

    def to_dict(self) -> dict[str, Any]:
        """Name, constructor settings and fitted state, as JSON-ready values."""
        if not self._fitted:
            raise CandorError(f"{self.name} calibrator: fit it before saving")
        return {"name": self.name, "settings": self._settings(), "state": self._state()}

    def _settings(self) -> dict[str, Any]:
        return {}

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _fit(self, conf: np.ndarray, y: np.ndarray) -> None:
        raise NotImplementedError

    def _predict(self, conf: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _need_both_classes(self, y: np.ndarray) -> None:
        if y.min() == y.max():
            raise CandorError(
                f"{self.name} calibrator needs both correct and wrong examples; all {y.size} are {int(y[0])}"
            )


@CALIBRATORS.register("platt")
class PlattCalibrator(Calibrator):
    """Logistic regression on logit(confidence): sigmoid(a·logit(c) + b).

    ``C`` is scikit-learn's inverse L2 strength; the large default is nearly
    unpenalized (classic Platt) yet keeps a perfectly separable dev set finite.
    """

    name = "platt"

    def __init__(self, C: float = 1e4) -> None:
        super().__init__()
        self.C = C
        from sklearn.linear_model import LogisticRegression  # lazy: sklearn costs seconds to import

        self.model = LogisticRegression(C=C)

        self.slope_, self.intercept_ = 1.0, 0.0

    def _fit(self, conf: np.ndarray, y: np.ndarray) -> None:
        self._need_both_classes(y)
        self.model.fit(logit(conf)[:, None], y)
        self.slope_, self.intercept_ = float(self.model.coef_[0, 0]), float(self.model.intercept_[0])

    def _predict(self, conf: np.ndarray) -> np.ndarray:
        return sigmoid(self.slope_ * logit(conf) + self.intercept_)

    def _settings(self) -> dict[str, Any]:
        return {"C": self.C}

    def _state(self) -> dict[str, Any]:
        return {"slope": self.slope_, "intercept": self.intercept_}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.slope_, self.intercept_ = float(state["slope"]), float(state["intercept"])


@CALIBRATORS.register("isotonic")
class IsotonicCalibrator(Calibrator):
    """Monotone step fit (scikit-learn); inputs outside the fitted range are clipped to it."""

    name = "isotonic"

    def __init__(self) -> None:
        super().__init__()
        from sklearn.isotonic import IsotonicRegression  # lazy: sklearn costs seconds to import

        self.model = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")

        self.knots_x_ = np.array([0.0, 1.0])
        self.knots_y_ = np.array([0.0, 1.0])

    def _fit(self, conf: np.ndarray, y: np.ndarray) -> None:
        self.model.fit(conf, y.astype(float))
        self.knots_x_ = np.asarray(self.model.X_thresholds_, dtype=float)
        self.knots_y_ = np.asarray(self.model.y_thresholds_, dtype=float)

    def _predict(self, conf: np.ndarray) -> np.ndarray:
        # scikit-learn's isotonic prediction is linear interpolation between its knots, clipped at the ends.
        return np.interp(conf, self.knots_x_, self.knots_y_)

    def _state(self) -> dict[str, Any]:
        return {"knots_x": self.knots_x_.tolist(), "knots_y": self.knots_y_.tolist()}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.knots_x_ = np.asarray(state["knots_x"], dtype=float)
        self.knots_y_ = np.asarray(state["knots_y"], dtype=float)


@CALIBRATORS.register("temperature")
class TemperatureCalibrator(Calibrator):
    """sigmoid(logit(c) / T) with the single T that minimizes the dev NLL.

    T > 1 softens over-confident scores, T < 1 sharpens under-confident ones.
    T is searched on a log scale within [``t_min``, ``t_max``].
    """

    name = "temperature"

    def __init__(self, t_min: float = 0.01, t_max: float = 100.0) -> None:
        super().__init__()
        if not 0.0 < t_min < t_max:
            raise CandorError(f"temperature bounds must satisfy 0 < t_min < t_max, got {t_min}, {t_max}")
        self.t_min, self.t_max = t_min, t_max
        self.temperature_: float = 1.0

    def _fit(self, conf: np.ndarray, y: np.ndarray) -> None:
        self._need_both_classes(y)
        z = logit(conf)
        sign = 2.0 * y - 1.0

        def nll(log_t: float) -> float:
            # -log sigmoid(±z/T), written with logaddexp so it never overflows
            return float(np.mean(np.logaddexp(0.0, -sign * z / np.exp(log_t))))

        from scipy.optimize import minimize_scalar  # lazy: scipy.optimize costs seconds to import

        res = minimize_scalar(
            nll, bounds=(np.log(self.t_min), np.log(self.t_max)), method="bounded", options={"xatol": 1e-6}
        )
        self.temperature_ = float(np.exp(res.x))

    def _predict(self, conf: np.ndarray) -> np.ndarray:
        return sigmoid(logit(conf) / self.temperature_)

    def _settings(self) -> dict[str, Any]:
        return {"t_min": self.t_min, "t_max": self.t_max}

    def _state(self) -> dict[str, Any]:
        return {"temperature": self.temperature_}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.temperature_ = float(state["temperature"])


@CALIBRATORS.register("histogram")
class HistogramCalibrator(Calibrator):
    """Histogram binning: each equal-width bin maps to its dev accuracy.

    A bin with no dev examples has no evidence, so it maps to its own centre
    (``empty="centre"``, the default: leave such confidences roughly as they
    are) or to the overall dev accuracy (``empty="global"``).
    """

    name = "histogram"
    EMPTY_RULES = ("centre", "global")

    def __init__(self, n_bins: int = 10, empty: str = "centre") -> None:
        super().__init__()
        if n_bins < 1:
            raise CandorError(f"histogram calibrator needs n_bins ≥ 1, got {n_bins}")
        if empty not in self.EMPTY_RULES:
            known = ", ".join(self.EMPTY_RULES)
            raise CandorError(f"histogram calibrator: unknown empty-bin rule {empty!r}; known: {known}")
        self.n_bins, self.empty = n_bins, empty
        self.bin_values_ = np.zeros(n_bins)

    def _fit(self, conf: np.ndarray, y: np.ndarray) -> None:
        idx = bin_indices(conf, self.n_bins)
        counts = np.bincount(idx, minlength=self.n_bins)
        hits = np.bincount(idx, weights=y.astype(float), minlength=self.n_bins)
        if self.empty == "centre":
            fallback = (np.arange(self.n_bins) + 0.5) / self.n_bins
        else:
            fallback = np.full(self.n_bins, y.mean())
        self.bin_values_ = np.where(counts > 0, hits / np.maximum(counts, 1), fallback)

    def _predict(self, conf: np.ndarray) -> np.ndarray:
        return self.bin_values_[bin_indices(conf, self.n_bins)]

    def _settings(self) -> dict[str, Any]:
        return {"n_bins": self.n_bins, "empty": self.empty}

    def _state(self) -> dict[str, Any]:
        return {"bin_values": self.bin_values_.tolist()}

    def _load_state(self, state: dict[str, Any]) -> None:
        values = np.asarray(state["bin_values"], dtype=float)
        if values.shape != (self.n_bins,):
            raise CandorError(f"histogram calibrator: {values.size} bin values for {self.n_bins} bins")
        self.bin_values_ = values


def get_calibrator(name: str, **kwargs: Any) -> Calibrator:
    """Build a registered calibrator, e.g. ``get_calibrator("histogram", n_bins=15)``."""
    return CALIBRATORS.build(name, **kwargs)


def calibrator_from_dict(payload: dict[str, Any]) -> Calibrator:
    """Rebuild a fitted calibrator from :meth:`Calibrator.to_dict`."""
    try:
        cal = get_calibrator(payload["name"], **payload.get("settings", {}))
        cal._load_state(payload["state"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CandorError(f"not a saved calibrator: missing or bad field {exc}") from None
    cal._fitted = True
    return cal


def save_calibrator(path: str | Path, cal: Calibrator, **extra: Any) -> Path:
    """Write a fitted calibrator (and any ``extra`` provenance) as JSON, atomically."""
    return atomic_write_json(path, {**cal.to_dict(), **extra})


def load_calibrator(path: str | Path) -> Calibrator:
    path = Path(path)
    if not path.exists():
        raise CandorError(f"{path}: no such calibrator file")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CandorError(f"{path}: malformed JSON ({exc.msg})") from None
    try:
        return calibrator_from_dict(payload)
    except CandorError as exc:
        raise CandorError(f"{path}: {exc}") from None


@dataclass
class CalibrationResult:
    """The calibrated test table and, per method, the fitted calibrator and its new column name."""

    table: ConfidenceTable
    calibrators: dict[str, Calibrator]
    columns: dict[str, str]


def calibrated_column(method: str, calibrator: str) -> str:
    return f"{method}+{calibrator}"


def check_disjoint_ids(dev: ConfidenceTable, test: ConfidenceTable) -> None:
    shared = sorted({r.id for r in dev.rows} & {r.id for r in test.rows})
    if shared:
        raise CandorError(
            f"dev and test share {len(shared)} record ids (e.g. {shared[0]!r}): fit the calibrator on held-out rows"
        )


def calibrate_tables(
    dev: ConfidenceTable,
    test: ConfidenceTable,
    methods: Sequence[str],
    calibrator: str = "isotonic",
    **settings: Any,
) -> CalibrationResult:
    """Fit one ``calibrator`` per method on ``dev`` and add its calibrated column to ``test``."""
    check_disjoint_ids(dev, test)
    if not methods:
        raise CandorError("no method to calibrate: name one or more columns of the dev file")
    fitted: dict[str, Calibrator] = {}
    columns: dict[str, str] = {}
    for method in methods:
        for table, what in ((dev, "dev"), (test, "test")):
            if method not in table.methods:
                raise CandorError(f"method {method!r} is not a column of the {what} file; it has {table.methods}")
        dev_conf, dev_correct = dev.arrays(method)
        cal = get_calibrator(calibrator, **settings).fit(dev_conf, dev_correct)
        rows = [r for r in test.rows if method in r.confidence]
        column = calibrated_column(method, calibrator)
        test.add(column, [r.id for r in rows], cal.predict([r.confidence[method] for r in rows]))
        fitted[method], columns[method] = cal, column
        logger.info("%s: %s calibrator fitted on %d dev rows -> column %s", method, calibrator, dev_conf.size, column)
    return CalibrationResult(test, fitted, columns)


def save_calibrators(folder: str | Path, result: CalibrationResult, dev_path: str | Path) -> list[Path]:
    """One JSON file per method, with the dev file it was fitted on."""
    folder = Path(folder)
    return [
        save_calibrator(folder / f"{column}.json", result.calibrators[method], method=method, fitted_on=str(dev_path))
        for method, column in result.columns.items()
    ]
