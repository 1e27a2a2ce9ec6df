"""What abstention buys on HonestyBench-mini: answered accuracy vs coverage, and generation time saved.

Methods (embedded default model, annotations of ``benchmarks/cache/mini``):

- **EliCal**: a ``head``-mode EliCal head (stage 1 on the training pool's
  consistency rates, stage 2 on all its labels), early-stopped on dev;
  cached under ``benchmarks/cache/selective/head-<digest of its records and settings>``.
- **best training-free**: of ``prob``, ``n-prob``, ``min-prob``,
  ``consis-lex`` and ``consis-sem``, the one with the highest AUROC on the
  *dev* part (never chosen on test).
- **random**: a seeded uniform confidence, the no-information baseline.

For each: accuracy of the answered test questions at coverage 10% … 100%
(in-domain test and OOD test apart); and thresholds chosen on dev only,
evaluated on test: a 50% coverage target and risk control (answered error
≤ α with probability 1 − δ; the assumption, exchangeable dev and test,
holds for the in-domain test split by construction, not for OOD).

Abstention-aware scores: every method (each training-free candidate too) at
its risk-controlled threshold (chosen on dev) gets, per test split, the counts
correct / incorrect / abstained, SimpleQA's F, the incorrect share overall
(``overall_incorrect``; the key was ``hallucination_rate`` in results written
before issue 56), AA-Omniscience's hallucination rate and the
penalized score (``candor.evaluation.abstention``, 1000-resample bootstrap
intervals under ``abstention``), as ``methods.<method>.<score>.<split>``.

Generation time saved: the same in-domain test questions answered twice
through :class:`candor.serve.HonestModel`, once with EliCal deciding before
generating (threshold for 50% dev coverage) and once with an answer-level
confidence (n-prob, which must generate every answer first); the ratio of
the wall times is the saving.

    PYTHONPATH=src python -m benchmarks.selective [--timing-questions 64]

Writes benchmarks/results/selective.json and benchmarks/results/selective.png.
``--skip-elical`` leaves out the EliCal head and the timing (no training pool
needed); ``--block NAME`` then writes the run into key NAME of the existing
selective.json, leaving the rest of it as it was.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from candor.annotation.records import Record, read_records
from candor.data.mini import IN_DOMAIN, OUT_OF_DOMAIN
from candor.estimators import get_estimator
from candor.evaluation.abstention import abstention_scores
from candor.evaluation.metrics import auroc
from candor.serve import Decoding, HonestModel
from candor.serve import thresholds as th
from candor.serve.confidence_sources import HeadSource

CANDIDATES = ("prob", "n-prob", "min-prob", "consis-lex", "consis-sem")
ABSTENTION_KEYS = (
    "correct",
    "incorrect",
    "abstained",
    "simpleqa_f",
    "overall_incorrect",
    "omniscience_hallucination_rate",
    "penalized_score",
)
COVERAGES = tuple(round(0.1 * i, 1) for i in range(1, 11))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--annotations", type=Path, default=CACHE / "mini")
    p.add_argument("--cache", type=Path, default=CACHE / "selective")
    p.add_argument("--coverage", type=float, default=0.5, help="dev coverage target")
    p.add_argument("--alpha", type=float, default=0.6, help="risk control: answered error at most alpha")
    p.add_argument("--delta", type=float, default=0.1, help="risk control: with probability 1 - delta")
    p.add_argument("--timing-questions", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--skip-elical", action="store_true", help="no EliCal head, no timing (no training pool needed)")
    p.add_argument("--block", default=None, help="write into this key of the existing selective.json")
    p.add_argument(
        "--prefetch",
        action="store_true",
        help="only cache the backbone features of the dev and test prompts (no training data needed)",
    )
    return p.parse_args()


def load_part(root: Path, part: str, datasets: tuple[str, ...]) -> list[Record]:
    """Labelled records of one part; records without a correctness label are skipped and counted."""
    out: list[Record] = []
    for dataset in datasets:
        path = root / part / f"{dataset}.jsonl"
        if not path.exists():
            sys.exit(f"missing {path}: HonestyBench-mini annotations are needed (see `python -m benchmarks.baselines`)")
        records = read_records(path)
        labelled = [r for r in records if r.greedy_correct is not None]
        if len(labelled) < len(records):
            logger.warning("%s: skipped %d records without greedy correctness", path, len(records) - len(labelled))
        out.extend(labelled)
    return out


def train_head(args: argparse.Namespace, train: list[Record], dev: list[Record]) -> Path:
    from candor.train.elical import WHOLE_POOL, EliCalConfig, train_elical
    from candor.util.digests import json_digest, records_digest

    config = EliCalConfig(mode="head", model=args.model, seed=args.seed, feature_cache=feature_root(args))
    # Keyed by what determines the head: its training and dev records (verdicts included) and its settings.
    key = json_digest([records_digest(train), records_digest(dev), config.fingerprint()])[:16]
    folder = args.cache / f"head-{key}"
    if (folder / "elical_config.json").exists():
        logger.info("reusing the EliCal head in %s", folder)
        return folder
    train_elical(train, dev, method="elical", budget=WHOLE_POOL, config=config, out_dir=folder)
    return folder


def feature_root(args: argparse.Namespace) -> str:
    return str(args.cache / "features")


def prefetch(args: argparse.Namespace, records: list[Record]) -> None:
    """Fill the feature cache for ``records``' prompts (head mode reads the frozen backbone only)."""
    from candor.train.common import load_causal_lm
    from candor.train.elical import ConfidenceHead, HeadConfig
    from candor.train.elical.pipeline import head_features

    model, tokenizer = load_causal_lm(args.model)
    template = str(records[0].provenance.get("template") or "fewshot")
    head = ConfidenceHead.create(model, tokenizer, HeadConfig(backbone=args.model, template=template))
    head_features(head, head.prompts(records), feature_root(args))


