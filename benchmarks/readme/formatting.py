"""Numbers, intervals and tables as the READMEs print them, and reading one results file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

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
