"""ADVICE where accuracy is near 50%: the built-in starter set (issue 46; docs/methods.md "ADVICE and ConfTuner").

On HonestyBench-mini (about 11% of greedy answers right) ADVICE cut ECE to 0.69-0.84x of
Default, against the paper's 0.28x, and ConfTuner learned one confidence for everything. The
hypothesis: ADVICE's Sum loss on balanced pairs pulls mean confidence toward 50% and a Brier loss
at an 11% base rate is minimised by a constant near 11%, so a several-fold ECE gain needs a base
accuracy near 50%. The starter set, where the embedded model is right about 42% of the time,
tests it:

1. The starter questions are split by a hash of their text (salt ``advice-balanced``):
   train (60%), dev (15%), test (25%). The same questions land on the same side on every
   machine. Nothing is selected in this run (learning rate, epochs and batch are fixed
   beforehand, see ``--learning-rate``), so the dev part is held back (not even annotated).
2. The train and test questions are annotated once (greedy + 5 samples, 32 tokens:
   HonestyBench-mini's annotation). Triplets come from the train part (the library's builder: greedy answer, samples,
   extra samples, other questions' answers).
3. ConfTuner, ADVICE and ADVICE+ConfTuner train on them (LoRA, the same settings for each arm),
   once per seed (``--seeds``).
4. The same three arms train on HonestyBench-mini's training pool (benchmarks/cache/mini/train,
   made by annotate_mini.py; ``--mini-seeds``) with the same settings: the adapters trained at
   11% accuracy, scored on the same starter test part.
5. Default (the verbal estimators on the base model) and every adapter are scored on the starter
   test part in ScoreLetter and ScoreNumber (the formats ADVICE trains on): ECE, AUROC, mean
   confidence, accuracy, with 95% bootstrap intervals (test questions resampled; the seed mean
   for several seeds), and the ECE ratio to Default with a paired bootstrap interval.

Every stage is cached under benchmarks/cache/advice_balanced (annotations, triplets, adapters
keyed by a hash of their settings and data, confidences), so a killed run resumes:

    nohup nice -n 10 .venv/bin/python -m benchmarks.advice_balanced > benchmarks/cache/advice_balanced.log 2>&1 &

Writes benchmarks/results/advice_balanced.json (partial results are written as runs finish;
``complete`` says whether every requested run is in).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.advice_runs import Settings, run_configs, run_path, score_method, train_all, training_triplets
from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from benchmarks.measure import peak_rss_mib
from benchmarks.mini import annotate_part
from candor.annotation.builder import AnnotateConfig
from candor.annotation.prompts import resolve_template
from candor.annotation.records import Record, read_records
from candor.backends.base import SamplingParams
from candor.backends.default_model import DEFAULT_MODEL
from candor.backends.hf import HFBackend
from candor.data import IN_DOMAIN, load_items
from candor.data.items import QAItem
from candor.data.splits import hash_unit
from candor.evaluation.aggregate import aggregate_metrics
from candor.evaluation.metrics import ece
from candor.train.advice import is_trained
from candor.verbal.formats import FORMATS

SALT = "advice-balanced"
CUTS = {"train": 0.60, "dev": 0.75}  # hash_unit below 0.60: train; below 0.75: dev; else test
ARMS = {"advice": "ADVICE", "conftuner": "ConfTuner", "advice_conftuner": "ADVICE+ConfTuner"}
RUN_NAMES = {"ADVICE": "advice", "ConfTuner": "conftuner", "ADVICE+ConfTuner": "advice+conftuner"}
FORMAT_KEYS = ("letter", "number")
HEADLINE = "number"  # the top-level keys of the results file are ScoreNumber's (both formats are under by_format)
DATASET = "starter"
MINI_TRAIN = 450  # HonestyBench-mini training questions per in-domain dataset


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--seeds", default="0,1,2", help="training seeds of the starter-trained arms")
    p.add_argument("--mini-seeds", default="0", help="training seeds of the HonestyBench-mini-trained arms ('' none)")
    p.add_argument("--mini-cache", type=Path, default=CACHE / "mini", help="annotate_mini.py's annotations")
    p.add_argument(
        "--learning-rate",
        type=float,
        default=1e-3,
        help="fixed, not tuned here: issue 13's choice on HonestyBench-mini's dev slice",
    )
    p.add_argument("--epochs", type=float, default=4.0, help="epochs per run (the paper's 4)")
    p.add_argument("--pairs-per-step", type=int, default=8)
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument(
        "--cached-only",
        action="store_true",
        help="train nothing: report the runs already trained in the cache (e.g. after a stopped run)",
    )
    p.add_argument(
        "--arms",
        default=",".join(RUN_NAMES),
        help="the trained arms, in order (e.g. one per process on a shared machine; runs are cached)",
    )
    p.add_argument(
        "--formats",
        default=",".join(FORMAT_KEYS),
        help=f"verbalized formats scored, among {', '.join(FORMAT_KEYS)} (ScoreNumber is the headline)",
    )
    p.add_argument("--cache", type=Path, default=CACHE / "advice_balanced")
    p.add_argument("--out", type=Path, default=RESULTS / "advice_balanced.json")
    args = p.parse_args()
    args.seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    args.mini_seeds = [int(x) for x in args.mini_seeds.split(",") if x.strip()]
    if not args.seeds:
        raise SystemExit("--seeds: at least one seed")
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not args.arms or set(args.arms) - set(RUN_NAMES):
        raise SystemExit(f"--arms: a subset of {', '.join(RUN_NAMES)}")
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if HEADLINE not in args.formats or set(args.formats) - set(FORMAT_KEYS):
        raise SystemExit(f"--formats: a subset of {', '.join(FORMAT_KEYS)} that includes {HEADLINE}")
    return args


# ---------------------------------------------------------------- data


def starter_split(items: Sequence[QAItem]) -> dict[str, list[QAItem]]:
    """train / dev / test by a hash of each question (identical questions always share a side)."""
    out: dict[str, list[QAItem]] = {"train": [], "dev": [], "test": []}
    for item in items:
        u = hash_unit(item.question, SALT)
        side = "train" if u < CUTS["train"] else "dev" if u < CUTS["dev"] else "test"
        out[side].append(dataclasses.replace(item, split=side))
    return out


def annotated_parts(args: argparse.Namespace, backend: HFBackend) -> dict[str, list]:
    """The train and test parts annotated like HonestyBench-mini (greedy + 5 samples, 32 tokens), resumable.

    The dev part is not annotated: nothing is chosen in this run, so nothing reads it."""
    parts = starter_split(load_items(DATASET))
    template = resolve_template("auto", args.model, backend)
    config = AnnotateConfig(k=5, params=SamplingParams(max_new_tokens=32))
    # annotate_part caches <cache>/<part>/<dataset>.jsonl: one file per part.
    return {
        side: annotate_part({DATASET: parts[side]}, side, backend, template, config, args.cache / "annotations")[
            DATASET
        ]
        for side in ("train", "test")
    } | {"dev": parts["dev"]}


def mini_pool(args: argparse.Namespace) -> list[Record]:
    """HonestyBench-mini's training pool (4 x 450), or exit telling how to make it."""
    out = []
    for dataset in IN_DOMAIN:
        path = args.mini_cache / "train" / f"{dataset}.jsonl"
        if not path.exists():
            sys.exit(f"missing {path}: run `python -m benchmarks.annotate_mini` first, or pass --mini-seeds ''")
        records = read_records(path)
        if len(records) < MINI_TRAIN:  # annotate_mini.py still running: never train on a partial pool
            sys.exit(f"{path}: {len(records)} of {MINI_TRAIN} records; let `python -m benchmarks.annotate_mini` finish")
        out.extend(records)
    return out


