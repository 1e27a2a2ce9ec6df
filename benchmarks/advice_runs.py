"""ADVICE and ConfTuner in the benchmarks: settings, triplets, training runs and a method's scored confidences.

Every training run's folder is named by a hash of its settings and data (:func:`run_path`), so the
same run is trained once and a changed one anew; confidences are cached per method and dataset.
``advice.py`` (HonestyBench-mini) and ``advice_balanced.py`` (the starter set) run them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import write_json
from candor.annotation.records import Record
from candor.backends.hf import HFBackend
from candor.estimators.confidences import ConfidenceTable, read_confidences, score_into, write_confidences
from candor.evaluation.report import safe_filenames
from candor.train.advice import LossWeights, build_triplets, method_config, read_triplets, train, write_triplets
from candor.train.advice.config import AdviceConfig
from candor.train.advice.pipeline import is_trained, load_result
from candor.util.digests import records_digest

logger = logging.getLogger("benchmarks.advice")

FORMAT_KEYS = ("letter", "number", "text", "float", "percent")
FORMAT_ORDER = (("letter", "number"), ("text", "float"), ("percent",))  # the scoring order (trained ones first)
METHODS = ("Default", "Prompting", "Self-Consistency", "ConfTuner", "ADVICE", "ADVICE+ConfTuner")
TRAINED = {"ConfTuner": "conftuner", "ADVICE": "advice", "ADVICE+ConfTuner": "advice+conftuner"}
# The paper's ablation (LM is always on); "all" is the main ADVICE run.
ABLATION = {
    "LM alone": LossWeights(jsd=0, margin=0, sum=0),
    "+JSD": LossWeights(margin=0, sum=0),
    "+Margin": LossWeights(jsd=0, sum=0),
    "+Sum": LossWeights(jsd=0, margin=0),
    "JSD+Margin": LossWeights(sum=0),
    "JSD+Sum": LossWeights(margin=0),
    "all": LossWeights(),
}
ABLATION_FORMATS = ("letter", "number")
PAPER_LR = 1e-5


@dataclasses.dataclass(frozen=True)
class Settings:
    """The benchmark's settings (all recorded in the results file); the default is the CPU preset."""

    eval_size: int = 200  # test questions per dataset (the mini test sets hold 200)
    percent_size: int = 100  # of those, scored in ScorePercent (101 labels, ~5x the cost of a one-token format)
    logiqa_size: int = 200  # LogiQA questions annotated and evaluated (long passages: ~7x the cost of a question)
    max_triplets: int | None = None  # None: every triplet (ConfTuner: twice as many answers)
    epochs: float = 1.0  # CPU budget; the paper (and --preset gpu) trains 4
    learning_rate: float | None = None  # None: chosen on the dev slice among lr_candidates (min dev Brier)
    lr_candidates: tuple[float, ...] = (1e-5, 2e-4, 1e-3)
    lr_proxy_triplets: int | None = 100  # the lr choice trains ADVICE on this many triplets (None: all of them)
    dev_size: int = 50  # dev questions per dataset for the lr choice (the mini dev slice has 50)
    pairs_per_step: int = 8
    accumulation: int = 4  # 32 pairs per optimizer step: the paper's effective batch (16 x 2)
    sc_samples: int = 5
    ablation: str = "sum"  # "full" (the paper's seven loss sets), "sum" (+Sum only beside ADVICE) or "none"
    bootstrap: int = 1000  # resamples for the intervals (ECE, AUROC, and the Default/method ECE factor)
    methods: str = ",".join(METHODS)  # which methods to score (a subset gives a partial, clearly marked run)
    formats: str = ",".join(FORMAT_KEYS)  # which formats to score (the same)
    seed: int = 0
    # Extra in-domain training-part questions for the triplet pool, beyond the mini pool (dataset=n or =all).
    extra_train: str = "pararel=all,2wikimultihopqa=7200"
    mini_pool: int = 500  # the mini pool (train + dev) those extra questions come after
    annotate_batch_size: int = 16


def chosen_formats(s: Settings) -> list[str]:
    return [f.strip() for f in s.formats.split(",") if f.strip()]


def chosen_methods(s: Settings) -> list[str]:
    return [m.strip() for m in s.methods.split(",") if m.strip()]


