"""Agreement of the consistency judges with 100 hand-labelled (greedy, sample) pairs.

Two steps:

- ``python -m benchmarks.consistency_agreement draw`` draws the pairs from the
  HonestyBench-mini test and dev caches (``benchmarks/cache/mini``) into
  ``benchmarks/consistency_labels.json``, with their texts and an empty
  ``human`` label to fill in by hand. It refuses to overwrite labels.
- ``python -m benchmarks.consistency_agreement`` (no argument) judges the
  labelled pairs with every registered consistency judge, from the texts stored
  in the labels file (so a re-annotation cannot change the validation set), and
  writes ``benchmarks/results/consistency_agreement.json``.

The draw is stratified by what the ``lexical`` judge does with a pair, so that
its rarer cases get enough pairs: identical answers, containment, ROUGE-L ≥ 0.5
alone, near misses (0 < ROUGE-L < 0.5) and no overlap. Within a stratum the draw
is seeded and round-robin over datasets, one pair per record. Stratified
agreement is not the judge's agreement on all pairs, so the script also reports
agreement reweighted by each stratum's share of the whole pool.

Every pair is assigned to a ``design`` or a ``report`` half (alternating within
each stratum). Anything tuned here (the ``embedding`` judge's cosine threshold)
is chosen on the design half and reported on the report half.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter, defaultdict
from typing import Any

from benchmarks.common import CACHE, RESULTS, write_json
from candor.annotation.judges import CONSISTENCY_JUDGES, EMBEDDING_THRESHOLD, get_consistency_judge
from candor.annotation.records import read_records
from candor.annotation.text_matching import contains_words, normalize, rouge_l_f1
from candor.util.errors import CandorError

LABELS = RESULTS.parent / "consistency_labels.json"
PARTS = ("test", "dev")
SEED = 0
# Pairs per stratum (100 in all): positives and negatives about even, the
# lexical judge's two positive rules (containment, ROUGE) both well represented.
QUOTA = {"identical": 10, "containment": 25, "rouge": 20, "near-miss": 25, "no-overlap": 20}
THRESHOLDS = [round(0.30 + 0.01 * i, 2) for i in range(66)]  # embedding cosine grid, 0.30 … 0.95


def stratum(greedy: str, sample: str, threshold: float = 0.5) -> str:
    """Which rule of the lexical judge decides this pair."""
    ng, ns = normalize(greedy), normalize(sample)
    if ng == ns:
        return "identical"
    if contains_words(ng, ns) or contains_words(ns, ng):
        return "containment"
    rouge = rouge_l_f1(greedy, sample)
    if rouge >= threshold:
        return "rouge"
    return "near-miss" if rouge > 0 else "no-overlap"


# ---------------------------------------------------------------- draw


def pool_pairs() -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every (greedy, sample) pair of the cached test and dev records, with empty answers counted and left out."""
    pairs, skipped = [], Counter()
    for part in PARTS:
        for path in sorted((CACHE / "mini" / part).glob("*.jsonl")):
            for rec in read_records(path):
                for j, s in enumerate(rec.samples):
                    if not normalize(rec.greedy.text) or not normalize(s.text):
                        skipped["empty answer"] += 1
                        continue
                    pairs.append(
                        {
                            "key": f"{rec.id}#{j}",
                            "part": part,
                            "dataset": path.stem,
                            "question": rec.item.question,
                            "greedy": rec.greedy.text,
                            "sample": s.text,
                            "stored_verdict": rec.consistency[j] if rec.consistency else None,
                            "stratum": stratum(rec.greedy.text, s.text),
                        }
                    )
    return pairs, dict(skipped)


