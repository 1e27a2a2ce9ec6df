"""Numbers, intervals and tables as the READMEs print them, and reading one results file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from candor.evaluation.aggregate import is_biased

RESULTS = Path(__file__).resolve().parents[1] / "results"
DASH = "–"
METRIC_LABELS = {"auroc": "AUROC", "ece": "ECE", "alignment": "Alignment", "brier": "Brier"}
DATASET_NAMES = {
    "nq": "NQ",
    "hq": "HotpotQA",
    "2wikimultihopqa": "2Wiki",
    "pararel": "ParaRel",
    "squad": "SQuAD",
    "musique": "MuSiQue",
}

Json = dict[str, Any]
# A script run by its path (``python benchmarks/X.py``), as results files recorded it before the benchmarks
# became a package; ``\S*`` keeps an interpreter's folder (``.venv/bin/python``).
SCRIPT_BY_PATH = re.compile(r"(\S*python3?) benchmarks/(\w+)\.py\b")


def load(name: str, results: Path = RESULTS) -> Json:
    return json.loads((results / f"{name}.json").read_text(encoding="utf-8"))


def shown_command(recorded: str) -> str:
    """A command a results file recorded, as it runs now: ``python benchmarks/X.py`` is ``python -m benchmarks.X``.

    The files keep what was run; the READMEs show the command a reader can paste.
    """
    return SCRIPT_BY_PATH.sub(r"\1 -m benchmarks.\2", recorded)


def pct(x: float | None, digits: int = 1) -> str:
    """A fraction as ×100 with ``digits`` decimals; None as a dash."""
    return DASH if x is None else f"{100 * x:.{digits}f}"


def with_ci(x: float | None, ci: list[float | None] | None) -> str:
    """``75.6 [68, 82]``: the value ×100 and its interval rounded to whole points."""
    text = pct(x)
    if x is not None and ci and ci[0] is not None and ci[1] is not None:
        text += f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]"
    return text


# Rows on fewer items than this print no estimate (a 3-item "50.0 [50, 50]" says nothing), only the mark.
SMALL_N = 30
SMALL_MARK = "¹"
SMALL_NOTE = f"{SMALL_MARK} n < {SMALL_N}: too few items for an estimate; not printed."
LEGACY_MARK = "‡"
BIASED_NOTE = (
    "ECE (biased upwards on small samples: its resamples sit above it, so a percentile interval can exclude it): "
    "the bias-corrected estimate (2 × plug-in − mean of the resamples) [basic bootstrap interval]."
)
LEGACY_NOTE = (
    f"{LEGACY_MARK} the plug-in ECE alone: this results file holds only a percentile interval, which for a statistic "
    "biased like ECE can exclude its own estimate, so it is not printed; rerunning the benchmark gives the "
    "bias-corrected estimate and its interval."
)


def estimate(
    value: float | None,
    ci: list[float | None] | None,
    metric: str,
    *,
    corrected: float | None = None,
    n: int | None = None,
) -> str:
    """A metric's cell: ``with_ci`` for an unbiased one; for a biased one (ECE) the bias-corrected estimate with
    its basic interval (``corrected``), or the plug-in marked :data:`LEGACY_MARK` where the file has only a
    percentile interval; :data:`SMALL_MARK` alone on fewer than :data:`SMALL_N` items."""
    if n is not None and n < SMALL_N:
        return DASH + SMALL_MARK
    if not is_biased(metric) or value is None:
        return with_ci(value, ci)
    if corrected is not None:
        return with_ci(corrected, ci)
    return pct(value) + (LEGACY_MARK if ci and None not in ci else "")


def notes_for(cells: list[str], corrected: bool = False) -> str:
    """The footnotes the marks in ``cells`` need (empty when none), as lines under a table; ``corrected``: some
    cell holds a bias-corrected estimate."""
    notes = [BIASED_NOTE] if corrected else []
    if any(c.endswith(SMALL_MARK) or c.endswith(SMALL_MARK + "**") for c in cells):
        notes.append(SMALL_NOTE)
    if any(LEGACY_MARK in c for c in cells):
        notes.append(LEGACY_NOTE)
    return "".join(f"\n\n{n}" for n in notes)


def signed(x: float | None) -> str:
    """A difference ×100 with its sign, using a true minus sign."""
    if x is None:
        return DASH
    return "0.0" if round(100 * x, 1) == 0 else f"{100 * x:+.1f}".replace("-", "−")


def points(x: float) -> str:
    """A difference in whole points, signed (``+22``, ``−13``)."""
    return f"{round(100 * x):+d}".replace("-", "−")


def ratio(a: float, b: float) -> str:
    """``a / b`` as ``1.46×`` (two decimals, so 1.46 is not rounded to a flattering 1.5)."""
    return f"{a / b:.2f}×"


def gib(mib: float) -> str:
    return f"{mib / 1024:.2f} GiB"


def md_table(header: list[str], aligns: str, rows: list[list[str]]) -> str:
    """A Markdown table; ``aligns`` has one character per column: ``l`` or ``r``."""
    rule = "|" + "|".join("---" if a == "l" else "---:" for a in aligns) + "|"
    return "\n".join(["| " + " | ".join(header) + " |", rule, *("| " + " | ".join(r) + " |" for r in rows)])


def bold_best(rows: list[list[str]], column: int, values: list[float | None], lower: bool) -> None:
    """Bold the cell(s) of ``column`` holding the best value at display precision."""
    shown = [None if v is None else round(100 * v, 1) for v in values]
    finite = [v for v in shown if v is not None]
    if len(finite) < 2:
        return
    best = min(finite) if lower else max(finite)
    for row, v in zip(rows, shown, strict=True):
        if v == best:
            row[column] = f"**{row[column]}**"