def training_triplets(train_records: list[Record], backend: HFBackend, cache: Path, s: Settings) -> dict:
    """The triplets of the training pool, cached under a key of the pool's records and the seed.

    ``key`` (also in every training run's folder name) changes when the pool
    does, so a larger pool never reuses triplets or adapters of a smaller one.
    """
    key = f"{records_digest(train_records)[:10]}-s{s.seed}"
    path, stats_path = cache / f"triplets-{key}.jsonl", cache / f"triplets-{key}.stats.json"
    if path.exists() and stats_path.exists():
        return {"triplets": read_triplets(path), "stats": json.loads(stats_path.read_text()), "key": key}
    built = build_triplets(train_records, backend=backend, seed=s.seed)
    write_triplets(path, built.triplets)
    write_json(stats_path, built.stats.as_dict())
    return {"triplets": built.triplets, "stats": built.stats.as_dict(), "key": key}


def advice_at(args: argparse.Namespace, s: Settings, lr: float, **overrides: Any) -> AdviceConfig:
    """ADVICE with the benchmark's settings at learning rate ``lr``."""
    settings = {"max_examples": s.max_triplets, **common_settings(args, s, lr), **overrides}
    return method_config("advice", **settings)


def common_settings(args: argparse.Namespace, s: Settings, lr: float) -> dict[str, Any]:
    return {
        "model": args.model,
        "epochs": s.epochs,
        "learning_rate": lr,
        "seed": s.seed,
        "batch_size": s.pairs_per_step,
        "gradient_accumulation": s.accumulation,
        "logging_steps": 1,
    }


def run_configs(args: argparse.Namespace, s: Settings, lr: float, n_triplets: int) -> dict[str, AdviceConfig]:
    """The training runs the chosen methods and ablation need, at the chosen learning rate, by run name."""
    common = common_settings(args, s, lr)
    cap = s.max_triplets if s.max_triplets is not None else n_triplets
    every = {
        "advice": advice_at(args, s, lr),
        "advice+conftuner": method_config("advice+conftuner", max_examples=s.max_triplets, **common),
        # ConfTuner sees as many sequences as ADVICE (two per triplet), in batches of as many rows.
        "conftuner": method_config("conftuner", max_examples=2 * cap, **{**common, "batch_size": 2 * s.pairs_per_step}),
    }
    wanted = {TRAINED[m] for m in chosen_methods(s) if m in TRAINED}
    if s.ablation != "none":
        wanted.add("advice")
    runs = {name: config for name, config in every.items() if name in wanted}
    for name in ablation_names(s):
        if name != "all":
            runs[ablation_run(name)] = advice_at(args, s, lr, weights=ABLATION[name])
    if s.ablation == "full" and lr != PAPER_LR:
        runs["advice-lr1e-5"] = advice_at(args, s, PAPER_LR)
    return runs


def ablation_names(s: Settings) -> list[str]:
    """The loss sets trained beside ADVICE: all seven, "+Sum" alone (the small budget's main carrier), or none."""
    return {"full": list(ABLATION), "sum": ["+Sum", "all"], "none": []}[s.ablation]


def run_path(cache: Path, config: AdviceConfig, data_key: str) -> Path:
    """A run's folder, named by a hash of its settings and data: the same run is trained once, a changed one anew."""
    digest = hashlib.sha1(json.dumps([config.as_dict(), data_key], sort_keys=True).encode()).hexdigest()[:10]
    return cache / "runs" / f"{config.method}-{digest}"


def ablation_run(name: str) -> str:
    return "advice" if name == "all" else "ablation-" + safe_filenames([name.lower()])[name.lower()]


def train_all(
    runs: dict[str, AdviceConfig], triplets: list, train_records: list[Record], cache: Path, data_key: str
) -> dict[str, dict[str, Any]]:
    """Train every run not already done; their training records (cost, history) by run name."""
    out = {}
    for name, config in runs.items():
        run_dir = run_path(cache, config, data_key)
        if not is_trained(run_dir):
            logger.info("training %s (%s) → %s", name, config.weights.active(), run_dir)
            if config.data == "pairs":
                train(config, None, run_dir, triplets=triplets)
            else:
                train(config, train_records, run_dir)
        saved = load_result(run_dir)
        out[name] = {
            "dir": str(run_dir),
            "losses": config.weights.active(),
            "learning_rate": config.learning_rate,
            "epochs": config.epochs,
            "examples": saved.get("n_train", saved.get("n_examples")),  # runs saved before one TrainResult
            "wall_s": saved["cost"]["wall_s"],
            "peak_rss_mib": saved["cost"]["peak_rss_mib"],
            "losses_by_epoch": _epoch_losses(saved["history"]),
            "curve": _curve(saved["history"]),
        }
        logger.info("%s: %s", name, out[name])
    return out


