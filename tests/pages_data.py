"""Records and confidences for the report-page tests, in the documented file formats (records, confidences)."""

from __future__ import annotations

import numpy as np

from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.estimators.confidences import ConfidenceRow, ConfidenceTable

ROLES = {"trivia": "id", "science": "id", "geo": "ood"}
PROVENANCE = {
    "model": "tiny-llama",
    "template": "fewshot",
    "k": 5,
    "candor_version": "0.1.0",
    "correctness_judge": "exact-match",
    "consistency_judge": "lexical-echo",
}


def page_records(n: int = 120, methods: int = 3, seed: int = 0) -> tuple[list[Record], ConfidenceTable]:
    """``n`` records over three datasets and ``methods`` confidence columns that know the label to varying degrees."""
    rng = np.random.default_rng(seed)
    datasets = list(ROLES)
    records, rows = [], []
    for i in range(n):
        ds = datasets[i % 3]
        y = int(rng.random() < 0.45)
        item = QAItem(
            id=f"{ds}:{i}",
            dataset=ds,
            split="test",
            question=f"Question number {i} about {ds}: what is the answer?",
            answers=(f"gold {i}", f"alias {i}"),
        )
        answer = f"gold {i}" if y else f"wrong answer {i}"
        greedy = Completion(answer, token_ids=list(range(2 + i % 7)))
        records.append(Record(item=item, greedy=greedy, samples=[], greedy_correct=y, provenance=dict(PROVENANCE)))
        conf = {
            f"method-{j}": round(float(np.clip((0.6 - 0.2 * j) * y + rng.random() * 0.5, 0, 1)), 4)
            for j in range(methods)
        }
        rows.append(ConfidenceRow(item.id, ds, y, conf))
    return records, ConfidenceTable(rows)
