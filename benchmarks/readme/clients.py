"""docs/serving.md's compatibility matrix: what each client shows, from tests/test_client_matrix.py's results."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .formatting import DASH, load, md_table


def _scrubbed(text: str) -> str:
    """An error text without the machine's paths (a package's file named from its package: ``llama_index/...``)."""
    text = re.sub(r"/\S*?/site-packages/", "", text)
    return re.sub(r"/(?:work|root|home|tmp)/\S*/", "", text)


def _raised(cell: dict[str, Any]) -> str:
    """An exception a cell raised: its type, and the HTTP status when it was the server's answer."""
    found = re.search(r"Error code: (\d{3})", str(cell.get("error") or ""))
    return f"raises `{cell['exception']}`" + (f" ({found.group(1)})" if found else "")


def _text(shown: Any, answer: str) -> str:
    if shown == answer:
        return "the answer"
    if not shown:
        return "**empty**"
    shown = str(shown)
    return f'"{shown[:60]}…"' if len(shown) > 60 else f'"{shown}"'


def _shown(cell: dict[str, Any], answer: str) -> str:
    """One cell: the text the user sees (or the exception raised) and the finish reason."""
    if cell.get("exception"):
        return _raised(cell)
    shown = cell.get("shown")
    text = _text(shown, answer)
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


def _tool(cell: dict[str, Any] | None) -> str:
    """The tool round trip: the calls made (how many valid against the schema) and whether it answered after."""
    if cell is None:
        return "offers none"
    if cell.get("na"):
        return f"n/a: {cell['na']}"
    if cell.get("exception"):
        return _raised(cell)
    calls = cell.get("calls") or []
    if not calls:
        return "no call; answered" if cell.get("shown") else "no call; **empty**"
    valid = sum(bool(c.get("valid")) for c in calls)
    after = "answered" if cell.get("shown") else "**empty** answer"
    plural = "s" if len(calls) > 1 else ""
    return f"{len(calls)} call{plural} ({valid} valid), tool ran {cell.get('tool_ran', 0)}×, {after}"


def _structured(modes: dict[str, dict[str, Any]]) -> str:
    """Each structured output mode: parsed into the schema, not parsed, the refusal shown, or the exception."""
    if not modes:
        return "offers none"
    out = []
    for mode, cell in modes.items():
        if cell.get("exception"):
            what = _raised(cell)
        elif cell.get("parsed"):
            what = "parsed"
        elif cell.get("refusal"):
            what = f'refusal "{cell["refusal"]}"'
        else:
            what = "**not parsed**"
        out.append(f"`{mode}`: {what}")
    return "; ".join(out)


def _turn2(cell: dict[str, Any] | None, answer: str) -> str:
    """A second turn after an abstention: what each turn showed, or the exception."""
    if cell is None:
        return DASH
    if cell.get("exception"):
        return _raised(cell)
    return f"{_text(cell.get('shown'), answer)}, then {_text(cell.get('shown_second'), answer)}"


def client_paths(d: dict[str, Any]) -> str:
    """The agent paths per client: a tool round trip, the structured outputs, a second turn after an abstention."""
    rows = []
    for client in d["clients"]:
        if "skipped" in client or "broken" in client:
            why = client.get("skipped") or f"broke: {_scrubbed(client['broken'])}"
            rows.append([client["client"], f"not run: {why}", DASH, DASH, DASH])
            continue
        if "paths" not in client:  # a matrix run from before issue 62's paths
            rows.append([client["client"], "not run", DASH, DASH, DASH])
            continue
        found = client["paths"]
        turn2 = found.get("turn2") or {}
        rows.append(
            [
                client["client"],
                _tool(found.get("tool")),
                _structured(found.get("structured") or {}),
                _turn2(turn2.get("text"), d["answer"]),
                _turn2(turn2.get("refusal"), d["answer"]),
            ]
        )
    header = [
        "client",
        "tool round trip",
        "structured output (per mode)",
        "second turn after an abstention, `text`",
        "second turn, `refusal`",
    ]
    return md_table(header, "lllll", rows)


def client_matrix(r: Path) -> dict[str, str]:
    """Per client and mode: answered, abstained under each ``--abstain-as``, the bare framework, the confidence."""
    d = load("client_matrix", r)
    answer = d["answer"]
    rows, lines = [], []
    for client in d["clients"]:
        if "skipped" in client or "broken" in client:
            why = client.get("skipped") or f"broke: {_scrubbed(client['broken'])}"
            rows.append([client["client"], DASH, DASH, f"not run: {why}", DASH, DASH, DASH, DASH])
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
        confidence = client["confidence"]
        lines.append([client["client"], f"`{confidence}`" if confidence else "kept nowhere the framework returns"])
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
        "table:client-matrix-paths": client_paths(d),
        "value:client-matrix-run": (
            f'"{d["question"]}" asked of one `candor serve` (the embedded model, `n-prob`) with the threshold at '
            f'0.0 (answered: "{answer}") and at 1.0 (abstained: "{d["refusal"]}"), under `--abstain-as text` and '
            "`refusal`; `CANDOR_WRITE_MATRIX=1 pytest tests/test_client_matrix.py`"
        ),
    }
