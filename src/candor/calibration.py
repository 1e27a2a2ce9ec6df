"""Post-hoc calibration of confidences files: fit on dev, apply to test (``candor calibrate``).

Each method column of the dev file fits one calibrator; the test file gains a
column ``<method>+<calibrator>`` with the calibrated values. Dev and test must
not share record ids: a calibrator fitted on the rows it is evaluated on would
report a calibration it does not have.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from candor.calibrators import Calibrator, get_calibrator, save_calibrator
from candor.confidences import ConfidenceTable
from candor.errors import CandorError

logger = logging.getLogger(__name__)


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