def accuracy_of(records: Sequence[Record]) -> dict[str, Any]:
    correct = sum(r.greedy_correct == 1 for r in records)
    return {"n": len(records), "n_correct": correct, "accuracy": round(correct / max(1, len(records)), 4)}


# ---------------------------------------------------------------- training


def settings_for(args: argparse.Namespace, seed: int) -> Settings:
    """issue 13's benchmark settings with this run's fixed lr, epochs, batch and seed; the three arms only."""
    return dataclasses.replace(
        Settings(),
        methods=",".join(ARMS.values()),
        ablation="none",
        seed=seed,
        learning_rate=args.learning_rate,
        epochs=args.epochs,
        pairs_per_step=args.pairs_per_step,
        accumulation=args.accumulation,
        max_triplets=None,
    )


def triplets_of(args: argparse.Namespace, records: list[Record], base: HFBackend, folder: Path) -> dict[str, Any]:
    """The triplets of ``records`` (built once, seed 0, cached under ``folder``) and their summary."""
    built = training_triplets(records, base, folder, settings_for(args, 0))
    built["summary"] = {
        **built["stats"],
        "n": len(built["triplets"]),
        "sources": dict(Counter(t.source for t in built["triplets"])),
    }
    return built


def train_arm(
    args: argparse.Namespace, built: dict[str, Any], records: list[Record], seed: int, arm: str, folder: Path
) -> dict[str, Any] | None:
    """One arm at one seed on the triplets (ConfTuner on the records), trained once (cached by its settings)."""
    configs = run_configs(args, settings_for(args, seed), args.learning_rate, len(built["triplets"]))
    name = RUN_NAMES[arm]
    if args.cached_only and not is_trained(run_path(folder, configs[name], built["key"])):
        logger.info("%s seed %d: not trained yet, left out (--cached-only)", arm, seed)
        return None
    return train_all({name: configs[name]}, built["triplets"], records, folder, built["key"])[name]


