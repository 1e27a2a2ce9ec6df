"""Agreement of the default correctness judge (`contains`) with 100 hand labels.

The labels (benchmarks/judge_labels.json) were made by reading the question, the
gold aliases and the model's greedy answer of records from the HonestyBench-mini
test cache (run `python -m benchmarks.baselines` first). Writes
benchmarks/results/judge_agreement.json.
"""

from __future__ import annotations

import json
import sys

from benchmarks.common import CACHE, RESULTS, write_json
from candor.annotation.judges import get_correctness_judge
from candor.annotation.records import read_records


def main() -> None:
    spec = json.loads((RESULTS.parent / "judge_labels.json").read_text())
    records = {}
    for path in (CACHE / "mini" / "test").glob("*.jsonl"):
        records.update({r.id: r for r in read_records(path)})
    missing = [x["id"] for x in spec["labels"] if x["id"] not in records]
    if missing:
        print(
            f"SKIP: {len(missing)} labelled records not in the cache; run `python -m benchmarks.baselines`",
            file=sys.stderr,
        )
        raise SystemExit(0)
    judge = get_correctness_judge("contains")
    recs = [records[x["id"]] for x in spec["labels"]]
    verdicts = judge.judge([r.greedy.text for r in recs], [r.item.answers for r in recs])
    human = [x["human"] for x in spec["labels"]]
    pairs = list(zip(verdicts, human, strict=True))
    result = {
        "judge": "contains",
        "n": len(pairs),
        "agreement": sum(v == h for v, h in pairs) / len(pairs),
        "false_positives": [r.id for r, (v, h) in zip(recs, pairs, strict=True) if v and not h],
        "false_negatives": [r.id for r, (v, h) in zip(recs, pairs, strict=True) if h and not v],
        "judge_positive": sum(verdicts),
        "human_positive": sum(human),
        "sample": spec["sample"],
    }
    write_json(RESULTS / "judge_agreement.json", result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
