"""ADVICE and ConfTuner on HonestyBench-mini with the embedded default.

See docs/methods.md "ADVICE and ConfTuner", "HonestyBench-mini".

What it does, all cached and resumable at run granularity:

1. Training triplets from the HonestyBench-mini *training pool* only
   (benchmarks/cache/mini/train, made by baselines.py), with extra samples
   from the base model where a question has no wrong sample.
2. Trains ConfTuner, ADVICE and ADVICE+ConfTuner (LoRA adapters under
   <cache>/runs/<run>/; a run with its done-marker is not retrained), and the
   ADVICE loss ablation: LM alone, +JSD, +Margin, +Sum, JSD+Margin, JSD+Sum
   (all = the ADVICE run), and ADVICE at the paper's lr when the benchmark lr
   differs.
3. Scores six methods in all five formats on the in-domain test sets, the
   OOD test sets and LogiQA 2.0 (multiple choice, OOD; a seeded draw
   annotated here with the same few-shot template and judge): Default and
   Prompting (the verbalized estimators on the base model), Self-Consistency
   (M = 5 fresh samples from the annotation prompt, agreement with the greedy
   answer; one value per question, the same under every format), and the
   three trained adapters (the Default estimators on the merged adapter).
   Confidences are cached per method and dataset.
4. Reports ECE, |NCE|, Brier and AUROC per method, format and group (pooled
   over the group's questions; per dataset too), the ablation on the
   in-domain set (ScoreLetter and ScoreNumber), reliability diagrams, and
   each training run's wall time and peak memory.

CPU-scale settings (documented in the results file, none changes a method's
definition): a seeded cap on training triplets, fewer epochs, and a higher
learning rate than the paper's 1e-5 (ADVICE at 1e-5 is trained too and
reported beside it); the effective batch is the paper's 32 pairs
(4 per step × 8 accumulation). Test sets are evaluated on a seeded subset per
dataset (ScorePercent, 101 labels, on a smaller one). Nothing is trained,
tuned or selected on test or OOD data.

    nohup .venv/bin/python -m benchmarks.advice > benchmarks/cache/advice.log 2>&1 &
    .venv/bin/python -m benchmarks.advice --quick     # tiny sizes, a few minutes, writes under the cache

Writes benchmarks/results/advice.json and benchmarks/results/advice/*.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.advice_runs import (
    ABLATION_FORMATS,
    FORMAT_KEYS,
    METHODS,
    TRAINED,
    Settings,
    ablation_names,
    ablation_run,
    advice_at,
    chosen_formats,
    chosen_methods,
    run_configs,
    score_method,
    train_all,
    training_triplets,
)
from benchmarks.common import CACHE, RESULTS, setup_logging, write_json
from benchmarks.measure import peak_rss_mib
from benchmarks.mini import annotate_part, load_mini_or_exit
from candor.annotation.builder import AnnotateConfig, annotate
from candor.annotation.prompts import TEMPLATES, resolve_template
from candor.annotation.records import Record, read_records
from candor.backends.base import SamplingParams
from candor.backends.default_model import DEFAULT_MODEL
from candor.backends.hf import HFBackend
from candor.data import IN_DOMAIN, OUT_OF_DOMAIN, load_items, seeded_shuffle
from candor.data.items import QAItem
from candor.data.loaders import load_named
from candor.data.splits import dedupe_questions, split_items
from candor.evaluation.aggregate import Group, aggregate_metrics, metric_ratios
from candor.evaluation.metrics import ece
from candor.evaluation.plots import loss_curves, reliability_diagram
from candor.evaluation.report import safe_filenames
from candor.train.advice.config import AdviceConfig
from candor.train.advice.pipeline import load_result
from candor.util.errors import CandorError
from candor.verbal.formats import FORMATS

logger = logging.getLogger("benchmarks.advice")

GROUPS = {"id": IN_DOMAIN, "ood": OUT_OF_DOMAIN, "logiqa": ("logiqa",)}


QUICK = Settings(
    eval_size=6,
    percent_size=3,
    logiqa_size=6,
    max_triplets=6,
    epochs=1.0,
    pairs_per_step=2,
    accumulation=2,
    lr_candidates=(1e-5, 1e-3),
    lr_proxy_triplets=None,
    dev_size=6,
    ablation="none",
    bootstrap=50,
    extra_train="",
)
# The paper's scale for a GPU (one call of the device machine, an instruct model given by --model): every
# training-part question of the four in-domain sets annotated for triplets, 4 epochs at batch 16 x 2, the lr
# chosen among full runs, 1,000 test questions per dataset, the full ablation.
GPU = Settings(
    eval_size=1000,
    percent_size=1000,
    logiqa_size=1000,
    epochs=4.0,
    lr_candidates=(1e-5, 5e-5, 2e-4),
    lr_proxy_triplets=None,
    pairs_per_step=16,
    accumulation=2,
    ablation="full",
    extra_train="nq=all,hq=all,2wikimultihopqa=all,pararel=all",
    annotate_batch_size=64,
)
PRESETS = {"cpu": Settings(), "quick": QUICK, "gpu": GPU}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None, help="HonestyBench data dir (LogiQA is read from ../logiqa2)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--mini-cache", type=Path, default=CACHE / "mini", help="baselines.py's annotations")
    p.add_argument("--cache", type=Path, default=None, help="default: benchmarks/cache/advice[-quick]")
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/advice.json")
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="cpu",
        help="cpu (default), gpu (the paper's scale, for the device machine) or quick (tiny, minutes)",
    )
    p.add_argument("--quick", action="store_true", help="same as --preset quick")
    kinds = {
        "int": int,
        "str": str,
        "float": float,
        "float | None": float,
        "int | None": int,
        "tuple[float, ...]": _floats,
    }
    for field in dataclasses.fields(Settings):
        if field.type in kinds:
            p.add_argument("--" + field.name.replace("_", "-"), type=kinds[field.type], default=None)
    return p.parse_args()


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def settings_from(args: argparse.Namespace) -> Settings:
    if args.quick:
        args.preset = "quick"
    names = [f.name for f in dataclasses.fields(Settings)]
    given = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    s = dataclasses.replace(PRESETS[args.preset], **given)
    if s.ablation not in ("full", "sum", "none"):
        raise SystemExit(f"--ablation must be full, sum or none, got {s.ablation!r}")
    unknown = [m for m in chosen_methods(s) if m not in METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; known: {', '.join(METHODS)}")
    unknown = [f for f in chosen_formats(s) if f not in FORMAT_KEYS]
    if unknown:
        raise SystemExit(f"--formats: unknown {unknown}; known: {', '.join(FORMAT_KEYS)}")
    return s


# ---------------------------------------------------------------- data


def mini_parts(
    args: argparse.Namespace, s: Settings, backend: HFBackend, cache: Path
) -> tuple[list[Record], dict[str, list[Record]], dict[str, list[Record]]]:
    """(training pool, dev slice, test sets) of HonestyBench-mini, annotated by ``args.model``.

    baselines.py's cache is used when it holds this model's records and
    enough test questions; otherwise the parts are annotated here (same
    template and decoding, resumable) into ``<cache>/mini``.
    """
    if _cache_fits(args.mini_cache, args.model, s.eval_size):
        parts = {part: _read_part(args.mini_cache, part) for part in ("train", "dev", "test")}
    else:
        logger.info("annotating HonestyBench-mini with %s into %s", args.model, cache / "mini")
        mini = load_mini_or_exit(args.data_dir, test_size=s.eval_size, train_pool=s.mini_pool)
        config = annotate_config(s)
        template = resolve_template("auto", args.model, backend)
        parts = {
            "test": annotate_part({**mini.test_id, **mini.test_ood}, "test", backend, template, config, cache / "mini"),
            "dev": annotate_part(mini.dev, "dev", backend, template, config, cache / "mini"),
            "train": annotate_part(mini.train, "train", backend, template, config, cache / "mini"),
        }
    train = [r for recs in parts["train"].values() for r in recs]
    return train, parts["dev"], parts["test"]


def annotate_config(s: Settings) -> AnnotateConfig:
    """The annotation of every training and test question (baselines.py's: greedy + 5 samples, 32 tokens)."""
    return AnnotateConfig(k=5, params=SamplingParams(max_new_tokens=32), batch_size=s.annotate_batch_size)


def _cache_fits(folder: Path, model: str, eval_size: int) -> bool:
    test = folder / "test" / f"{IN_DOMAIN[0]}.jsonl"
    files = [
        folder / part / f"{d}.jsonl"
        for part, names in (("train", IN_DOMAIN), ("dev", IN_DOMAIN), ("test", (*IN_DOMAIN, *OUT_OF_DOMAIN)))
        for d in names
    ]
    if not all(f.exists() for f in files):
        return False
    records = read_records(test)
    return bool(records) and records[0].provenance.get("model") == model and len(records) >= eval_size


def _read_part(folder: Path, part: str) -> dict[str, list[Record]]:
    names = (*IN_DOMAIN, *OUT_OF_DOMAIN) if part == "test" else IN_DOMAIN
    return {d: read_records(folder / part / f"{d}.jsonl") for d in names}


def extra_pool_items(data_dir: str | None, spec: str, pool_offset: int, seed: int) -> dict[str, list[QAItem]]:
    """More in-domain *training-part* questions for the triplet pool: ``"dataset=n,..."`` (``n`` or ``all``).

    They continue the mini pool's own seeded order past its first
    ``pool_offset`` questions (the mini train pool and dev slice), so they
    never overlap the dev slice or the test part, and a larger ``n`` only
    appends. OOD files are refused.
    """
    out = {}
    for name, count in parse_pool_spec(spec).items():
        train_part, _test_part = split_items(dedupe_questions(load_named(name, data_dir=data_dir)))
        rest = seeded_shuffle(train_part, f"{seed}:{name}:pool")[pool_offset:]
        out[name] = rest if count is None else rest[:count]
    return out


def parse_pool_spec(spec: str) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, count = part.partition("=")
        if name not in IN_DOMAIN:
            raise SystemExit(f"--extra-train: {name!r} is not an in-domain dataset ({', '.join(IN_DOMAIN)})")
        out[name] = None if count in ("", "all") else int(count)
    return out


def annotate_extra_pool(
    args: argparse.Namespace, s: Settings, backend: HFBackend, cache: Path
) -> dict[str, list[Record]]:
    """Annotate the extra training questions like the mini pool (greedy + k samples, resumable)."""
    if not s.extra_train:
        return {}
    items = extra_pool_items(args.data_dir, s.extra_train, s.mini_pool, s.seed)
    template = resolve_template("auto", args.model, backend)
    return annotate_part(items, "train", backend, template, annotate_config(s), cache / "pool")


def logiqa_records(args: argparse.Namespace, s: Settings, backend: HFBackend, cache: Path) -> list[Record]:
    """A seeded draw of LogiQA 2.0 annotated like the mini test sets (greedy answer + correctness)."""
    try:
        items = load_items("logiqa", data_dir=args.data_dir)
    except CandorError as exc:
        raise SystemExit(f"SKIP: LogiQA 2.0 not available ({exc})") from None
    items = seeded_shuffle(items, f"advice-logiqa:{s.seed}")[: s.logiqa_size]
    path = cache / "logiqa.jsonl"
    config = AnnotateConfig(k=0, params=SamplingParams(max_new_tokens=32))
    annotate(items, backend, path, TEMPLATES.get("fewshot"), config, progress=False)
    wanted = {item.id for item in items}
    return [r for r in read_records(path) if r.id in wanted]


def eval_subsets(tests: dict[str, list[Record]], s: Settings) -> dict[str, list[Record]]:
    """The first ``eval_size`` records of each cached test file (its order is already a seeded draw)."""
    return {d: recs[: s.eval_size] for d, recs in tests.items()}


# ---------------------------------------------------------------- training


def training_curve(name: str, run: dict[str, Any], folder: Path) -> str:
    """A run's per-term loss curve as a PNG; its path for the results file."""
    history = load_result(run["dir"])["history"]
    title = f"{name} (lr {run['learning_rate']:g})"
    return relative(loss_curves(history, folder / f"training_{name}.png", title=title))


def choose_lr(
    args: argparse.Namespace,
    s: Settings,
    built: dict[str, Any],
    dev: dict[str, list[Record]],
    base: HFBackend,
    cache: Path,
) -> tuple[float, dict[str, Any]]:
    """The learning rate: given, or the candidate whose ADVICE adapter has the lowest dev Brier.

    Dev Brier is pooled over the dev slice (training pool, never test data) and
    averaged over ScoreLetter and ScoreNumber, the formats ADVICE trains on.
    The runs are ordinary benchmark runs (same settings, same folders), so the
    chosen one and the 1e-5 one are reused later, not trained again.
    """
    if s.learning_rate is not None:
        return s.learning_rate, {"chosen": s.learning_rate, "how": "given (--learning-rate)"}
    folder = cache / "dev"
    table: dict[str, Any] = {"base model": _dev_scores(base, dev, s, folder / "confidences" / "base")}
    proxy = {} if s.lr_proxy_triplets is None else {"max_examples": s.lr_proxy_triplets}
    runs = {f"{lr:g}": advice_at(args, s, lr, **proxy) for lr in s.lr_candidates}
    training = train_all(runs, built["triplets"], [], cache, built["key"])
    for key, run in training.items():
        backend = HFBackend.from_pretrained(args.model, adapter=run["dir"])
        table[key] = _dev_scores(backend, dev, s, score_folder(folder, key, run["dir"]))
    mean_brier = {k: round((v["ScoreLetter"]["brier"] + v["ScoreNumber"]["brier"]) / 2, 4) for k, v in table.items()}
    chosen = min(s.lr_candidates, key=lambda lr: mean_brier[f"{lr:g}"])
    how = "lowest dev Brier (mean of ScoreLetter and ScoreNumber) among the candidates"
    if s.lr_proxy_triplets is not None:
        how += f", each an ADVICE run on a seeded {s.lr_proxy_triplets} of the triplets (a proxy of the full run)"
    return chosen, {"chosen": chosen, "how": how, "dev_mean_brier": mean_brier, "dev": table, "runs": training}


def _dev_scores(backend: HFBackend, dev: dict[str, list[Record]], s: Settings, folder: Path) -> dict:
    per_format = score_method("trained", backend, dev, s, folder, None, ABLATION_FORMATS)
    return {FORMATS.get(f).name: in_domain_block(per_format[f]) for f in ABLATION_FORMATS}


# ---------------------------------------------------------------- scoring


def score_folder(cache: Path, method: str, run_dir: str | None = None) -> Path:
    """Trained methods cache by run (its settings hash included), so the ablation's "all" reuses ADVICE's."""
    name = f"run-{Path(run_dir).name}" if run_dir else safe_filenames([method])[method]
    return cache / "confidences" / name


# ---------------------------------------------------------------- metrics


# The results file's keys for the aggregated metrics ("nce" there is |NCE|, as the paper reports it).
BLOCK_KEYS = {
    "ece": "ece",
    "abs_nce": "nce",
    "brier": "brier",
    "auroc": "auroc",
    "nce": "nce_signed",
    "accuracy": "accuracy",
}


def group_blocks(
    per_dataset: dict[str, Any], groups: dict[str, Sequence[str]], bootstrap: int = 0
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Metric blocks per dataset and per group, from :func:`candor.evaluation.aggregate.aggregate_metrics`.

    Groups are *pooled* (the metric on all the group's questions at once), not
    size-weighted: on these small subsets a dataset with no correct answer has
    no AUROC, which would make a weighted average undefined. Groups whose
    datasets were not scored are left out.
    """
    present = {g: tuple(d for d in ds if d in per_dataset) for g, ds in groups.items()}
    present = {g: ds for g, ds in present.items() if ds}
    # A group may share its name with its one dataset ("logiqa"), so it is aggregated as "group:<name>".
    metric_groups = [Group(f"group:{g}", ds, "pooled") for g, ds in present.items()]
    result = aggregate_metrics(
        {"m": {d: c for d, (c, _) in per_dataset.items()}},
        {d: y for d, (_, y) in per_dataset.items()},
        groups=metric_groups,
        metrics=tuple(BLOCK_KEYS),
        ci_metrics=("ece", "auroc"),
        bootstrap=bootstrap,
        seed=0,
    ).methods["m"]
    sizes = {d: len(y) for d, (_, y) in per_dataset.items()}
    datasets = {d: _block(result.values[d], sizes[d], result.ci.get(d), result.corrected.get(d)) for d in per_dataset}
    groups_out = {
        g: _block(
            result.values[f"group:{g}"],
            sum(sizes[d] for d in ds),
            result.ci.get(f"group:{g}"),
            result.corrected.get(f"group:{g}"),
        )
        for g, ds in present.items()
    }
    return datasets, groups_out


def _block(
    values: dict[str, float],
    n: int,
    ci: dict[str, tuple[float, float]] | None,
    corrected: dict[str, float] | None = None,
) -> dict[str, Any]:
    out = {BLOCK_KEYS[k]: _num(v) for k, v in values.items()}
    block: dict[str, Any] = {
        **{k: out[k] for k in ("ece", "nce", "brier", "auroc", "nce_signed")},
        "n": n,
        "accuracy": out["accuracy"],
    }
    for metric, (low, high) in (ci or {}).items():
        block[f"{metric}_ci"] = [_num(low), _num(high)]
    for metric, value in (corrected or {}).items():  # biased metrics (ECE): the estimate their basic _ci is around
        block[f"{BLOCK_KEYS.get(metric, metric)}_corrected"] = _num(value)
    return block


def in_domain_block(per_dataset: dict[str, Any]) -> dict[str, float | None]:
    """The block of the in-domain datasets pooled (the ablation and the lr choice)."""
    return group_blocks(per_dataset, {"id": IN_DOMAIN})[1]["id"]


def method_metrics(per_format: dict[str, dict[str, Any]], bootstrap: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fmt, per_dataset in per_format.items():
        per_ds, blocks = group_blocks(per_dataset, GROUPS, bootstrap)
        block: dict[str, Any] = dict(blocks)
        block["per_dataset"] = per_ds
        out[FORMATS.get(fmt).name] = block
    return out


def ece_factors(scored: dict[str, dict[str, dict[str, Any]]], bootstrap: int) -> dict[str, Any]:
    """ECE of Default / ECE of each other method, per format and group, with paired bootstrap intervals.

    A factor above 1 means the method's ECE is lower than Default's (the
    paper's "cuts ECE several-fold"); the interval resamples the same
    questions for both methods.
    """
    if "Default" not in scored:
        return {}
    out: dict[str, Any] = {}
    for method, per_format in scored.items():
        if method == "Default":
            continue
        for fmt, per_dataset in per_format.items():
            default = scored["Default"].get(fmt, {})
            datasets = [d for d in per_dataset if d in default]
            groups = [
                Group(f"group:{g}", tuple(d for d in ds if d in datasets), "pooled")
                for g, ds in GROUPS.items()
                if any(d in datasets for d in ds)
            ]
            ratios = metric_ratios(
                {d: default[d][0] for d in datasets},
                {d: per_dataset[d][0] for d in datasets},
                {d: per_dataset[d][1] for d in datasets},
                metric="ece",
                groups=groups,
                bootstrap=bootstrap,
            )
            out.setdefault(method, {})[FORMATS.get(fmt).name] = {
                col.removeprefix("group:"): {
                    "factor": _num(r.value),
                    "ci": [_num(r.ci[0]), _num(r.ci[1])],
                    "undefined_resamples": r.dropped,
                }
                for col, r in ratios.items()
                if col.startswith("group:")
            }
    return out


def constant_reference(per_dataset: dict[str, Any], train_records: Sequence[Record], bootstrap: int) -> dict[str, Any]:
    """One confidence for every question: the training pool's greedy accuracy (no test data used).

    The bar a trained confidence must clear to show more than a shift of its
    mean: on sets where about one answer in ten is right, this alone has a
    small ECE, and its AUROC is 0.5 by construction.
    """
    rate = sum(r.greedy_correct == 1 for r in train_records) / len(train_records)
    constant = {d: (np.full(len(y), rate), y) for d, (_, y) in per_dataset.items()}
    _, groups = group_blocks(constant, GROUPS, bootstrap)
    return {"confidence": round(rate, 4), **groups}


def adapter_accuracy(
    backend: HFBackend, subsets: dict[str, list[Record]], folder: Path, s: Settings
) -> dict[str, dict[str, float | int]]:
    """Task accuracy of a model (base or adapter) on the evaluation questions: its own greedy answers, judged.

    The same template and decoding as the annotation, greedy only; so a
    trained adapter that damages answering shows here.
    """
    out = {}
    for dataset, records in subsets.items():
        items = [r.item for r in records]
        name = records[0].provenance.get("template") if records else None
        template = TEMPLATES.get(name) if name in TEMPLATES else TEMPLATES.get("fewshot")
        path = folder / f"{dataset}.jsonl"
        config = AnnotateConfig(k=0, params=SamplingParams(max_new_tokens=32), batch_size=s.annotate_batch_size)
        annotate(items, backend, path, template, config, progress=False)
        wanted = {item.id for item in items}
        mine = [r for r in read_records(path) if r.id in wanted]
        out[dataset] = {
            "n": len(mine),
            "accuracy": _num(sum(r.greedy_correct == 1 for r in mine) / max(1, len(mine))),
            "base_accuracy": _num(sum(r.greedy_correct == 1 for r in records) / max(1, len(records))),
        }
    return out


def pooled(per_dataset: dict[str, Any], datasets: Sequence[str]) -> tuple[list[float], list[int]]:
    """All the group's questions at once (for the reliability diagrams)."""
    conf, correct = [], []
    for d in datasets:
        if d in per_dataset:
            c, y = per_dataset[d]
            conf.extend(c.tolist())
            correct.extend(y.tolist())
    return conf, correct


def diagrams(method: str, per_format: dict[str, dict[str, Any]], folder: Path) -> list[str]:
    files = []
    for fmt, per_dataset in per_format.items():
        for group, datasets in GROUPS.items():
            conf, correct = pooled(per_dataset, datasets)
            if not conf:
                continue
            stem = safe_filenames([f"{method}_{fmt}_{group}"])[f"{method}_{fmt}_{group}"]
            title = f"{method}, {FORMATS.get(fmt).name}, {group}"
            path = reliability_diagram(conf, correct, folder / f"{stem}.png", title=title, ece=ece(conf, correct))
            files.append(relative(path))
    return files


def relative(path: Path) -> str:
    """A results path as the README cites it (relative to benchmarks/), others as they are."""
    return str(path.relative_to(RESULTS.parent)) if path.is_relative_to(RESULTS.parent) else str(path)


def _num(x: Any) -> Any:
    if isinstance(x, int):
        return x
    return None if x is None or x != x else round(float(x), 4)


# ---------------------------------------------------------------- main


def main() -> None:
    setup_logging()
    args = parse_args()
    s = settings_from(args)
    cache = args.cache or default_cache(args)
    out_path = args.out or (RESULTS / "advice.json" if args.preset == "cpu" else cache / "advice.json")
    plots = RESULTS / "advice" if args.preset == "cpu" else cache / "plots"
    seconds: dict[str, float] = {}
    payload: dict[str, Any] = {
        "benchmark": "ADVICE / ConfTuner on HonestyBench-mini",
        "model": args.model,
        "preset": args.preset,
        "settings": dataclasses.asdict(s),
        "notes": NOTES,
        "groups": {g: list(d) for g, d in GROUPS.items()},
        "command": command_line(args),
    }

    clock = time.perf_counter()
    base = HFBackend.from_pretrained(args.model, batch_size=s.annotate_batch_size)
    train_records, dev_parts, tests = mini_parts(args, s, base, cache)
    extra = annotate_extra_pool(args, s, base, cache)
    train_records += [r for recs in extra.values() for r in recs]
    tests["logiqa"] = logiqa_records(args, s, base, cache)
    subsets = eval_subsets(tests, s)
    seconds["data"] = time.perf_counter() - clock
    payload["training_pool"] = pool_summary(train_records, extra, s)
    payload["eval_sizes"] = {
        d: {"all_formats": len(r), "ScorePercent": min(len(r), s.percent_size)} for d, r in subsets.items()
    }

    clock = time.perf_counter()
    built = training_triplets(train_records, base, cache, s)
    seconds["triplets"] = time.perf_counter() - clock
    payload["triplets"] = {**built["stats"], "by_dataset": dict(Counter(t.item.dataset for t in built["triplets"]))}

    clock = time.perf_counter()
    dev = {d: recs[: s.dev_size] for d, recs in dev_parts.items()}
    lr, payload["learning_rate"] = choose_lr(args, s, built, dev, base, cache)
    seconds["lr_choice"] = time.perf_counter() - clock

    clock = time.perf_counter()
    runs = run_configs(args, s, lr, len(built["triplets"]))
    payload["training"] = train_all(runs, built["triplets"], train_records, cache, built["key"])
    seconds["training"] = time.perf_counter() - clock
    payload["training_curves"] = [training_curve(name, run, plots) for name, run in payload["training"].items()]

    payload.update(methods={}, ece_factor_vs_default={}, task_accuracy={}, reliability_diagrams=[])
    scored: dict[str, dict[str, dict[str, Any]]] = {}
    for method in chosen_methods(s):
        clock = time.perf_counter()
        backend, run_dir = base, None
        if method in TRAINED:
            run_dir = payload["training"][TRAINED[method]]["dir"]
            backend = HFBackend.from_pretrained(args.model, adapter=run_dir, batch_size=s.annotate_batch_size)
            accuracy_folder = cache / "accuracy" / f"run-{Path(run_dir).name}"
            payload["task_accuracy"][method] = adapter_accuracy(backend, subsets, accuracy_folder, s)
        folder = score_folder(cache, method, run_dir)
        scored[method] = score_method(method, backend, subsets, s, folder, args.mini_cache, chosen_formats(s))
        payload["methods"][method] = method_metrics(scored[method], s.bootstrap)
        payload["ece_factor_vs_default"] = ece_factors(scored, s.bootstrap)
        payload["reliability_diagrams"] += diagrams(method, scored[method], plots)
        seconds[f"score_{method}"] = time.perf_counter() - clock
        write_progress(out_path, payload, seconds, done=False)

    if "Default" in scored:
        payload["constant_reference"] = constant_reference(
            next(iter(scored["Default"].values())), train_records, s.bootstrap
        )
    clock = time.perf_counter()
    payload["ablation"] = run_ablation(args, s, runs, payload["training"], subsets, cache)
    seconds["ablation_scoring"] = time.perf_counter() - clock
    write_progress(out_path, payload, seconds, done=True)
    print(summary_table(payload))


def default_cache(args: argparse.Namespace) -> Path:
    """The benchmark's cache: one per preset, and per model away from the embedded default."""
    folder = {"cpu": "advice", "quick": "advice-quick", "gpu": "advice-gpu"}[args.preset]
    if args.model != DEFAULT_MODEL:
        folder += "-" + hashlib.sha1(args.model.encode()).hexdigest()[:8]
    return CACHE / folder


def pool_summary(train_records: list[Record], extra: dict[str, list[Record]], s: Settings) -> dict[str, Any]:
    """Where the training questions came from, and how many the model answered correctly."""
    by_dataset = Counter(r.item.dataset for r in train_records)
    correct = Counter(r.item.dataset for r in train_records if r.greedy_correct == 1)
    return {
        "questions": len(train_records),
        "extra_train": s.extra_train,
        "extra_questions": {d: len(v) for d, v in extra.items()},
        "by_dataset": {d: {"questions": n, "greedy_correct": correct[d]} for d, n in sorted(by_dataset.items())},
        "source": "in-domain training parts only (hash split); no test part, no OOD file",
    }


def write_progress(path: Path, payload: dict[str, Any], seconds: dict[str, float], done: bool) -> None:
    """Write what is finished so far; ``complete`` says whether every chosen method and the ablation are in."""
    payload["complete"] = done
    payload["seconds"] = {k: round(v, 1) for k, v in seconds.items()}
    payload["peak_rss_mib"] = round(peak_rss_mib(), 1)
    write_json(path, payload)
    logger.info("wrote %s (%s)", path, "complete" if done else "partial")


def command_line(args: argparse.Namespace) -> str:
    return "python -m benchmarks.advice " + " ".join(sys.argv[1:])


def run_ablation(
    args: argparse.Namespace,
    s: Settings,
    runs: dict[str, AdviceConfig],
    training: dict[str, dict[str, Any]],
    subsets: dict[str, list[Record]],
    cache: Path,
) -> dict[str, Any]:
    """The loss ablation (and ADVICE at the paper's lr) on the in-domain subsets, ScoreLetter and ScoreNumber."""
    in_domain = {d: subsets[d] for d in IN_DOMAIN}
    names = {name: ablation_run(name) for name in ablation_names(s)}
    if "advice-lr1e-5" in runs:
        names["all, lr 1e-5 (paper)"] = "advice-lr1e-5"
    out = {}
    for label, run in names.items():
        run_dir = training[run]["dir"]
        backend = HFBackend.from_pretrained(args.model, adapter=run_dir)
        folder = score_folder(cache, run, run_dir)
        per_format = score_method("trained", backend, in_domain, s, folder, args.mini_cache, ABLATION_FORMATS)
        out[label] = {
            "run": run,
            "losses": runs[run].weights.active(),
            "learning_rate": runs[run].learning_rate,
            **{FORMATS.get(f).name: in_domain_block(per_format[f]) for f in ABLATION_FORMATS},
        }
    return out


NOTES = [
    "Group metrics (id, ood, logiqa) are computed on the pooled questions of the group; per-dataset values are "
    "under per_dataset. Pooled rather than size-weighted averages because on small subsets a dataset with no "
    "correct answer has no AUROC. 'nce' is |NCE|; 'nce_signed' is accuracy minus mean confidence.",
    "Self-Consistency is one confidence per question (M = 5 samples from the annotation prompt, agreement with "
    "the greedy answer), reported identically under every format.",
    "Default (verbal-<fmt>) confidences of the HonestyBench test sets are reused from baselines.py's cache (the "
    "same estimator and model); everything else is scored here.",
    "Training uses only the HonestyBench-mini training pool; no test or OOD question is trained or selected on. "
    "The learning rate above the paper's 1e-5 is a CPU-scale benchmark setting (few optimizer steps); ADVICE at "
    "1e-5 is in the ablation block as 'all, lr 1e-5 (paper)'.",
    "Effective batch = pairs_per_step x accumulation pairs (the paper: 16 x 2 = 32; fewer here, so the few "
    "triplets give more optimizer steps); ConfTuner gets twice as many answers per step (one sequence per example "
    "instead of two) and twice as many examples.",
    "Training cost per run: wall_s is trainer.train() alone (model loading and tokenization add a few seconds); "
    "peak_rss_mib is the benchmark process during it, which also holds the base model used for scoring (~0.6 GiB).",
]


def summary_table(payload: dict[str, Any]) -> str:
    lines = [
        "| method | format | ID ECE | ID AUROC | OOD ECE | OOD AUROC | LogiQA ECE | LogiQA AUROC |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for method, per_format in payload["methods"].items():
        for fmt, block in per_format.items():
            cells = []
            for group in GROUPS:
                m = block.get(group, {})
                cells += [_pct(m.get("ece")), _pct(m.get("auroc"))]
            lines.append(f"| {method} | {fmt} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


if __name__ == "__main__":
    main()