def draw_stratum(pairs: list[dict[str, Any]], n: int, rng: random.Random) -> list[dict[str, Any]]:
    """n pairs, round-robin over datasets, at most one pair per record."""
    by_dataset: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in pairs:
        by_dataset[p["dataset"]].append(p)
    for group in by_dataset.values():
        rng.shuffle(group)
    chosen, records = [], set()
    datasets = sorted(by_dataset)
    while len(chosen) < n and any(by_dataset.values()):
        for d in datasets:
            group = by_dataset[d]
            while group and group[-1]["key"].split("#")[0] in records:
                group.pop()
            if group and len(chosen) < n:
                p = group.pop()
                records.add(p["key"].split("#")[0])
                chosen.append(p)
    return chosen


def draw(force: bool) -> None:
    if LABELS.exists() and not force:
        old = json.loads(LABELS.read_text())
        if any(x.get("human") is not None for x in old.get("labels", [])):
            raise SystemExit(f"{LABELS} already holds hand labels; pass --force to draw again (it keeps none)")
    pairs, skipped = pool_pairs()
    if not pairs:
        print(
            "SKIP: no cached records under benchmarks/cache/mini; run `python -m benchmarks.baselines`", file=sys.stderr
        )
        raise SystemExit(0)
    rng = random.Random(SEED)
    by_stratum: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in pairs:
        by_stratum[p["stratum"]].append(p)
    labels = []
    for name, n in QUOTA.items():
        for i, p in enumerate(draw_stratum(by_stratum[name], n, rng)):
            labels.append({**p, "half": "design" if i % 2 == 0 else "report", "human": None, "note": ""})
    rng.shuffle(labels)  # label in random order, not stratum by stratum
    spec = {
        "guideline": GUIDELINE,
        "labeler": "",
        "sample": {
            "seed": SEED,
            "parts": list(PARTS),
            "quota": QUOTA,
            "datasets": sorted({p["dataset"] for p in pairs}),
            "pool_pairs": len(pairs),
            "pool_pairs_by_part": dict(Counter(p["part"] for p in pairs)),
            "pool_skipped": skipped,
            "pool_strata": dict(Counter(p["stratum"] for p in pairs)),
            "rule": "stratified by the lexical judge's deciding rule; round-robin over datasets; one pair per record; "
            "design/report halves alternate within each stratum",
        },
        "labels": labels,
    }
    spec["labels"] = [{k: v for k, v in x.items() if k != "question"} for x in spec["labels"]]
    LABELS.write_text(json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
    print(f"drew {len(labels)} pairs from {len(pairs)} into {LABELS}")


GUIDELINE = [
    "Label 1 when the two answers, read as answers to the question, make the same claim: a reader who "
    "accepted one would accept the other as giving the same answer. Label 0 otherwise.",
    "Same answer in other words counts (abbreviation, a fuller or shorter name of the same entity, the "
    "same number written differently, the same answer inside a longer sentence).",
    'Extra detail is fine when it does not change the answer ("Paris" vs "Paris, the capital of France"); '
    "an added or dropped part that changes which entity, date, number or yes/no is meant makes it 0 "
    '("1997" vs "May 1995", "John Smith" vs "John Adams").',
    "A more specific vs a less specific answer: 1 only when the question is answered the same way by both "
    '("Obama" vs "Barack Obama"); 0 when the shorter one is too vague to pick out the same answer '
    '("the 1990s" vs "1994").',
    "Judge meaning, not correctness: two equally wrong answers that say the same thing are 1.",
    'A refusal or non-answer ("I don\'t know") matches only another non-answer; an answer that lists two '
    "candidates matches neither single candidate.",
    "The question is read to decide what the answers mean (e.g. which part of a long answer is the answer).",
    'An answer that only repeats words of the question (an echo, e.g. "Santa Claus" for "who is Santa Claus '
    'based on") is a non-answer: it matches another echo of the same words, not an answer that adds a claim.',
    'In an "A or B?" question, two answers that pick the same candidate are 1 even when one shortens or misspells '
    'the name ("Danny" vs "Danny Halligan"); a blend of both candidates\' names picks neither.',
    "(The two rules above were written down during labelling, from the cases met; the borderline calls carry a note.)",
]


# ---------------------------------------------------------------- agreement


def build_judges(names: list[str]) -> dict[str, Any]:
    judges = {}
    for name in names:
        try:
            if name == "llm":
                from candor.backends import load_backend

                judges[name] = get_consistency_judge("llm", backend=load_backend("smollm2-135m"))
            else:
                judges[name] = get_consistency_judge(name)
        except CandorError as exc:
            print(f"skip judge {name}: {exc}", file=sys.stderr)
    return judges


def agreement(verdicts: list[int], labels: list[dict[str, Any]]) -> dict[str, Any]:
    """Agreement, false positives and false negatives (with their pairs) of one verdict list."""
    fp = [x for v, x in zip(verdicts, labels, strict=True) if v and not x["human"]]
    fn = [x for v, x in zip(verdicts, labels, strict=True) if not v and x["human"]]
    n = len(labels)
    return {
        "n": n,
        "agree": n - len(fp) - len(fn),
        "agreement": (n - len(fp) - len(fn)) / n if n else None,
        "false_positives": len(fp),
        "false_negatives": len(fn),
        "judge_positive": sum(verdicts),
        "human_positive": sum(x["human"] for x in labels),
        "fp_examples": [_example(x) for x in fp],
        "fn_examples": [_example(x) for x in fn],
    }


def _example(x: dict[str, Any]) -> dict[str, Any]:
    return {k: x[k] for k in ("key", "greedy", "sample", "note") if x.get(k) is not None}


def pool_weighted(verdicts: list[int], labels: list[dict[str, Any]], pool_strata: dict[str, int]) -> float:
    """Agreement reweighted to each stratum's share of the whole pool (undoes the stratified draw)."""
    total = sum(pool_strata.values())
    out = 0.0
    for name, count in pool_strata.items():
        rows = [v == x["human"] for v, x in zip(verdicts, labels, strict=True) if x["stratum"] == name]
        if rows:
            out += count / total * sum(rows) / len(rows)
    return out


def by_stratum(verdicts: list[int], labels: list[dict[str, Any]]) -> dict[str, str]:
    out = {}
    for name in QUOTA:
        rows = [v == x["human"] for v, x in zip(verdicts, labels, strict=True) if x["stratum"] == name]
        humans = [x["human"] for x in labels if x["stratum"] == name]
        out[name] = f"{sum(rows)}/{len(rows)} agree, {sum(humans)} labelled equivalent"
    return out


def choose_threshold(sims: list[float], labels: list[dict[str, Any]]) -> float:
    """The grid threshold with the best design-half agreement (ties: the middle of the best run)."""
    scores = [sum(int(s >= t) == x["human"] for s, x in zip(sims, labels, strict=True)) for t in THRESHOLDS]
    best = max(scores)
    tied = [t for t, s in zip(THRESHOLDS, scores, strict=True) if s == best]
    return tied[len(tied) // 2]


def embedding_tuning(labels: list[dict[str, Any]]) -> dict[str, Any]:
    """Choose the cosine threshold on the design half; report it on the report half."""
    from candor.backends.embeddings import pair_similarity

    sims = [float(s) for s in pair_similarity([x["sample"] for x in labels], [x["greedy"] for x in labels])]
    design = [(s, x) for s, x in zip(sims, labels, strict=True) if x["half"] == "design"]
    chosen = choose_threshold([s for s, _ in design], [x for _, x in design])
    return {
        "chosen_threshold": chosen,
        "registered_default": EMBEDDING_THRESHOLD,
        "grid": [THRESHOLDS[0], THRESHOLDS[-1], 0.01],
        "chosen_on": "design half",
        "similarities": sims,
    }


def evaluate(labels: list[dict[str, Any]], spec: dict[str, Any], names: list[str]) -> dict[str, Any]:
    judges = build_judges(names)
    greedy, sample = [x["greedy"] for x in labels], [x["sample"] for x in labels]
    questions = [x["question"] for x in labels]
    halves = {h: [i for i, x in enumerate(labels) if x["half"] == h] for h in ("design", "report")}
    result: dict[str, Any] = {"n": len(labels), "sample": spec["sample"], "judges": {}}
    if "embedding" in judges:
        tuning = embedding_tuning(labels)
        result["embedding_threshold"] = {k: v for k, v in tuning.items() if k != "similarities"}
        judges["embedding"] = get_consistency_judge("embedding", threshold=tuning["chosen_threshold"])
    for name, judge in judges.items():
        # Same argument order as annotation: (sample, greedy).
        verdicts = judge.judge(sample, greedy, questions)
        entry = {
            "describe": judge.describe(),
            "all": agreement(verdicts, labels),
            "pool_weighted_agreement": pool_weighted(verdicts, labels, spec["sample"]["pool_strata"]),
            "by_stratum": by_stratum(verdicts, labels),
        }
        for half, idx in halves.items():
            entry[half] = {
                k: v
                for k, v in agreement([verdicts[i] for i in idx], [labels[i] for i in idx]).items()
                if not k.endswith("examples")
            }
        result["judges"][name] = entry
    stored = [x for x in labels if x.get("stored_verdict") is not None]
    if "lexical" in judges and stored:
        # The stored annotation verdicts must be what the lexical judge says now.
        again = judges["lexical"].judge([x["sample"] for x in stored], [x["greedy"] for x in stored])
        same = sum(a == x["stored_verdict"] for a, x in zip(again, stored, strict=True))
        result["lexical_matches_stored_verdicts"] = f"{same}/{len(stored)}"
    return result


def print_table(result: dict[str, Any]) -> None:
    print(f"{'judge':<13} {'agree (all)':>12} {'FP':>4} {'FN':>4} {'design':>8} {'report':>8} {'pool-weighted':>14}")
    for name, e in result["judges"].items():
        a, design, report = e["all"], e["design"]["agreement"], e["report"]["agreement"]
        print(
            f"{name:<13} {a['agree']:>5}/{a['n']:<6} {a['false_positives']:>4} {a['false_negatives']:>4} "
            f"{design:>8.2f} {report:>8.2f} {e['pool_weighted_agreement']:>14.3f}"
        )


def with_questions(labels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pair with its question, read from the shared benchmark files by record id.

    The labels file keeps no benchmark text (the data is never copied into the repo):
    the id ``dataset:line`` finds the question again.
    """
    from candor.data import load_items
    from candor.util.errors import CandorError

    datasets = sorted({x["dataset"] for x in labels})
    try:
        by_id = {item.id: item.question for name in datasets for item in load_items(name)}
    except CandorError as exc:
        print(f"SKIP: HonestyBench data not available ({exc})", file=sys.stderr)
        raise SystemExit(0) from None
    return [{**x, "question": by_id[x["key"].split("#")[0]]} for x in labels]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", nargs="?", default="evaluate", choices=["draw", "evaluate"])
    parser.add_argument("--force", action="store_true", help="draw again even if the labels file exists")
    parser.add_argument("--judges", nargs="*", default=None, help="judges to run (default: every registered one)")
    args = parser.parse_args()
    if args.step == "draw":
        draw(args.force)
        return
    if not LABELS.exists():
        raise SystemExit(f"{LABELS} is missing; run `python -m benchmarks.consistency_agreement draw` and label it")
    spec = json.loads(LABELS.read_text())
    labels = with_questions(spec["labels"])
    unlabelled = [x["key"] for x in labels if x.get("human") not in (0, 1)]
    if unlabelled:
        raise SystemExit(f"{len(unlabelled)} pairs have no hand label yet, e.g. {unlabelled[0]}")
    result = evaluate(labels, spec, args.judges or CONSISTENCY_JUDGES.names())
    write_json(RESULTS / "consistency_agreement.json", result)
    print_table(result)


if __name__ == "__main__":
    main()
