"""What conversations cost the confidence: the last turn of 2- and 3-turn chats against the same question asked alone.

Issue 42: ``candor serve`` answers a question asked inside a conversation and computes its
confidence on the question as asked there (docs/architecture.md "Conversations"), with a method
tuned on single questions. This measures how far the earlier turns move that confidence.

The questions are the first ``--per-dataset`` of each in-domain HonestyBench-mini test set (the
test sets are already a seeded shuffle). Each question is asked three ways, exactly as the server
asks it (``HonestModel.prepare(question, None, history)`` then ``answer_asks``):

- **single**: alone;
- **2-turn**: after one earlier turn: another test question (drawn with ``--seed``) and the
  model's own greedy answer to it asked alone;
- **3-turn**: after that turn and then a second one drawn the same way (the 2-turn chat plus one turn).

The answer of each is judged against the question's gold aliases with the judge the mini-bench
annotation uses (``AnnotateConfig().correctness_judge``), so each shape has its own accuracy.
AUROC and ECE (10 uniform bins) are computed on the questions pooled over the datasets, with
percentile bootstrap intervals; the differences (chat minus single) are *paired*: every resample
draws the same questions for both shapes.

Every answer is appended to ``--cache`` (JSONL) as it is computed, so a killed run continues:

    nohup nice -n 10 env PYTHONPATH=src python -m benchmarks.serve_conversations > conv.log 2>&1 &
    python -m benchmarks.serve_conversations --summarize-only   # the JSON from what is cached so far

Writes benchmarks/results/serve_conversations.json; benchmarks/readme_tables.py makes its table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from benchmarks.mini import load_mini_or_exit
from candor.annotation.builder import AnnotateConfig
from candor.annotation.judges import get_correctness_judge
from candor.data.items import QAItem
from candor.data.mini import IN_DOMAIN
from candor.evaluation.aggregate import percentile_interval
from candor.evaluation.metrics import accuracy, auroc, ece
from candor.serve import HonestModel
from candor.serve.answering import Ask, Reply

SHAPES = {1: "single", 2: "2-turn", 3: "3-turn"}  # turns in the chat, the last one being the question scored
METRICS = {"auroc": auroc, "ece": ece, "accuracy": accuracy}
Row = dict[str, Any]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--methods", default="n-prob,consis-lex", help="confidence methods, comma-separated")
    p.add_argument("--per-dataset", type=int, default=50, help="questions from each in-domain test set")
    p.add_argument("--batch", type=int, default=16, help="questions answered together (and cached) at a time")
    p.add_argument("--seed", type=int, default=0, help="draws the earlier turns")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--cache", type=Path, default=CACHE / "serve_conversations.jsonl")
    p.add_argument("--out", type=Path, default=RESULTS / "serve_conversations.json")
    p.add_argument("--summarize-only", action="store_true", help="write the JSON from the cache; answer nothing")
    args = p.parse_args()
    if args.per_dataset < 4 or args.batch < 1 or args.bootstrap < 1:
        p.error("--per-dataset must be at least 4, --batch and --bootstrap at least 1")
    return args


# ---------------------------------------------------------------- the chats


def select_questions(mini: Any, per_dataset: int) -> list[QAItem]:
    """The first ``per_dataset`` of each in-domain test set, taken in turn, so any prefix mixes the datasets."""
    parts = [mini.test_id[name][:per_dataset] for name in IN_DOMAIN]
    return [part[i] for i in range(per_dataset) for part in parts if i < len(part)]


def draw_partners(n: int, seed: int) -> list[tuple[int, int]]:
    """For each question, two distinct *other* questions whose alone answers become its earlier turns."""
    rng = np.random.default_rng(seed)
    partners = []
    for i in range(n):
        first, second = rng.choice(n - 1, size=2, replace=False)
        partners.append(tuple(int(j) + (j >= i) for j in (first, second)))  # skip i itself
    return partners


def history(partners: Sequence[int], items: Sequence[QAItem], alone: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Earlier turns, oldest first: each partner question and the model's answer to it asked alone."""
    turns: list[tuple[str, str]] = []
    for j in partners:
        turns += [("user", items[j].question), ("assistant", alone[items[j].id])]
    return tuple(turns)


# ---------------------------------------------------------------- answering (resumable)


