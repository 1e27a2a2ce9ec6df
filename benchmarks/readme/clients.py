"""docs/serving.md's compatibility matrix: what each client shows, from tests/test_client_matrix.py's results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .formatting import DASH, load, md_table


def _shown(cell: dict[str, Any], answer: str) -> str:
    """One cell: the text the user sees (or the exception raised) and the finish reason."""
    if cell.get("exception"):
        return f"raises `{cell['exception']}`"
    shown = cell.get("shown")
    text = "the answer" if shown == answer else ("**empty**" if not shown else f'"{shown}"')
    finish = cell.get("finish_reason")
    return f"{text} · `{finish}`" if finish else text


def _cell(cells: list[dict[str, Any]], case: str, abstain_as: str, mode: str) -> dict[str, Any]:
    return next(c for c in cells if (c["case"], c["abstain_as"], c["mode"]) == (case, abstain_as, mode))


def _reached(cells: list[dict[str, Any]], mode: str) -> str:
    """Whether the documented line reached the confidence in every cell of this mode."""
    mine = [c for c in cells if c["mode"] == mode]
    reached = sum(c.get("confidence") is not None for c in mine if not c.get("exception"))
    answered = sum(not c.get("exception") for c in mine)
    return f"{reached} / {answered}"


def client_matrix(r: Path) -> dict[str, str]:
    """Per client and mode: answered, abstained under each ``--abstain-as``, the bare framework, the confidence."""
    d = load("client_matrix", r)
    answer = d["answer"]
    rows, lines = [], []
    for client in d["clients"]:
        if "skipped" in client:
            rows.append([client["client"], DASH, DASH, f"not run: {client['skipped']}", DASH, DASH, DASH, DASH])
            continue
        cells = client["cells"]
        for i, mode in enumerate(("plain", "stream")):
            bare = _cell(cells, "abstained", "refusal", mode).get("without_adapter")
            rows.append(
                [
                    client["client"] if i == 0 else "",
                    client["package"] if i == 0 else "",
                    f"`{client['calls'][i]}`",
                    _shown(_cell(cells, "answered", "text", mode), answer),
                    _shown(_cell(cells, "abstained", "text", mode), answer),
                    _shown(_cell(cells, "abstained", "refusal", mode), answer),
                    _shown(bare, answer) if bare else DASH,
                    _reached(cells, mode),
                ]
            )
        lines.append([client["client"], f"`{client['confidence']}`"])
    header = [
        "client",
        "package",
        "call",
        "answered",
        "abstained, `text`",
        "abstained, `refusal`",
        "abstained, `refusal`, without candor's adapter",
        "confidence reached",
    ]
    return {
        "table:client-matrix": md_table(header, "lllllllr", rows),
        "table:client-matrix-confidence": md_table(["client", "the confidence, in code"], "ll", lines),
        "value:client-matrix-run": (
            f'"{d["question"]}" asked of one `candor serve` (the embedded model, `n-prob`) with the threshold at '
            f'0.0 (answered: "{answer}") and at 1.0 (abstained: "{d["refusal"]}"), under `--abstain-as text` and '
            "`refusal`; `CANDOR_WRITE_MATRIX=1 pytest tests/test_client_matrix.py`"
        ),
    }
