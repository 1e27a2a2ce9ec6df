"""The label-budget sweep: Cal-Only and EliCal at several budgets and seeds, and Eli-Only (docs/methods.md "EliCal").

For each seed, stage 1 (Eli-Only) trains once on the whole pool; then, for
each budget N, Cal-Only trains stage 2 from scratch on N labels and EliCal
resumes that seed's stage-1 head on the same N labels (budgets are drawn per
seed, nested across budgets). Every run's test confidences are cached under
``out_dir/runs`` with a fingerprint of its settings and data, so a killed or
repeated sweep redoes only what changed; trained heads are kept under
``out_dir/heads``, each with the manifest of its training questions
(``training_questions.json``, see :func:`candor.train.elical.pipeline.train_elical`).
The summary (:mod:`candor.train.elical.curve`) goes to
``out_dir/curve.json`` and the plot to ``out_dir/budget_curve.png``.

In ``head`` mode one backbone serves every run and features are computed once
(the feature cache); in ``lora`` mode each run loads a fresh backbone, since
LoRA is added to the model in place.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from candor.annotation.contamination import MANIFEST_NAME, HeldOutQuestions
from candor.annotation.records import Record, read_records
from candor.train.common import TrainResult, load_causal_lm
from candor.train.elical.budgets import WHOLE_POOL, Budget
from candor.train.elical.config import EliCalConfig
from candor.train.elical.curve import plot_curve, summarize_column
from candor.train.elical.model import ConfidenceHead
from candor.train.elical.pipeline import STAGES, head_features, train_elical
from candor.train.elical.pool import TrainingPool, check_disjoint
from candor.train.elical.targets import check_field, stage_target, targets
from candor.util.errors import CandorError
from candor.util.files import atomic_write_text, read_cache_entry, read_keyed_json, write_keyed_json

logger = logging.getLogger(__name__)

DEFAULT_BUDGETS: tuple[Budget, ...] = (Budget(100), Budget(250), Budget(500), Budget(1000), WHOLE_POOL)
DEFAULT_SEEDS = (0, 1, 2)
SWEEP_METHODS = ("cal-only", "elical")
LABELS = {"eli-only": "Eli-Only", "cal-only": "Cal-Only", "elical": "EliCal"}
# EliCalConfig fields that only stage 2 reads (an Eli-Only run's cache key leaves them out).
STAGE2_FIELDS = ("cal_target", "cal_stop", "cal_anchor", "cal_scope", "recenter_bias")
# A summary entry's test confidences, one {dataset: array} per seed (returned, not written to curve.json).
CONFIDENCES = "confidences"


@dataclass(frozen=True)
class RunKey:
    """One training run of the sweep."""

    method: str
    budget: Budget | None
    seed: int

    @property
    def column(self) -> str:
        """The method's name in tables: ``Eli-Only``, ``Cal-Only@100``, ``EliCal@all``."""
        name = LABELS[self.method]
        return name if self.budget is None else f"{name}@{self.budget}"

    @property
    def budget_json(self) -> int | str | None:
        """The budget as results and cache keys store it (``1000``, ``"all"``, or None for Eli-Only)."""
        return None if self.budget is None else self.budget.as_json()

    @property
    def slug(self) -> str:
        name = self.method if self.budget is None else f"{self.method}@{self.budget}"
        return f"{name}/seed{self.seed}"


@dataclass
class SweepData:
    """The records a sweep trains, stops and tests on, and each test dataset's role (``id``/``ood``)."""

    train: Sequence[Record]
    dev: Sequence[Record]
    tests: Mapping[str, Sequence[Record]]
    roles: Mapping[str, str]

    @classmethod
    def read(
        cls, records: Path, tests: Sequence[Path], *, dev: Path | None = None, ood: Collection[str] = ()
    ) -> SweepData:
        """The sweep's data from records files: test sets by dataset (``ood`` names the out-of-domain ones), and
        the :class:`~candor.train.elical.pool.TrainingPool` (dev carved with seed 0 when no ``dev``), refused
        when it shares a question with a test file."""
        by_dataset: dict[str, list[Record]] = {}
        for path in tests:
            for rec in read_records(path):
                by_dataset.setdefault(rec.item.dataset, []).append(rec)
        guard = HeldOutQuestions.of(
            (r.item.question for recs in by_dataset.values() for r in recs), [str(p) for p in tests]
        )
        data = TrainingPool.read(records, dev, tests=guard)
        unknown = set(ood) - set(by_dataset)
        if unknown:
            files = ", ".join(str(p) for p in tests)
            raise CandorError(f"--ood {', '.join(sorted(unknown))}: not a dataset in {files} ({', '.join(by_dataset)})")
        roles = {d: ("ood" if d in ood else "id") for d in by_dataset}
        return cls(data.pool, data.dev, by_dataset, roles)

    def test_records(self) -> list[Record]:
        return [r for records in self.tests.values() for r in records]

    def labels(self) -> dict[str, np.ndarray]:
        return {ds: targets(recs, "hard", what=f"test set {ds!r}").astype(int) for ds, recs in self.tests.items()}