class AnswerCache:
    """Rows keyed by (method, turns, question id, earlier question ids), appended and fsync'd one batch at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: dict[tuple, Row] = {}
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):  # a run killed mid-write: drop the torn row, it is answered again
                    path.write_text("".join(f"{kept}\n" for kept in lines[:-1]), encoding="utf-8")
                    break
                raise SystemExit(f"{path}:{number}: not a JSON row") from None
            self.rows[self.key(row)] = row

    @staticmethod
    def key(row: Row) -> tuple:
        return row["method"], row["turns"], row["id"], tuple(row["earlier"])

    def add(self, rows: list[Row]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                self.rows[self.key(row)] = row
            f.flush()
            os.fsync(f.fileno())


def answer_missing(
    model: HonestModel,
    cache: AnswerCache,
    todo: list[tuple[QAItem, tuple[int, ...], tuple]],
    turns: int,
    earlier_ids: Sequence[Sequence[str]],
) -> None:
    """Answer (as the server does) the questions of ``todo`` not cached yet; judge and cache them."""
    judge = get_correctness_judge(AnnotateConfig().correctness_judge)
    missing = [
        (t, ids)
        for t, ids in zip(todo, earlier_ids, strict=True)
        if (model.method, turns, t[0].id, tuple(ids)) not in cache.rows
    ]
    if not missing:
        return
    start = time.perf_counter()
    asks = [Ask(model.prepare(item.question, None, hist), Reply()) for (item, _, hist), _ in missing]
    rows = []
    for ((item, _, hist), ids), outcome in zip(missing, model.answer_asks(asks), strict=True):
        if isinstance(outcome, Exception):
            raise outcome
        answer = outcome[0]
        if answer.abstained or not answer.scores_returned_text:  # no threshold: the scored answer is returned
            raise RuntimeError(f"{item.id}: expected the scored answer, got {answer}")
        correct = int(judge.judge([answer.answer], [list(item.answers)])[0])
        rows.append(
            {
                "method": model.method,
                "turns": turns,
                "id": item.id,
                "dataset": item.dataset,
                "earlier": list(ids),
                "history_turns": len(hist) // 2,
                "answer": answer.answer,
                "confidence": answer.confidence,
                "correct": correct,
            }
        )
    cache.add(rows)
    logger.info("%s %s: %d answered in %.1f s", model.method, SHAPES[turns], len(rows), time.perf_counter() - start)


def batches(seq: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def run(args: argparse.Namespace, items: list[QAItem], partners: list[tuple[int, int]], cache: AnswerCache) -> None:
    from candor.backends import load_backend

    backend = load_backend(args.model)
    methods = [m for m in args.methods.split(",") if m]
    greedy = HonestModel(backend, confidence=methods[0])
    # The earlier turns' answers first: every question's greedy answer asked alone.
    for chunk in batches(range(len(items)), args.batch):
        answer_missing(greedy, cache, [(items[i], (), ()) for i in chunk], 1, [[] for _ in chunk])
    alone = {
        row["id"]: row["answer"] for row in cache.rows.values() if row["turns"] == 1 and row["method"] == greedy.method
    }
    models = [greedy, *(HonestModel(backend, confidence=m) for m in methods[1:])]
    # Every method and shape per chunk of questions: a run stopped early is still paired and balanced.
    for chunk in batches(range(len(items)), args.batch):
        for model in models:
            for turns in SHAPES:
                earlier = [partners[i][: turns - 1] for i in chunk]
                todo = [(items[i], e, history(e, items, alone)) for i, e in zip(chunk, earlier, strict=True)]
                answer_missing(model, cache, todo, turns, [[items[j].id for j in e] for e in earlier])


# ---------------------------------------------------------------- the numbers


def shape_arrays(rows: Sequence[Row]) -> dict[str, dict[str, np.ndarray]]:
    """Per shape, the confidences and verdicts of the questions every shape has, in one question order."""
    by_shape: dict[int, dict[str, Row]] = {t: {} for t in SHAPES}
    for row in rows:
        by_shape[row["turns"]][row["id"]] = row
    common = sorted(set.intersection(*(set(d) for d in by_shape.values())))
    return {
        SHAPES[t]: {
            "confidence": np.array([d[i]["confidence"] for i in common], dtype=float),
            "correct": np.array([d[i]["correct"] for i in common], dtype=int),
            "answer": [d[i]["answer"] for i in common],
        }
        for t, d in by_shape.items()
    }


def summarize(arrays: dict[str, dict[str, np.ndarray]], bootstrap: int, seed: int) -> dict[str, Any]:
    """Each shape's AUROC, ECE and accuracy with intervals, and the paired differences from ``single``."""
    n = len(arrays["single"]["correct"])

    def values(index: np.ndarray | slice) -> dict[str, dict[str, float]]:
        with np.errstate(invalid="ignore"):
            return {
                shape: {m: _metric(fn, a["confidence"][index], a["correct"][index]) for m, fn in METRICS.items()}
                for shape, a in arrays.items()
            }

    point = values(slice(None))
    rng = np.random.default_rng(seed)
    draws = [values(rng.integers(0, n, n)) for _ in range(bootstrap)]
    shapes: dict[str, Any] = {}
    for shape in arrays:
        shapes[shape] = {
            "n": n,
            **{m: _num(point[shape][m]) for m in METRICS},
            "ci95": {m: _interval([d[shape][m] for d in draws]) for m in METRICS},
        }
    differences = {}
    for shape in arrays:
        if shape == "single":
            continue
        gaps = {m: [d[shape][m] - d["single"][m] for d in draws] for m in METRICS}
        changed = sum(a != b for a, b in zip(arrays[shape]["answer"], arrays["single"]["answer"], strict=True))
        differences[shape] = {
            **{m: {"value": _num(point[shape][m] - point["single"][m]), "ci95": _interval(gaps[m])} for m in METRICS},
            "answers_changed": changed,
        }
    return {"n": n, "shapes": shapes, "minus_single": differences}