def _epoch_losses(history: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean of each logged loss term per epoch (steps are logged one by one)."""
    out: dict[str, dict[str, list[float]]] = {}
    for h in history:
        if "loss" not in h:
            continue
        epoch = str(max(1, math.ceil(h.get("epoch", 1.0) - 1e-9)))
        for k, v in h.items():
            if k.startswith("loss"):
                out.setdefault(epoch, {}).setdefault(k, []).append(float(v))
    return {e: {k: round(sum(v) / len(v), 4) for k, v in terms.items()} for e, terms in out.items()}


def _curve(history: list[dict[str, Any]], points: int = 60) -> list[dict[str, float]]:
    """The training curve: every logged loss term at up to ``points`` evenly spaced logged steps."""
    logged = [h for h in history if "loss" in h]
    stride = max(1, math.ceil(len(logged) / points))
    return [
        {k: round(float(v), 4) for k, v in h.items() if k.startswith("loss") or k in ("step", "epoch")}
        for h in logged[::stride]
    ]


def seed_from_baselines(src: Path, dst: Path, records: Sequence[Record], columns: Sequence[str]) -> None:
    """Copy the baselines' columns for these records into ``dst`` (same estimator, same model) once."""
    if dst.exists() or not src.exists():
        return
    old = {row.id: row for row in read_confidences(src).rows}
    rows = [old.get(r.id) for r in records]
    if any(row is None for row in rows):
        return
    kept = [
        dataclasses.replace(row, confidence={c: row.confidence[c] for c in columns if c in row.confidence})
        for row in rows
    ]
    write_confidences(dst, ConfidenceTable(kept))


def score_method(
    method: str,
    backend: HFBackend,
    subsets: dict[str, list[Record]],
    s: Settings,
    folder: Path,
    mini_cache: Path | None,
    formats: Sequence[str] = FORMAT_KEYS,
) -> dict[str, dict[str, Any]]:
    """Confidences of one method: ``{format: {dataset: (confidence, correct)}}``, cached under ``folder``.

    ScorePercent is scored on the first ``percent_size`` records only;
    Self-Consistency, the same under every format, is computed once.
    """
    per_format: dict[str, dict[str, Any]] = {f: {} for f in formats}
    if method == "Self-Consistency":
        names, options = estimator_names(method, formats, s.sc_samples)
        for dataset, records in subsets.items():
            table = score_into(records, names, folder / f"{dataset}.jsonl", backend, options=options, progress=False)
            conf, correct = table.arrays(names[0])
            for key in formats:
                cut = s.percent_size if key == "percent" else len(records)
                per_format[key][dataset] = (conf[:cut], correct[:cut])
        return per_format
    # The trained formats first, then the unseen ones: a run stopped midway keeps the headline numbers cached.
    for keys in FORMAT_ORDER:
        keys = tuple(k for k in keys if k in formats)
        if not keys:
            continue
        names, options = estimator_names(method, keys)
        for dataset, records in subsets.items():
            percent = keys == ("percent",)
            recs = records[: s.percent_size] if percent else records
            path = folder / f"{dataset}{'.percent' if percent else ''}.jsonl"
            if method == "Default" and mini_cache is not None:
                seed_from_baselines(mini_cache / "confidences" / f"{dataset}.jsonl", path, recs, names)
            table = score_into(recs, names, path, backend, options=options, progress=False)
            for key, name in zip(keys, names, strict=True):
                per_format[key][dataset] = table.arrays(name)
    return per_format


def estimator_names(method: str, keys: Sequence[str], m: int = 5) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The estimator(s) behind a method: the verbalized formats, or self-consistency (M samples)."""
    if method == "Self-Consistency":
        return ["self-consistency"], {"self-consistency": {"m": m, "prompt": "qa"}}
    suffix = "-prompting" if method == "Prompting" else ""
    return [f"verbal-{k}{suffix}" for k in keys], {}
