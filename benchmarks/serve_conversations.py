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

With ``--rows system-prompt`` (issue 54), the same test questions are asked after one fixed
system message (:data:`SYSTEM_PROMPT`, as an agent framework sends one), and the first
``--per-dataset`` of each in-domain **dev** set are asked both alone and after it. A Platt calibrator
and a threshold for :data:`COVERAGE` coverage are fitted on the dev answers (a) asked alone and
(b) asked after the system prompt, and each is applied to the test questions asked after the system
prompt: their ECE, and the coverage and accuracy the threshold gives there. Nothing is fitted on the
test questions; the intervals resample the test questions (the fitted calibrators are held fixed).

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
from candor.evaluation.calibration import get_calibrator
from candor.evaluation.metrics import accuracy, auroc, ece
from candor.serve import HonestModel
from candor.serve import thresholds as th
from candor.serve.answering import Ask, Reply
from candor.serve.shapes import system_shape

SHAPES = {1: "single", 2: "2-turn", 3: "3-turn"}  # turns in the chat, the last one being the question scored
ROWS = ("conversations", "system-prompt")
# A system message as agent frameworks send one (written for candor); the rows name it by its shape.
SYSTEM_PROMPT = "You are a helpful assistant. Answer the user's question accurately and concisely."
CALIBRATOR = "platt"  # two parameters: what 64 dev answers can fit
COVERAGE = 0.5  # the threshold's target on dev: answer the more confident half
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
    p.add_argument(
        "--rows",
        default=",".join(ROWS),
        help="which rows to run and write, comma-separated: conversations (single, 2- and 3-turn), "
        "system-prompt (calibration tuned alone vs with the system prompt); the JSON keeps the others' rows",
    )
    args = p.parse_args()
    if args.per_dataset < 4 or args.batch < 1 or args.bootstrap < 1:
        p.error("--per-dataset must be at least 4, --batch and --bootstrap at least 1")
    args.rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(args.rows) - set(ROWS))
    if unknown or not args.rows:
        p.error(f"--rows: unknown {unknown or 'empty'}; known: {', '.join(ROWS)}")
    return args


# ---------------------------------------------------------------- the chats