def _metric(fn: Any, confidence: np.ndarray, correct: np.ndarray) -> float:
    """The metric, or NaN where it is undefined (AUROC on a resample of one class)."""
    if fn is auroc and len(set(correct.tolist())) < 2:
        return float("nan")
    return float(fn(confidence, correct))


def _interval(values: Sequence[float]) -> list[float | None]:
    (low, high), _ = percentile_interval(values)
    return [_num(low), _num(high)]


def _num(x: float) -> float | None:
    return None if x != x else round(float(x), 4)


def payload(args: argparse.Namespace, items: list[QAItem], cache: AnswerCache, seconds: float) -> dict[str, Any]:
    wanted = {item.id for item in items}
    methods = {}
    for method in [m for m in args.methods.split(",") if m]:
        rows = [r for r in cache.rows.values() if r["method"] == method and r["id"] in wanted]
        arrays = shape_arrays(rows)
        if len(arrays["single"]["correct"]) >= 2:
            methods[method] = summarize(arrays, args.bootstrap, args.seed)
    return {
        "benchmark": "conversations: the last turn's confidence against the same question asked alone",
        "model": args.model,
        "questions": "HonestyBench-mini in-domain test, the first per dataset, pooled",
        "datasets": list(IN_DOMAIN),
        "per_dataset": args.per_dataset,
        "earlier_turns": "other test questions (seeded draw), each with the model's greedy answer to it asked alone",
        "judge": AnnotateConfig().correctness_judge,
        "ece_bins": 10,
        "bootstrap": args.bootstrap,
        "seed": args.seed,
        "methods": methods,
        "seconds": round(seconds, 1),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "command": command(),
        "answered_by": answered_by(args.cache),
    }


def command() -> str:
    return " ".join(["python -m benchmarks.serve_conversations", *sys.argv[1:]])


def answered_by(cache: Path) -> str | None:
    """The command that filled the cache (a --summarize-only run only reads it)."""
    meta = cache.with_suffix(".command")
    return meta.read_text(encoding="utf-8").strip() if meta.exists() else None


def main() -> None:
    setup_logging()
    args = parse_args()
    mini = load_mini_or_exit(args.data_dir)
    items = select_questions(mini, args.per_dataset)
    partners = draw_partners(len(items), args.seed)
    cache = AnswerCache(args.cache)
    start = time.perf_counter()
    meta = args.cache.with_suffix(".command")
    if not args.summarize_only:
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(command() + "\n", encoding="utf-8")
        run(args, items, partners, cache)
    result = payload(args, items, cache, time.perf_counter() - start)
    write_json(args.out, result)
    logger.info("wrote %s", args.out)
    print(
        json.dumps(
            {m: {s: {k: v[k] for k in METRICS} for s, v in r["shapes"].items()} for m, r in result["methods"].items()},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
