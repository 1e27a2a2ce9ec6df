"""Regenerate the numbers of README.md's "Calibrate on your own traffic" from benchmarks/results/adapt.json.

    python benchmarks/adapt_readme.py           # rewrite README.md in place
    python benchmarks/adapt_readme.py --check   # exit 1 if README.md differs from what this writes

The README marks the generated parts with ``<!-- adapt:NAME -->`` … ``<!-- /adapt:NAME -->``;
only the JSON file is read. tests/test_adapt_readme.py fails when the README drifts from it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULT = HERE / "results" / "adapt.json"
README = HERE.parent / "README.md"
ARMS = (("adapted", "adapted"), ("unadapted", "unadapted"), ("cal_only", "Cal-Only"))
DASH = "–"


def cell(entry: dict[str, Any], digits: int = 1) -> str:
    """``75.6 [68, 82]``: the mean ×100 and its interval in whole points; a dash when missing."""
    mean, ci = entry.get("mean"), entry.get("ci95") or [None, None]
    if mean is None:
        return DASH
    text = f"{100 * mean:.{digits}f}"
    if ci[0] is not None and ci[1] is not None:
        text += f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]"
    return text


def error_cell(entry: dict[str, Any]) -> str:
    """The answered error (×100) and coverage; a dash where no run answered anything."""
    if entry["answered_error"]["mean"] is None:
        return f"{DASH} (answers none)"
    return f"{cell(entry['answered_error'])} at {100 * entry['coverage']['mean']:.1f}% coverage"


def table(result: dict[str, Any]) -> str:
    rows = ["| domain | labels | arm | AUROC | ECE | answered error (α = {:g}) |".format(result["alpha"]),
            "|---|---:|---|---:|---:|---|"]  # fmt: skip
    domains = [("mean of the four", result)] + [(d, result["by_domain"][d]) for d in result["sizes"]["folds"]]
    for name, block in domains:
        for n, arms in block["by_labels"].items():
            for key, label in ARMS:
                entry = arms[key]
                rows.append(f"| {name} | {n} | {label} | {cell(entry['auroc'])} | {cell(entry['ece'])} | "
                            f"{error_cell(entry)} |")  # fmt: skip
    return "\n".join(rows)


def goal(result: dict[str, Any]) -> str:
    g = result.get("goal_at_100_labels") or {}
    if not g.get("auroc_gain_by_domain"):
        return "The 100-label goal was not measured."
    gains = ", ".join(f"{d} {100 * v:+.1f}" for d, v in g["auroc_gain_by_domain"].items())
    verdict = "met" if all(g[k] for k in ("mean_gain_at_least_0.05", "no_domain_below_unadapted",
                                          "adapted_ece_at_most_0.05", "answered_error_within_alpha_every_run")) \
        else "not met"  # fmt: skip
    seconds = result["adapt_seconds"].get("100", {}).get("mean")
    return (f"With 100 labels the goal (mean AUROC gain ≥ +5 points, no domain below the unadapted head, "
            f"ECE ≤ 0.05, answered error within α in every run) is **{verdict}**: AUROC gain per domain "
            f"{gains} (mean {100 * g['mean_auroc_gain']:+.1f}); adapted ECE ≤ 0.05: "
            f"{'yes' if g['adapted_ece_at_most_0.05'] else 'no'}; answered error within α in every run: "
            f"{'yes' if g['answered_error_within_alpha_every_run'] else 'no'}. "
            f"Adapting took {seconds:.0f} s per run (mean, features cached) on 2 shared CPU cores"
            + _cli(result) + ".")  # fmt: skip


def _cli(result: dict[str, Any]) -> str:
    cli = result.get("cli_adapt")
    if not cli:
        return ""
    return (f"; the command itself, from a cold start (loading the model, computing every feature), "
            f"{cli['seconds']:.0f} s with {cli['labels']} labels in {cli['mode']} mode "
            f"(load average {cli['load_average'][0]:g})")


def parts(result: dict[str, Any]) -> dict[str, str]:
    return {"table": table(result), "goal": goal(result)}


def render(text: str, generated: dict[str, str]) -> str:
    for name, body in generated.items():
        pattern = re.compile(rf"(<!-- adapt:{name} -->\n).*?(^<!-- /adapt:{name} -->)", re.S | re.M)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no <!-- adapt:{name} --> block")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    text = README.read_text(encoding="utf-8")
    new = render(text, parts(json.loads(RESULT.read_text(encoding="utf-8"))))
    if args.check:
        return 0 if new == text else 1
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