# ---------------------------------------------------------------- scoring


def scored(
    method: str, backend: HFBackend, test: list[Record], folder: Path, formats: Sequence[str]
) -> dict[str, tuple]:
    """``{format: (confidence, correct)}`` on the starter test part, cached under ``folder``."""
    per_format = score_method(method, backend, {DATASET: test}, Settings(), folder, None, formats)
    return {f: per_format[f][DATASET] for f in formats}


def adapter_scores(args: argparse.Namespace, run: dict[str, Any], test: list[Record], folder: Path) -> dict:
    """``{format: (confidence, correct)}`` of one trained adapter on the test part."""
    backend = HFBackend.from_pretrained(args.model, adapter=run["dir"])
    return scored("trained", backend, test, folder / "confidences" / f"run-{Path(run['dir']).name}", args.formats)


def training_summary(runs: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    return {
        f"seed {s}": {n: {k: r[k] for k in ("examples", "wall_s", "peak_rss_mib")} for n, r in by.items()}
        for s, by in runs.items()
    }


def block(seeds: list[dict[str, tuple]], fmt: str, bootstrap: int) -> dict[str, Any]:
    """ECE, AUROC, mean confidence and accuracy of one method in one format: seed means with 95% intervals."""
    per_seed = [{DATASET: s[fmt][0]} for s in seeds]
    labels = {DATASET: seeds[0][fmt][1]}
    result = aggregate_metrics(
        {"m": per_seed},
        labels,
        metrics=("ece", "auroc", "accuracy"),
        ci_metrics=("ece", "auroc"),
        bootstrap=bootstrap,
        seed=0,
    ).methods["m"]
    values, ci = result.values[DATASET], result.ci.get(DATASET, {})
    return {
        "ece": _num(values["ece"]),
        "ece_ci": [_num(x) for x in ci.get("ece", (None, None))],  # basic interval around ece_corrected
        "ece_corrected": _num(result.corrected.get(DATASET, {}).get("ece", float("nan"))),
        "auroc": _num(values["auroc"]),
        "auroc_ci": [_num(x) for x in ci.get("auroc", (None, None))],
        **mean_confidence([s[fmt][0] for s in seeds], bootstrap),
        "accuracy": _num(values["accuracy"]),
        "n": int(len(labels[DATASET])),
        "n_correct": int(labels[DATASET].sum()),
        "seeds": len(seeds),
        "ece_per_seed": [_num(x) for x in result.per_seed[DATASET]["ece"]],
    }


def mean_confidence(per_seed: list[np.ndarray], bootstrap: int) -> dict[str, Any]:
    """Mean stated confidence (seed mean) with a 95% bootstrap interval over the test questions."""
    conf = np.mean(per_seed, axis=0)  # the seed mean of a mean is the mean of the per-question seed means
    rng = np.random.default_rng(0)
    draws = [conf[rng.integers(0, conf.size, conf.size)].mean() for _ in range(bootstrap)]
    low, high = np.percentile(draws, [2.5, 97.5])
    return {"mean_confidence": _num(conf.mean()), "mean_confidence_ci": [_num(low), _num(high)]}


def ece_ratio(default: dict[str, tuple], seeds: list[dict[str, tuple]], fmt: str, bootstrap: int) -> dict[str, Any]:
    """ECE of the method (seed mean) / ECE of Default, with a paired bootstrap over the test questions."""
    y = default[fmt][1]
    base, arms = default[fmt][0], [s[fmt][0] for s in seeds]

    def ratio(index: np.ndarray) -> float:
        bottom = ece(base[index], y[index])
        return float(np.mean([ece(c[index], y[index]) for c in arms]) / bottom) if bottom > 0 else float("nan")

    rng = np.random.default_rng(0)
    draws = np.array([ratio(rng.integers(0, len(y), len(y))) for _ in range(bootstrap)])
    kept = draws[np.isfinite(draws)]
    ci = np.percentile(kept, [2.5, 97.5]) if kept.size else (np.nan, np.nan)
    return {
        "ratio": _num(ratio(np.arange(len(y)))),
        "ci95": [_num(ci[0]), _num(ci[1])],
        "undefined_resamples": int(draws.size - kept.size),
    }


def method_blocks(default: dict[str, tuple], arms: dict[str, list[dict[str, tuple]]], bootstrap: int) -> dict[str, Any]:
    """The results file's method keys: each a headline block (ScoreNumber) plus ``by_format`` and the ECE ratio."""
    out: dict[str, Any] = {}
    for key, seeds in {"default": [default], **{k: arms[name] for k, name in ARMS.items() if arms.get(name)}}.items():
        by_format = {FORMATS.get(f).name: block(seeds, f, bootstrap) for f in default}
        entry = {**by_format[FORMATS.get(HEADLINE).name], "by_format": by_format}
        if key != "default":
            entry["ece_ratio_to_default"] = {
                FORMATS.get(f).name: ece_ratio(default, seeds, f, bootstrap) for f in default
            }
        out[key] = entry
    return out


def honestybench_ratios(path: Path) -> dict[str, Any] | None:
    """ADVICE's ECE / Default's on HonestyBench-mini in-domain (issue 13's results/advice.json), for the hypothesis."""
    if not path.exists():
        return None
    import json

    d = json.loads(path.read_text())
    out = {}
    for fmt, cell in d.get("ece_factor_vs_default", {}).get("ADVICE", {}).items():
        factor = cell.get("id", {}).get("factor")
        low, high = cell.get("id", {}).get("ci", [None, None])
        out[fmt] = {
            "ratio": _num(1 / factor) if factor else None,
            "ci95": [_num(1 / high) if high else None, _num(1 / low) if low else None],
            "accuracy": d["methods"]["Default"][fmt]["id"]["accuracy"],
        }
    return {
        "source": "results/advice.json (issue 13: ADVICE trained on 3,082 HonestyBench-mini triplets, 1 epoch)",
        "by_format": out,
    }


def verdict(payload: dict[str, Any]) -> str:
    """Whether the hypothesis holds, from the intervals (no stretching a small test set)."""
    advice = payload.get("advice", {}).get("ece_ratio_to_default", {})
    cells = advice.get(FORMATS.get(HEADLINE).name)
    if not cells or cells["ci95"][0] is None:
        return "not yet measured"
    low, high = cells["ci95"]
    hb = (payload.get("honestybench_mini_reference") or {}).get("by_format", {}).get(FORMATS.get(HEADLINE).name)
    if high < 0.5:
        text = f"ADVICE cuts ECE at least 2x on the starter test part (ratio interval [{low:.2f}, {high:.2f}])"
    elif low > 0.5:
        text = (
            f"ADVICE does not cut ECE several-fold on the starter test part either (ratio interval "
            f"[{low:.2f}, {high:.2f}] stays above 0.5)"
        )
    else:
        text = (
            f"inconclusive: the ratio interval [{low:.2f}, {high:.2f}] spans both a several-fold cut and none; "
            f"the test part ({payload['split']['test']['n']} questions) is too small to decide"
        )
    if hb:
        text += f"; on HonestyBench-mini ({100 * hb['accuracy']:.0f}% accuracy) the ratio was {hb['ratio']:.2f}"
    return text


def train_mini(
    args: argparse.Namespace, base: HFBackend, test: list[Record], default: dict, payload: dict[str, Any]
) -> None:
    """The three arms trained on HonestyBench-mini's pool (11% accuracy), scored on the starter test part."""
    pool = mini_pool(args)
    built = triplets_of(args, pool, base, args.cache / "honestybench-mini")
    arms: dict[str, list] = {}
    runs: dict[int, dict[str, Any]] = {}
    for seed in args.mini_seeds:
        for arm in args.arms:
            run = train_arm(args, built, pool, seed, arm, args.cache / "honestybench-mini")
            if run is None:
                continue
            runs.setdefault(seed, {})[RUN_NAMES[arm]] = run
            arms.setdefault(arm, []).append(adapter_scores(args, run, test, args.cache))
    blocks = method_blocks(default, arms, args.bootstrap)
    blocks.pop("default")
    payload["honestybench_mini_trained"] = {
        "pool": accuracy_of(pool),
        "triplets": built["summary"],
        "training": training_summary(runs),
        **blocks,
    }


def _num(x: Any) -> float | None:
    return None if x is None or x != x else round(float(x), 4)


# ---------------------------------------------------------------- main


def main() -> None:
    setup_logging()
    args = parse_args()
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    base = HFBackend.from_pretrained(args.model)
    parts = annotated_parts(args, base)
    seconds["annotate"] = time.perf_counter() - clock
    test = parts["test"]
    payload: dict[str, Any] = {
        "benchmark": "ADVICE / ConfTuner on the starter set (issue 46)",
        "model": args.model,
        "command": shlex.join(["python", "-m", "benchmarks.advice_balanced", *sys.argv[1:]]),
        "split": {
            "salt": SALT,
            "cuts": CUTS,
            **{side: accuracy_of(parts[side]) for side in ("train", "test")},
            "dev": {
                "n": len(parts["dev"]),
                "use": "held back, not annotated: nothing is selected in this run (lr, epochs, batch fixed beforehand)",
            },
        },
        "settings": {
            "learning_rate": args.learning_rate,
            "epochs": args.epochs,
            "pairs_per_step": args.pairs_per_step,
            "accumulation": args.accumulation,
            "seeds": args.seeds,
            "mini_seeds": args.mini_seeds,
            "bootstrap": args.bootstrap,
            "formats": [FORMATS.get(f).name for f in args.formats],
            "headline_format": FORMATS.get(HEADLINE).name,
        },
        "honestybench_mini_reference": honestybench_ratios(RESULTS / "advice.json"),
    }
    clock = time.perf_counter()
    default = scored("Default", base, test, args.cache / "confidences" / "default", args.formats)
    seconds["score_default"] = time.perf_counter() - clock
    arms: dict[str, list] = {}
    payload["complete"] = False

    def write() -> None:
        payload.update(method_blocks(default, arms, args.bootstrap))
        advice_ratio = payload.get("advice", {}).get("ece_ratio_to_default", {}).get(FORMATS.get(HEADLINE).name)
        payload["ece_ratio_advice_to_default"] = advice_ratio
        payload["hypothesis"] = verdict(payload)
        payload["seconds"] = {k: round(v, 1) for k, v in seconds.items()}
        payload["peak_rss_mib"] = round(peak_rss_mib(), 1)
        write_json(args.out, payload)
        logger.info("wrote %s", args.out)

    write()
    built = triplets_of(args, parts["train"], base, args.cache / "starter")
    payload["triplets"] = built["summary"]
    runs: dict[int, dict[str, Any]] = {}
    for i, seed in enumerate(args.seeds):
        for arm in args.arms:  # ADVICE first by default: the ratio the hypothesis is about is written first
            clock = time.perf_counter()
            run = train_arm(args, built, parts["train"], seed, arm, args.cache / "starter")
            if run is None:
                continue
            runs.setdefault(seed, {})[RUN_NAMES[arm]] = run
            seconds[f"train_{RUN_NAMES[arm]}_seed{seed}"] = time.perf_counter() - clock
            arms.setdefault(arm, []).append(adapter_scores(args, run, test, args.cache))
            payload["training"] = training_summary(runs)
            write()
        if i == 0 and args.mini_seeds:  # the 11%-accuracy arms right after the first seed: the comparison first
            train_mini(args, base, test, default, payload)
            write()
    payload["complete"] = True
    write()


if __name__ == "__main__":
    main()
