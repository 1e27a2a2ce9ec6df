"""Judge noise on HonestyBench-mini: accuracy corrected for the `contains` judge's errors, and AUROC spreads.

See docs/methods.md "Judge noise". The hand labels are the repository's judge-validation sample
(benchmarks/judge_labels.json: 30 records the `contains` judge called correct and 70 it called
wrong, of the nq, hq and 2wikimultihopqa mini test records, read by a person); the judge's verdict
on each is the one benchmarks/judge_agreement.py recorded (results/judge_agreement.json lists the
disagreements). The sample was drawn by verdict, so the judge's sensitivity and specificity are
reweighted to the evaluated records' judged-correct rate (candor.evaluation.judge_noise).

The evaluated records are the confidences of the ``ensemble_debias`` run of benchmarks/baselines.py
(``--scores DIR``, one file per dataset) on the three datasets the labels come from; for each,
the Rogan–Gladen-corrected accuracy (bootstrap over both samples) and every method's AUROC spread
over 200 label-flip simulations at the measured rates. The consistency judge's agreement with
benchmarks/consistency_labels.json (stored verdict against the human label; a sample stratified by
surface overlap, so its rates describe those strata, not a random pair) is reported beside it.

    PYTHONPATH=src python -m benchmarks.judge_noise --scores benchmarks/cache/block/confidences

Writes benchmarks/results/judge_noise.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, write_json
from candor.estimators.confidences import ConfidenceTable, read_confidences
from candor.evaluation.judge_noise import HandLabels, judge_errors, judge_noise_report

ROOT = Path(__file__).resolve().parent
DATASETS = ("nq", "hq", "2wikimultihopqa")


def correctness_labels() -> HandLabels:
    """The hand-labelled sample with the `contains` judge's verdicts from the committed agreement run."""
    spec = json.loads((ROOT / "judge_labels.json").read_text())
    agreement = json.loads((RESULTS / "judge_agreement.json").read_text())
    flipped = set(agreement["false_positives"]) | set(agreement["false_negatives"])
    human = np.array([x["human"] for x in spec["labels"]], dtype=int)
    verdict = np.array([1 - x["human"] if x["id"] in flipped else x["human"] for x in spec["labels"]], dtype=int)
    if int(verdict.sum()) != agreement["judge_positive"]:
        sys.exit("judge_labels.json and judge_agreement.json disagree on the verdicts; rerun judge_agreement.py")
    datasets = tuple(x["id"].split(":", 1)[0] for x in spec["labels"])  # HonestyBench-mini ids: "<dataset>:<n>"
    return HandLabels(verdict, human, by_verdict=True, datasets=datasets)


def consistency_rates() -> dict[str, float | int]:
    labels = json.loads((ROOT / "consistency_labels.json").read_text())["labels"]
    sample = HandLabels(np.array([x["stored_verdict"] for x in labels]), np.array([x["human"] for x in labels]))
    errors = judge_errors(sample)
    return {"n": len(labels), "sensitivity": round(errors.sensitivity, 4), "specificity": round(errors.specificity, 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scores", type=Path, required=True, help="folder of <dataset>.jsonl confidences")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--out", type=Path, default=RESULTS / "judge_noise.json")
    args = p.parse_args()
    rows = [row for d in DATASETS for row in read_confidences(args.scores / f"{d}.jsonl").rows]
    table = ConfidenceTable(rows)
    report = judge_noise_report(table, correctness_labels(), bootstrap=args.bootstrap)
    payload = {
        "command": "PYTHONPATH=src python -m benchmarks.judge_noise " + " ".join(sys.argv[1:]),
        "judge": "contains",
        "datasets": list(DATASETS),
        "records": len(rows),
        **report,
        "consistency_judge": consistency_rates(),
    }
    write_json(args.out, payload)
    for dataset, entry in report["accuracy"].items():
        print(f"{dataset:>16}: judged {entry['observed']:.3f}, corrected {entry['corrected']} {entry['ci']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
