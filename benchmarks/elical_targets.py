"""EliCal's stage-2 rule by the claim's quantifier (issue 46): what each target chose, and a saved run re-decided.

``benchmarks/elical.py`` chooses a rule per target when it runs the held-out selection
(candor.train.elical.selection) and writes what each target chose (:mod:`benchmarks.elical_choice`)
into results/elical.json. This script decides an already saved selection again by every target,
from its saved per-seed held-out AUROCs (no training, no test or OOD item: the held-out domains
are in-domain dev questions), and writes the same fields into the file:

    .venv/bin/python -m benchmarks.elical_targets                 # results/elical.json in place
    .venv/bin/python -m benchmarks.elical_targets --results FILE
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import RESULTS, logger, setup_logging, write_json
from benchmarks.elical_choice import claim_fields
from candor.train.elical.selection import rechoose


def rechoose_saved(path: Path) -> None:
    """Decide a saved results file's held-out selection again by every target (no training,
    no test item: the saved per-seed held-out AUROCs only) and write the claim fields into it."""
    payload = json.loads(path.read_text())
    rule = payload["stage2_rule"]
    rule["held_out_selection"] = rechoose(rule["held_out_selection"])
    rule.update(claim_fields(rule["held_out_selection"]))
    rule["curve_rule"] = rule["after"]["name"]
    note = RECHOOSE_NOTE + ("" if rule["curve_rule"] == rule["selected_by_target"]["universal"] else NO_UNIVERSAL_CURVE)
    payload["notes"] = [n for n in payload["notes"] if not n.startswith(RECHOOSE_NOTE[:40])] + [note]
    payload.setdefault("commands", {})["rechoose"] = "python -m benchmarks.elical_targets"
    write_json(path, payload)
    logger.info("%s: targets chose %s", path, rule["selected_by_target"])


RECHOOSE_NOTE = (
    "Issue 46: the held-out selection above was decided again by each target (stage2_rule.selected_by_target) from "
    "its saved per-seed held-out AUROCs (python -m benchmarks.elical_targets; nothing retrained, no test "
    "item read). The budget curves (methods, before) were run before that, with stage2_rule.curve_rule."
)
# Said only when the re-decided universal pick is not the rule the saved curve was run with.
NO_UNIVERSAL_CURVE = " The universal target's rule has no budget curve in this file."


def main() -> None:
    setup_logging()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS / "elical.json")
    rechoose_saved(p.parse_args().results)


if __name__ == "__main__":
    main()