def elical_scores(args: argparse.Namespace, folder: Path, records: list[Record]) -> np.ndarray:
    """The head's confidences through the feature cache (the same numbers as ``predict``, computed once)."""
    import torch

    from candor.train.elical import ConfidenceHead
    from candor.train.elical.pipeline import head_features

    head = ConfidenceHead.from_pretrained(folder)
    features = head_features(head, head.prompts(records), feature_root(args))
    with torch.no_grad():
        return head.head(torch.from_numpy(features)).double().numpy()


def correct_of(records: list[Record]) -> np.ndarray:
    return np.array([int(r.greedy_correct) for r in records])  # type: ignore[arg-type]


def curve_at(conf: np.ndarray, correct: np.ndarray) -> list[dict[str, float]]:
    """Answered accuracy at each coverage level (the smallest threshold cut reaching it)."""
    curve = th.selective_curve(conf, correct)
    out = []
    for c in COVERAGES:
        i = int(np.flatnonzero(curve["coverage"] >= c - 1e-12)[0])
        out.append({"target": c, "coverage": float(curve["coverage"][i]), "accuracy": float(curve["accuracy"][i])})
    return out


def on_test(t: th.Threshold, conf: np.ndarray, correct: np.ndarray) -> dict[str, Any]:
    acc, cov = th.accuracy_and_coverage(conf, correct, t.value)
    return {
        "threshold": t.value,
        "dev_accuracy": t.expected_accuracy,
        "dev_coverage": t.expected_coverage,
        "test_accuracy": acc,
        "test_coverage": cov,
    }