def run_sweep(
    data: SweepData,
    *,
    out_dir: str | Path,
    config: EliCalConfig | None = None,
    budgets: Sequence[Budget] = DEFAULT_BUDGETS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    methods: Sequence[str] = SWEEP_METHODS,
    eli_only: bool = True,
    bootstrap: int = 200,
    baselines: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    model: Any = None,
    tokenizer: Any = None,
    stage1_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Train every run (reusing cached ones), summarize, write ``curve.json`` and ``budget_curve.png``.

    ``stage1_dir`` keeps the Eli-Only runs and heads there instead of under ``out_dir``, so sweeps that differ
    only in stage 2's settings (the rules of :mod:`candor.train.elical.selection`) share one stage 1 per seed.

    Eli-Only trains once per seed whenever EliCal runs (it is EliCal's stage
    1), and otherwise when ``eli_only``. ``baselines`` maps a name
    (``"N-Prob"``) to its test confidences per dataset, in the order of
    ``data.tests``; they are summarized the same way and drawn as flat lines.
    Returns the summary: ``{"methods": {column: ...}, "budgets", "n_labels", "seeds", "mode", "config"}``;
    each trained column also holds its test confidences under :data:`CONFIDENCES` (not in ``curve.json``).
    """
    config = config or EliCalConfig()
    if bootstrap < 0:
        raise CandorError(f"bootstrap resamples must be at least 0, got {bootstrap}")
    if not seeds or not budgets:
        raise CandorError("the sweep needs at least one seed and one budget")
    _validate(data, config, budgets, methods)
    out_dir = Path(out_dir)
    if config.mode == "head" and (model is None or tokenizer is None):
        model, tokenizer = load_causal_lm(config.model, dtype=config.dtype, device=config.device)
    runner = _Runner(data, config, out_dir, model, tokenizer, Path(stage1_dir) if stage1_dir else out_dir)
    for seed in seeds:
        if eli_only or "elical" in methods:
            runner.run(RunKey("eli-only", None, seed))
        for budget in budgets:
            for method in methods:
                runner.run(RunKey(method, budget, seed))
    summary = summarize_runs(runner.results, data, bootstrap)
    labels = data.labels()
    for name, confidences in (baselines or {}).items():
        summary["methods"][name] = summarize_column([confidences], labels, data.roles, bootstrap=bootstrap)
    summary.update(
        budgets=[b.as_json() for b in budgets],
        n_labels={str(b): b.size(len(data.train)) for b in budgets},
        seeds=list(seeds),
        mode=config.mode,
        config=config.fingerprint(),
    )
    write_json(
        out_dir / "curve.json",
        {
            **summary,
            "methods": {
                name: {k: v for k, v in entry.items() if k != CONFIDENCES} for name, entry in summary["methods"].items()
            },
        },
    )
    plot_sweep(summary, out_dir / "budget_curve.png", references=list(baselines or {}))
    return summary


def summarize_runs(results: Mapping[RunKey, dict[str, Any]], data: SweepData, bootstrap: int) -> dict[str, Any]:
    """Group runs by column (method@budget) over seeds and summarize each, with its training costs."""
    labels = data.labels()
    ids = {ds: [r.id for r in recs] for ds, recs in data.tests.items()}
    columns: dict[str, list[RunKey]] = {}
    for key in results:
        columns.setdefault(key.column, []).append(key)
    methods = {}
    for column, keys in columns.items():
        per_seed = [_per_dataset(results[k], ids) for k in keys]
        entry = summarize_column(per_seed, labels, data.roles, bootstrap=bootstrap)
        entry.update(
            {CONFIDENCES: per_seed},
            method=keys[0].method,
            budget=keys[0].budget_json,
            seeds=[k.seed for k in keys],
            training=[results[k]["training"] for k in keys],
            cost=_cost([results[k]["training"] for k in keys]),
        )
        methods[column] = entry
    return {"methods": methods}


def plot_sweep(summary: Mapping[str, Any], path: str | Path, references: Sequence[str] = ()) -> Path:
    """The budget curve of Cal-Only and EliCal, with Eli-Only and ``references`` as flat lines."""
    n_labels = summary["n_labels"]
    curves: dict[str, list[tuple[int, str]]] = {}
    for column, entry in summary["methods"].items():
        if entry.get("budget") is not None and entry.get("method") in LABELS:
            curves.setdefault(LABELS[entry["method"]], []).append((n_labels[str(entry["budget"])], column))
    flat = [c for c in ("Eli-Only", *references) if c in summary["methods"]]
    return plot_curve(summary["methods"], curves, flat, path, title=f"EliCal label-budget sweep ({summary['mode']})")


# ---------------------------------------------------------------- running


class _Runner:
    """Trains runs or reuses their cached test confidences."""

    def __init__(
        self, data: SweepData, config: EliCalConfig, out_dir: Path, model: Any, tokenizer: Any, stage1_dir: Path
    ) -> None:
        self.data = data
        self.config = config
        self.out_dir = out_dir
        self.stage1_dir = stage1_dir
        self.model = model
        self.tokenizer = tokenizer
        self.results: dict[RunKey, dict[str, Any]] = {}
        self._data_hash = _hash(
            [[r.id for r in data.train], [r.id for r in data.dev], [r.id for r in data.test_records()]]
        )

    def run(self, key: RunKey) -> dict[str, Any]:
        config = replace(self.config, seed=key.seed).fingerprint()
        if key.method == "eli-only":  # stage 1 alone: stage 2's settings cannot change it
            config = {k: v for k, v in config.items() if k not in STAGE2_FIELDS}
        identity = {"config": config, "method": key.method, "budget": key.budget_json}
        fingerprint = _hash({**identity, "data": self._data_hash})
        path = self._root(key) / "runs" / f"{key.slug}.json"
        cached = read_keyed_json(path, fingerprint)
        if cached is not None and self._head_ok(key):
            logger.info("%s seed %d: reusing cached run", key.column, key.seed)
            self.results[key] = cached
            return cached
        training = self._same_training(path, identity, key)
        if training is not None:  # the same head, asked about other test questions: score it, do not retrain
            logger.info("%s seed %d: rescoring the cached head on new test questions", key.column, key.seed)
            head = ConfidenceHead.from_pretrained(self._head_dir(key), model=self.model, tokenizer=self.tokenizer)
            confidence = self._predict(head)
        else:
            result = self._train(key)
            confidence, training = self._predict(result.model), result.to_dict()
        record = {
            "column": key.column,
            "seed": key.seed,
            "ids": [r.id for r in self.data.test_records()],
            "confidence": [round(float(c), 6) for c in confidence],
            "training": training,
        }
        write_keyed_json(path, fingerprint, json.loads(json.dumps(_nan_to_none(record), default=str)))
        record = {"key": fingerprint, **record}
        self.results[key] = record
        return record

    def _same_training(self, path: Path, identity: dict[str, Any], key: RunKey) -> dict[str, Any] | None:
        """The training of a cached run made with these settings and training/dev records but other test
        questions (its key, recomputed with its own test ids, matches), when its head is still there."""
        previous = read_cache_entry(path)
        if previous is None or "ids" not in previous or not self._head_ok(key):
            return None
        data = _hash([[r.id for r in self.data.train], [r.id for r in self.data.dev], list(previous["ids"])])
        return previous.get("training") if previous.get("key") == _hash({**identity, "data": data}) else None

    def _train(self, key: RunKey) -> TrainResult:
        config = replace(self.config, seed=key.seed)
        init_from = self._head_dir(RunKey("eli-only", None, key.seed)) if key.method == "elical" else None
        logger.info("training %s, seed %d (%s mode)", key.column, key.seed, config.mode)
        return train_elical(
            self.data.train,
            self.data.dev,
            method=key.method,
            config=config,
            out_dir=self._head_dir(key),
            budget=key.budget if key.budget is not None else WHOLE_POOL,
            init_from=init_from,
            model=self.model if config.mode == "head" else None,
            tokenizer=self.tokenizer,
        )

    def _predict(self, head: ConfidenceHead | None) -> np.ndarray:
        assert head is not None
        records = self.data.test_records()
        if self.config.mode == "lora":
            return head.predict(records, batch_size=self.config.eval_batch_size)
        features = head_features(head, head.prompts(records), self.config.feature_cache)
        with torch.no_grad():
            return head.head(torch.from_numpy(features).to(head.device)).cpu().numpy()

    def _root(self, key: RunKey) -> Path:
        return self.stage1_dir if key.method == "eli-only" else self.out_dir

    def _head_dir(self, key: RunKey) -> Path:
        return self._root(key) / "heads" / key.slug

    def _head_ok(self, key: RunKey) -> bool:
        """A cached run is reusable only with its head's training-questions manifest (heads saved before
        manifests existed are retrained once), and a stage-1 run only with its head, which EliCal runs resume."""
        head = self._head_dir(key)
        if not (head / MANIFEST_NAME).exists():
            return False
        return key.method != "eli-only" or (head / "elical_config.json").exists()


def _validate(data: SweepData, config: EliCalConfig, budgets: Sequence[Budget], methods: Sequence[str]) -> None:
    """Fail before training: unknown methods, overlap with test, missing fields, budgets over the pool."""
    unknown = [m for m in methods if m not in STAGES or m == "eli-only"]
    if unknown:
        raise CandorError(f"sweep methods are 'cal-only' and 'elical' (Eli-Only runs once per seed); got {unknown}")
    if not data.tests:
        raise CandorError("the sweep needs at least one test set")
    missing_roles = [ds for ds in data.tests if data.roles.get(ds) not in ("id", "ood")]
    if missing_roles:
        raise CandorError(f"test sets {missing_roles} need a role, 'id' or 'ood'")
    tests = data.test_records()
    guard = HeldOutQuestions.of(r.item.question for r in tests)
    guard.refuse_overlap((r.item.question for r in data.train), "the training pool")
    guard.refuse_overlap((r.item.question for r in data.dev), "the dev slice")
    check_disjoint(data.train, tests, "training")  # also refuses a shared id
    check_disjoint(data.dev, tests, "dev")
    check_disjoint(data.dev, data.train, "dev", "training")
    for kind in ("consistency", stage_target("cal", config.cal_target)):
        check_field(data.train, kind, what="the training pool")
        check_field(data.dev, kind, what="the dev slice")
    data.labels()
    for budget in budgets:
        budget.size(len(data.train))


def _per_dataset(run: Mapping[str, Any], ids: Mapping[str, list[str]]) -> dict[str, np.ndarray]:
    by_id = dict(zip(run["ids"], run["confidence"], strict=True))
    return {ds: np.array([by_id[i] for i in wanted], dtype=float) for ds, wanted in ids.items()}


def _cost(trainings: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    walls = [t["cost"]["wall_s"] for t in trainings]
    return {
        "wall_s_mean": round(float(np.mean(walls)), 2),
        "wall_s_total": round(float(np.sum(walls)), 2),
        "peak_rss_mib": max(t["cost"]["peak_rss_mib"] for t in trainings),
    }


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """Write JSON atomically (temporary file, then rename); NaN becomes null."""
    atomic_write_text(path, json.dumps(_nan_to_none(payload), indent=2, default=str) + "\n")


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, Mapping):
        return {str(k): _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


def sweep_table(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    """The lines ``candor sweep`` prints: each column's in-domain and OOD AUROC ×100, then where the curve went."""
    lines = []
    for name, entry in summary["methods"].items():
        cells = [f"{g.upper()} AUROC {100 * entry[g]['auroc']:5.1f}" for g in ("id", "ood") if g in entry]
        lines.append(f"{name:>20}  " + "  ".join(cells))
    lines.append(f"curve: {out_dir / 'curve.json'}, plot: {out_dir / 'budget_curve.png'}")
    return lines
