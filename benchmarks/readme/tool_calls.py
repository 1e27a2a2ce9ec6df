"""benchmarks/README.md's "Tool calls on BFCL" section, from results/tool_calls.json (and tool_calls_openai.json
when the llama-server run exists)."""

from __future__ import annotations

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
    if not s or "ratio_grammar_over_free" not in s:
        return "not measured in this run (one arm did not run)"
    free, grammar = s["free"], s["grammar"]
    return (
        f"{grammar['tokens_per_s']:.1f} generated tokens/s with the schema against {free['tokens_per_s']:.1f} without "
        f"({s['ratio_grammar_over_free']:.2f}×; the same {free['items']} items, arms alternating batch by batch in "
        "one run; the prompts' prefill included)"
    )


def run_text(d: Json) -> str:
    items = ", ".join(f"{category} {n}" for category, n in d["items"].items())
    split = d["split"]["items"]
    return (
        f"`{shown_command(d['command'])}` on {d['backend']['model']} ({d['backend']['backend']}): {items} items "
        f"(the first of each file); split by item id: {split['train']} train (the head's stage 1), "
        f"{split['cal']} cal (Platt for every score), {split['test']} test"
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
