"""The conformal rows of benchmarks/claims.py on a small synthetic set of compound answers: tuned on the dev half
of the prompts only, checked on the test half, with the share of claims and text kept."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.claims_conformal import conformal_rows, split_by_prompt
from candor.annotation.claims import Claim
from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.serve import factuality as fa
from candor.serve.thresholds import clopper_pearson


def answers(n: int, seed: int = 0) -> tuple[list[Record], list[list[float]]]:
    """``n`` answers of 2–4 one-line claims; a false claim's value is lower on average; one echo per 10 answers."""
    rng = np.random.default_rng(seed)
    records, values = [], []
    for i in range(n):
        lines = [f"Fact {k} of answer {i}." for k in range(int(rng.integers(2, 5)))]
        text, claims, at = "\n".join(lines), [], 0
        for line in lines:
            right = bool(rng.random() < 0.6)
            claims.append(Claim(text=line, start=at, end=at + len(line), label=int(right)))
            at += len(line) + 1
        if i % 10 == 0:
            claims[0].label, claims[0].failure = None, "echo"
        item = QAItem(id=f"p{i}", dataset="synthetic", split="test", question="q", answers=())
        rec = Record(item=item, greedy=Completion(text=text), samples=[])
        rec.claims = claims
        records.append(rec)
        values.append([float(rng.beta(5, 2) if c.label == 1 else rng.beta(2, 4)) for c in claims])
    return records, values


def test_the_split_is_by_prompt_and_seeded():
    records, _ = answers(41)
    dev, test = split_by_prompt(records)
    assert len(dev) == 20 and len(test) == 21 and not {r.id for r in dev} & {r.id for r in test}
    assert split_by_prompt(records) == (dev, test) and split_by_prompt(records, seed=1) != (dev, test)


def test_conformal_rows_tune_on_dev_and_report_test():
    records, values = answers(120)
    out = conformal_rows(records, {"claim-prob": values, "claim-few": values[:30]}, alphas=(0.1, 0.3), delta=0.1)
    row = out["claim-prob"]["conformal@0.1"]
    dev, test = split_by_prompt(records)
    by_id = {r.id: v for r, v in zip(records, values, strict=True)}
    # the threshold is the one tuned on the dev half alone
    dev_rows = [
        {"answer": r.id, "correct": c.label, "failure": c.failure, "confidence": {"claim-prob": v}}
        for r in dev
        for c, v in zip(r.claims, by_id[r.id], strict=True)
    ]
    tuned = fa.tune(fa.labelled_claims(dev_rows, "claim-prob"), "claim-prob", 0.1)
    assert row["threshold"] == tuned.threshold and out["claim-prob"]["dev_answers"] == 60
    # the test half, counted by hand: an echo counts false, as the guarantee counts it
    clean = sum(
        all(v < row["threshold"] for c, v in zip(r.claims, by_id[r.id], strict=True) if c.label != 1) for r in test
    )
    assert row["test_answers"] == 60 and row["without_false"]["count"] == clean
    assert row["without_false"]["ci95"] == clopper_pearson(clean, 60)
    assert row["promised"] == pytest.approx(0.9)
    assert row["interval_below_promise"] is (row["without_false"]["ci95"][1] < 0.9)
    kept = [v >= row["threshold"] for r in test for v in by_id[r.id]]
    assert row["claims_kept"] == pytest.approx(np.mean(kept))
    assert 0.0 < row["text_kept"] < 1.0 and row["without_false_unrefined"] < row["without_false"]["value"]
    risk = out["claim-prob"]["risk@0.1"]
    assert risk["delta"] == 0.1 and risk["threshold"] >= row["threshold"]
    # 15 dev answers are too few for alpha = 0.1 (9 would do for conformal, 22 for risk control at delta 0.1)
    assert "threshold" in out["claim-few"]["conformal@0.1"]
    assert "needs at least 22" in out["claim-few"]["risk@0.1"]["refused"]


def test_the_readme_table_shows_each_row_and_says_when_the_results_lack_them():
    from benchmarks.readme.claims import conformal_table

    records, values = answers(60)
    out = conformal_rows(records, {"claim-prob": values, "claim-few": values[:16]}, alphas=(0.1,), delta=0.1)
    table = conformal_table({"conformal": out})
    row = out["claim-prob"]["conformal@0.1"]
    ci = row["without_false"]["ci95"]
    assert f"| `claim-prob` | conformal α=0.1 | 30 / 30 | {row['threshold']:.3g} | " in table
    assert f"{100 * row['without_false']['value']:.1f} [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}] vs 90 |" in table
    assert "| `claim-few` | risk α=0.1 δ=0.1 | 8 | – | refused: 8 dev answers are too few" in table
    assert conformal_table({}).startswith("_Not in `results/claims.json` yet")
