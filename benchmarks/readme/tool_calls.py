"""benchmarks/README.md's "Tool calls on BFCL" section, from results/tool_calls.json (and tool_calls_openai.json
when the llama-server run exists)."""

from __future__ import annotations

import re
from pathlib import Path

from .formatting import DASH, Json, estimate, load, md_table, notes_for, pct, shown_command

ARM_NAMES = {"free": "free", "grammar": "grammar (`allow_text`)"}
SCORE_NAMES = {"n-prob": "n-prob", "consistency": "consistency (k = 5)", "head": "EliCal-style head"}


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole}" + (f" ({100 * part / whole:.0f}%)" if whole else "")


def score_table(d: Json) -> str:
    """One row per arm and score: AUROC and ECE on the test split (bootstrap intervals), n, and the abstentions."""
    rows, cells = [], []
    for arm, block in d["arms"].items():
        if "missing" in block:
            rows.append([ARM_NAMES.get(arm, arm), DASH, f"not run: {block['missing']}", "", "", "", ""])
            continue
        for score, label in SCORE_NAMES.items():
            cell = block["scores"].get(score)
            if cell is None:
                continue
            if "missing" in cell:
                rows.append([ARM_NAMES.get(arm, arm), label, DASH, DASH, DASH, cell["missing"], ""])
                continue
            n = cell["n"]
            auroc = estimate(cell["auroc"]["value"], cell["auroc"]["ci"], "auroc", n=n)
            ece = estimate(cell["ece"]["value"], cell["ece"]["ci"], "ece", corrected=cell["ece"].get("corrected"), n=n)
            cells += [auroc, ece]
            irr, rel = cell["irrelevance"], cell["relevant"]
            rows.append(
                [
                    ARM_NAMES.get(arm, arm),
                    label,
                    auroc,
                    ece,
                    f"{n} ({cell['correct']} right)",
                    _share(irr["abstained"], irr["n"]),
                    f"{rel['answered']}/{rel['n']}, {rel['answered_correct']} right",
                ]
            )
    header = [
        "arm",
        "score",
        "AUROC",
        "ECE",
        "n (test)",
        f"irrelevance abstained (< {d['threshold']:g} or no call)",
        "relevant answered",
    ]
    return md_table(header, "llrrrrr", rows) + notes_for(cells, corrected=True)


def summary_table(d: Json) -> str:
    """Per arm: replies that try a call and parse, and accuracy per category (all items, greedy replies)."""
    categories = list(d["items"])
    rows = []
    for arm, block in d["arms"].items():
        if "missing" in block:
            continue
        s = block["summary"]
        parse = DASH if s["parse_rate"] is None else f"{pct(s['parse_rate'])}% of {s['call_attempts']}"
        row = [ARM_NAMES.get(arm, arm), str(s["n"]), parse]
        for category in categories:
            c = s["categories"].get(category)
            row.append(DASH if c is None else f"{pct(c['accuracy'])} ({pct(c['called'])})")
        rows.append(row)
    header = ["arm", "items", "replies trying a call that parse", *(f"{c}: right % (called %)" for c in categories)]
    return md_table(header, "lrr" + "r" * len(categories), rows)


def speed_text(d: Json) -> str:
    s = d.get("speed")
    if not s or "ratio_schema_over_free" not in s:
        return "not measured in this run"
    free, schema = s["free"], s["required"]
    return (
        f"{schema['tokens_per_s']:.1f} generated tokens/s with the schema (`required`) against "
        f"{free['tokens_per_s']:.1f} without (`free`, not cut) on the same {s['items']} simple items, greedy and "
        f"k = 5 samples, the arms alternating item by item in one run: {s['ratio_schema_over_free']:.2f}× "
        f"({schema['tokens']} and {free['tokens']} tokens; prefill included)"
    )


def _command(recorded: str) -> str:
    """The recorded command without its ``--data`` folder (a machine's path; the default is the data's place)."""
    return re.sub(r" --data \S+", "", shown_command(recorded))


def run_text(d: Json) -> str:
    items = ", ".join(f"{category} {n}" for category, n in d["items"].items())
    asked = sum(d.get("items_asked", d["items"]).values())
    split = d["split"]["items"]
    cpu = d["machine"]["cpu"]
    judged = sum(block["summary"]["replies_judged"] for block in d["arms"].values() if "summary" in block)
    return (
        f"`{_command(d['command'])}` on {d['backend']['model']} ({d['backend']['backend']}, {cpu['name']}, "
        f"{cpu['logical_cores']} cores shared with other jobs): {items} items generated "
        f"({sum(d['items'].values())} of the {asked} asked for before the deadline; the first of each file), "
        f"{judged} replies judged over the arms (greedy and samples); split by item id: {split['train']} train "
        f"(the head's stage 1), {split['cal']} cal (Platt for every score), {split['test']} test"
    )


def tool_calls(results: Path) -> dict[str, str]:
    if not (results / "tool_calls.json").exists():
        return {}
    d = load("tool_calls", results)
    parts = {
        "table:tool-calls": score_table(d),
        "table:tool-calls-parse": summary_table(d),
        "value:tool-calls-run": run_text(d),
        "value:tool-calls-speed": speed_text(d),
    }
    if (results / "tool_calls_openai.json").exists():
        o = load("tool_calls_openai", results)
        parts["value:tool-calls-openai-run"] = run_text(o)
        parts["table:tool-calls-openai-parse"] = summary_table(o)
    return parts
