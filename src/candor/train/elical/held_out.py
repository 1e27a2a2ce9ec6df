"""How an EliCal head ranks datasets it never saw: the held-out-domain report of ``candor train elical``.

:func:`train_with_held_out_report` is what ``candor train elical`` runs:
train and save the head (:func:`candor.train.elical.pipeline.train_elical`),
then retrain it without each dataset of a multi-dataset pool and score it on
that dataset (:func:`held_out_report`, head mode only), the report saved in
``training.json`` beside the head and printed by :func:`held_out_summary`.
Generality, not just in-domain dev loss.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from candor.annotation.records import Record
from candor.evaluation.metrics import auroc
from candor.train.common import TrainResult, load_causal_lm
from candor.train.elical.budgets import WHOLE_POOL, Budget
from candor.train.elical.config import EliCalConfig
from candor.train.elical.pipeline import head_features, train_elical
from candor.train.elical.pool import TrainingPool
from candor.train.elical.selection import domains_of, lodo_folds
from candor.train.elical.targets import targets
from candor.util.files import atomic_write_text


def train_with_held_out_report(
    data: TrainingPool,
    *,
    method: str,
    config: EliCalConfig,
    budget: Budget,
    out_dir: str | Path,
    init_from: str | Path | None = None,
) -> TrainResult:
    """Train ``method`` on ``data``, save it to ``out_dir`` and add its held-out-domain report (``.held_out``)."""
    # One frozen backbone for the head and its held-out retrainings (lora mode loads a fresh one per run).
    model, tokenizer = (
        load_causal_lm(config.model, dtype=config.dtype, device=config.device)
        if config.mode == "head"
        else (None, None)
    )
    result = train_elical(
        data.pool,
        data.dev,
        method=method,
        config=config,
        out_dir=out_dir,
        budget=budget,
        init_from=init_from,
        source=data.source,
        dev_source=data.dev_source,
        model=model,
        tokenizer=tokenizer,
    )
    result.held_out = held_out_report(
        data.pool, data.dev, method=method, config=config, budget=budget, model=model, tokenizer=tokenizer
    )
    if result.held_out is not None:
        atomic_write_text(
            Path(result.path) / "training.json", json.dumps(result.to_dict(), indent=2, default=str) + "\n"
        )
    return result


def held_out_summary(report: dict[str, Any]) -> str:
    """One line for people: each held-out dataset's AUROC ×100 (or why it was skipped) and their mean."""
    if "skipped" in report:
        return f"held-out-domain AUROC: skipped ({report['skipped']})"
    cells = []
    for name, d in report["domains"].items():
        if "skipped" in d:
            cells.append(f"{name} skipped ({d['skipped']})")
        elif d["auroc"] is None:
            cells.append(f"{name} n/a ({d['n_correct']}/{d['n']} correct: one class)")
        else:
            cells.append(f"{name} {100 * d['auroc']:.1f} ({d['n_correct']}/{d['n']} correct)")
    mean = report["mean_auroc"]
    return (
        "held-out-domain AUROC ×100 (retrained without each dataset, scored on it): "
        + ", ".join(cells)
        + ("" if mean is None else f"; mean {100 * mean:.1f}")
    )


def held_out_report(
    pool: Sequence[Record],
    dev: Sequence[Record],
    *,
    method: str,
    config: EliCalConfig,
    budget: Budget = WHOLE_POOL,
    model: Any = None,
    tokenizer: Any = None,
) -> dict[str, Any] | None:
    """How a head trained like this one ranks a dataset it never saw: ``method`` retrained once per dataset of
    ``pool`` without it, scored on that dataset's pool and dev records. None for a one-dataset pool.

    Head mode only (each fold is seconds on cached features); a lora run says it skipped. Returns
    ``{"domains": {name: {"auroc", "n", "n_correct"} or {"skipped"}}, "mean_auroc"}``.
    """
    if len(domains_of(pool)) < 2:
        return None
    if config.mode != "head":
        return {"skipped": "head mode only: in lora mode it would retrain the backbone once per dataset"}
    domains: dict[str, dict[str, Any]] = {}
    for fold in lodo_folds(pool, dev, pool):
        if budget.count is not None and len(fold.train) < budget.count:
            domains[fold.held_out] = {"skipped": f"budget {budget} is over the other datasets' {len(fold.train)}"}
            continue
        with tempfile.TemporaryDirectory(prefix="candor-heldout-") as tmp:
            result = train_elical(
                fold.train,
                fold.dev,
                method=method,
                config=config,
                out_dir=tmp,
                budget=budget,
                model=model,
                tokenizer=tokenizer,
            )
        head = result.model
        features = head_features(head, head.prompts(fold.score), config.feature_cache)
        with torch.no_grad():
            confidence = head.head(torch.from_numpy(features).to(head.device)).cpu().numpy()
        labels = targets(fold.score, "hard", what=f"held-out {fold.held_out!r}").astype(int)
        value = auroc(confidence, labels) if 0 < labels.sum() < labels.size else None
        domains[fold.held_out] = {"auroc": value, "n": int(labels.size), "n_correct": int(labels.sum())}
    scored = [d["auroc"] for d in domains.values() if d.get("auroc") is not None]
    return {"domains": domains, "mean_auroc": float(np.mean(scored)) if scored else None}