def scores(args: argparse.Namespace, head: Path | None, dev: list[Record], tests: dict[str, list[Record]]) -> dict:
    """method → split → confidences; the training-free method is picked by dev AUROC (every one is kept too)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    if head is not None:
        out["EliCal"] = {"dev": elical_scores(args, head, dev)}
        for split, records in tests.items():
            out["EliCal"][split] = elical_scores(args, head, records)
    dev_auroc = {}
    free: dict[str, dict[str, np.ndarray]] = {}
    for name in CANDIDATES:
        estimator = get_estimator(name)
        free[name] = {"dev": estimator.estimate(dev), **{s: estimator.estimate(r) for s, r in tests.items()}}
        dev_auroc[name] = auroc(free[name]["dev"], correct_of(dev))
    best = max(dev_auroc, key=lambda n: dev_auroc[n])
    out[f"best training-free ({best})"] = free[best]
    rng = np.random.default_rng(args.seed)
    out["random"] = {"dev": rng.uniform(size=len(dev)), **{s: rng.uniform(size=len(r)) for s, r in tests.items()}}
    out.update(free)
    logger.info("dev AUROC of the training-free candidates: %s; best: %s", dev_auroc, best)
    return {"scores": out, "dev_auroc": dev_auroc, "best": best}


def timing(args: argparse.Namespace, head: Path, dev: list[Record], questions: list[str]) -> dict[str, Any]:
    """Wall time of answering ``questions`` with EliCal deciding first vs an answer-level confidence."""
    from candor.backends import load_backend

    backend = load_backend(args.model)
    decoding = Decoding(max_new_tokens=args.max_new_tokens)
    elical = HonestModel(backend, HeadSource(head), decoding=decoding)
    elical.tune(dev, "coverage", args.coverage)
    nprob = HonestModel(backend, "n-prob", decoding=decoding)
    nprob.tune(dev, "coverage", args.coverage)
    nprob.answer_batch(questions[:4])  # warm-up (caches, allocator)
    start = time.perf_counter()
    late = [a[0] for a in nprob.answer_batch(questions)]
    late_s = time.perf_counter() - start
    start = time.perf_counter()
    early = [a[0] for a in elical.answer_batch(questions)]
    early_s = time.perf_counter() - start
    return {
        "questions": len(questions),
        "max_new_tokens": args.max_new_tokens,
        "answer_level_seconds": round(late_s, 2),
        "answer_level_answered": sum(not a.abstained for a in late),
        "elical_seconds": round(early_s, 2),
        "elical_declined_before_generating": sum(a.abstained for a in early),
        "time_ratio_answer_level_over_elical": round(late_s / early_s, 3),
    }


def plot(payload: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, split in zip(axes, ("in-domain test", "OOD test"), strict=True):
        for name, entry in payload["methods"].items():
            pts = entry["curve"][split]
            ax.plot([p["coverage"] for p in pts], [p["accuracy"] for p in pts], marker="o", ms=3, label=name)
        ax.set_title(split)
        ax.set_xlabel("coverage (fraction answered)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy of answered questions")
    axes[0].legend(fontsize=8)
    fig.suptitle("Selective answering on HonestyBench-mini (SmolLM2-135M)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    setup_logging()
    dev = load_part(args.annotations, "dev", IN_DOMAIN)
    tests = {
        "in-domain test": load_part(args.annotations, "test", IN_DOMAIN),
        "OOD test": load_part(args.annotations, "test", OUT_OF_DOMAIN),
    }
    if args.prefetch:
        prefetch(args, dev + [r for records in tests.values() for r in records])
        return
    train = [] if args.skip_elical else load_part(args.annotations, "train", IN_DOMAIN)
    logger.info("train %d, dev %d, test %s", len(train), len(dev), {k: len(v) for k, v in tests.items()})
    t0 = time.perf_counter()
    head = None if args.skip_elical else train_head(args, train, dev)
    scored = scores(args, head, dev, tests)
    dev_y = correct_of(dev)
    methods: dict[str, Any] = {}
    for name, conf in scored["scores"].items():
        entry: dict[str, Any] = {"curve": {}, "dev_chosen": {}}
        rules = {
            f"coverage {args.coverage}": th.for_coverage(conf["dev"], dev_y, args.coverage),
            f"risk alpha={args.alpha} delta={args.delta}": th.risk_control(conf["dev"], dev_y, args.alpha, args.delta),
        }
        risk = rules[f"risk alpha={args.alpha} delta={args.delta}"]
        entry["abstention"] = {}
        entry.update({key: {} for key in ABSTENTION_KEYS})
        for split, records in tests.items():
            y = correct_of(records)
            entry["curve"][split] = curve_at(conf[split], y)
            entry["test_auroc_" + split] = auroc(conf[split], y)
            entry["dev_chosen"][split] = {rule: on_test(t, conf[split], y) for rule, t in rules.items()}
            scored = abstention_scores(conf[split], y, risk.value, bootstrap=1000, seed=args.seed)
            entry["abstention"][split] = scored
            for key in ABSTENTION_KEYS:
                entry[key][split] = scored[key]
        methods[name] = entry
    if args.block:
        write_block(args, methods, {k: len(v) for k, v in tests.items()}, time.perf_counter() - t0)
        return
    questions = [r.item.question for r in tests["in-domain test"]][: args.timing_questions]
    payload = {
        "command": "PYTHONPATH=src python -m benchmarks.selective " + " ".join(sys.argv[1:]),
        "model": args.model,
        "sizes": {"train": len(train), "dev": len(dev), **{k: len(v) for k, v in tests.items()}},
        "base_accuracy": {k: float(correct_of(v).mean()) for k, v in tests.items()},
        "dev_auroc_training_free": scored["dev_auroc"],
        "methods": methods,
        "generation_time": timing(args, head, dev, questions),
        "seconds": round(time.perf_counter() - t0, 1),
        "note": "thresholds chosen on dev only; risk control assumes exchangeable dev and test (in-domain only)",
    }
    write_json(args.out_dir / "selective.json", payload)
    plot(payload, args.out_dir / "selective.png")
    for name, entry in methods.items():
        pts = entry["curve"]["in-domain test"]
        print(
            f"{name:>36}: in-domain acc@30% {pts[2]['accuracy']:.3f}, @50% {pts[4]['accuracy']:.3f}, "
            f"@100% {pts[9]['accuracy']:.3f}"
        )
    g = payload["generation_time"]
    print(
        f"generation time, answer-level / EliCal-first: {g['time_ratio_answer_level_over_elical']:.2f}x "
        f"({g['elical_declined_before_generating']} of {g['questions']} declined before generating)"
    )
    print(f"wrote {args.out_dir / 'selective.json'} and {args.out_dir / 'selective.png'}")


def write_block(args: argparse.Namespace, methods: dict[str, Any], sizes: dict[str, int], seconds: float) -> None:
    """This run (no EliCal, no timing) into key ``--block`` of the existing selective.json; the rest stays."""
    path = args.out_dir / "selective.json"
    payload = json.loads(path.read_text())
    payload[args.block] = {
        "command": "PYTHONPATH=src python -m benchmarks.selective " + " ".join(sys.argv[1:]),
        "annotations": str(args.annotations),
        "sizes": sizes,
        "seconds": round(seconds, 1),
        "threshold_rule": f"risk control alpha={args.alpha} delta={args.delta}, chosen on dev",
        "methods": methods,
    }
    write_json(path, payload)
    for name, entry in methods.items():
        print(f"{name:>36}: " + ", ".join(f"{k} {entry[k]['in-domain test']}" for k in ABSTENTION_KEYS))


if __name__ == "__main__":
    main()