def select_questions(mini: Any, per_dataset: int, part: str = "test_id") -> list[QAItem]:
    """The first ``per_dataset`` of each in-domain set of ``part``, taken in turn, so any prefix mixes the datasets."""
    parts = [getattr(mini, part)[name][:per_dataset] for name in IN_DOMAIN]
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
    """Rows keyed by (method, turns, question id, earlier question ids, system-prompt shape), appended and fsync'd
    one batch at a time."""

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
        return row["method"], row["turns"], row["id"], tuple(row["earlier"]), row.get("system")

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
    system: str | None = None,
) -> None:
    """Answer (as the server does) the questions of ``todo`` not cached yet; judge and cache them.

    ``system``: the shape of the system prompt the questions are asked after (their history is that
    one system message), None for none.
    """
    judge = get_correctness_judge(AnnotateConfig().correctness_judge)
    missing = [
        (t, ids)
        for t, ids in zip(todo, earlier_ids, strict=True)
        if (model.method, turns, t[0].id, tuple(ids), system) not in cache.rows
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
        unscored = answer.abstained and answer.reason.startswith("the answer could not be scored")
        if (answer.abstained and not unscored) or not answer.scores_returned_text:
            raise RuntimeError(f"{item.id}: expected the scored answer, got {answer}")  # no threshold is set
        # An answer the method cannot score (an empty one) is served as an abstention at confidence 0: kept
        # so, as a wrong answer.
        text = "" if unscored else answer.answer
        correct = 0 if unscored else int(judge.judge([text], [list(item.answers)])[0])
        rows.append(
            {
                "method": model.method,
                "turns": turns,
                "id": item.id,
                "dataset": item.dataset,
                "earlier": list(ids),
                "history_turns": len(hist) // 2,
                **({} if system is None else {"system": system}),
                "answer": text,
                **({"unscored": True} if unscored else {}),
                "confidence": answer.confidence,
                "correct": correct,
            }
        )
    cache.add(rows)
    asked = SHAPES[turns] if system is None else f"after {system}"
    logger.info("%s %s: %d answered in %.1f s", model.method, asked, len(rows), time.perf_counter() - start)


def batches(seq: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def run(
    args: argparse.Namespace,
    items: list[QAItem],
    devs: list[QAItem],
    partners: list[tuple[int, int]],
    cache: AnswerCache,
) -> None:
    from candor.backends import load_backend

    backend = load_backend(args.model)
    methods = [m for m in args.methods.split(",") if m]
    if "system-prompt" in args.rows:
        run_system_prompt(args, [HonestModel(backend, confidence=m) for m in methods], items, devs, cache)
    if "conversations" not in args.rows:
        return
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


def run_system_prompt(
    args: argparse.Namespace, models: list[HonestModel], tests: list[QAItem], devs: list[QAItem], cache: AnswerCache
) -> None:
    """Dev questions alone and after the system prompt, test questions after it; every method per chunk."""
    system = (("system", SYSTEM_PROMPT),)
    shape = system_shape(SYSTEM_PROMPT)
    asked = ((devs, (), None), (devs, system, shape), (tests, system, shape))
    for start in range(0, max(len(devs), len(tests)), args.batch):
        for model in models:
            for items, hist, name in asked:
                chunk = items[start : start + args.batch]
                todo = [(item, (), hist) for item in chunk]
                answer_missing(model, cache, todo, 1, [[] for _ in chunk], name)


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


def system_prompt_row(rows: Sequence[Row], devs: Sequence[QAItem], tests: Sequence[QAItem], args: Any) -> dict:
    """Calibration on test questions asked after the system prompt, fitted on dev (a) alone, (b) after it.

    For each tuning: the Platt calibrator's test ECE, and the test coverage and accuracy of the
    threshold chosen on the same dev answers for :data:`COVERAGE` coverage; paired bootstrap over
    the test questions for (b) minus (a).
    """
    shape = system_shape(SYSTEM_PROMPT)

    def arrays(items: Sequence[QAItem], system: str | None) -> tuple[np.ndarray, np.ndarray]:
        by_id = {r["id"]: r for r in rows if r["turns"] == 1 and r.get("system") == system}
        kept = [by_id[i.id] for i in items if i.id in by_id]
        return np.array([r["confidence"] for r in kept], float), np.array([r["correct"] for r in kept], int)

    test_conf, test_y = arrays(tests, shape)
    tunings = {"alone": arrays(devs, None), "system_prompt": arrays(devs, shape)}
    if min(len(test_y), *(len(y) for _, y in tunings.values())) < 2:
        return {}
    fitted = {}
    for name, (conf, y) in tunings.items():
        calibrator = get_calibrator(CALIBRATOR).fit(conf, y)
        threshold = th.choose(conf, y, "coverage", COVERAGE)
        fitted[name] = (calibrator.predict(test_conf), threshold.value, len(y))

    def values(index: np.ndarray | slice) -> dict[str, dict[str, float]]:
        y = test_y[index]
        out = {}
        for name, (calibrated, cut, _) in fitted.items():
            answered = test_conf[index] >= cut
            out[name] = {
                "ece": _metric(ece, calibrated[index], y),
                "coverage": float(answered.mean()),
                "answered_accuracy": float(y[answered].mean()) if answered.any() else float("nan"),
            }
        out["raw"] = {"ece": _metric(ece, test_conf[index], y), "auroc": _metric(auroc, test_conf[index], y)}
        return out

    point = values(slice(None))
    rng = np.random.default_rng(args.seed)
    n = len(test_y)
    draws = [values(rng.integers(0, n, n)) for _ in range(args.bootstrap)]
    with_ci = {
        part: {m: {"value": _num(v), "ci95": _interval([d[part][m] for d in draws])} for m, v in metrics.items()}
        for part, metrics in point.items()
    }
    return {
        "system_prompt": SYSTEM_PROMPT,
        "shape": shape,
        "n_test": n,
        "test_accuracy": _num(float(test_y.mean())),
        "calibrator": CALIBRATOR,
        "coverage_target": COVERAGE,
        "raw": with_ci["raw"],
        "tuned": {
            name: {"n_dev": n_dev, "threshold": _num(cut), **with_ci[name]} for name, (_, cut, n_dev) in fitted.items()
        },
        "system_prompt_minus_alone": {
            m: {
                "value": _num(point["system_prompt"][m] - point["alone"][m]),
                "ci95": _interval([d["system_prompt"][m] - d["alone"][m] for d in draws]),
            }
            for m in ("ece", "coverage")
        },
    }


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


def payload(
    args: argparse.Namespace, items: list[QAItem], devs: list[QAItem], cache: AnswerCache, seconds: float
) -> dict[str, Any]:
    """The JSON of the rows run; the rows not run are kept from ``--out`` as they were."""
    kept = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    methods = [m for m in args.methods.split(",") if m]
    out = dict(kept) if "conversations" not in args.rows else conversations_payload(args, items, cache, seconds)
    if "system-prompt" in args.rows:
        by_method = {}
        for method in methods:
            rows = [r for r in cache.rows.values() if r["method"] == method]
            row = system_prompt_row(rows, devs, items, args)
            if row:
                by_method[method] = row
        out["system_prompt"] = {
            "benchmark": "calibration after a fixed system prompt: tuned on questions alone vs with that system prompt",
            "dev_questions": "HonestyBench-mini in-domain dev, the first per dataset, pooled",
            "per_dataset": args.per_dataset,
            "methods": by_method,
            "seconds": round(seconds, 1),
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "command": command(),
            "answered_by": answered_by(args.cache),
        }
    elif "system_prompt" in kept:
        out["system_prompt"] = kept["system_prompt"]
    return out


def conversations_payload(
    args: argparse.Namespace, items: list[QAItem], cache: AnswerCache, seconds: float
) -> dict[str, Any]:
    wanted = {item.id for item in items}
    methods = {}
    for method in [m for m in args.methods.split(",") if m]:
        rows = [
            r for r in cache.rows.values() if r["method"] == method and r["id"] in wanted and r.get("system") is None
        ]
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
    devs = select_questions(mini, args.per_dataset, part="dev")
    partners = draw_partners(len(items), args.seed)
    cache = AnswerCache(args.cache)
    start = time.perf_counter()
    meta = args.cache.with_suffix(".command")
    if not args.summarize_only:
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(command() + "\n", encoding="utf-8")
        run(args, items, devs, partners, cache)
    result = payload(args, items, devs, cache, time.perf_counter() - start)
    write_json(args.out, result)
    logger.info("wrote %s", args.out)
    shown = {m: {s: {k: v[k] for k in METRICS} for s, v in r["shapes"].items()} for m, r in result["methods"].items()}
    if "system_prompt" in result:
        shown["system_prompt"] = {
            m: {name: t["ece"]["value"] for name, t in r["tuned"].items()}
            for m, r in result["system_prompt"]["methods"].items()
        }
    print(json.dumps(shown, indent=1))


if __name__ == "__main__":
    main()
