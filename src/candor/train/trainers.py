"""The table of trainable methods behind ``candor train METHOD``.

Each entry of :data:`TRAINERS` turns a :class:`TrainJob` (records files,
output folder, model, seed and ``KEY=VALUE`` settings for the method's config
dataclass, parsed by :mod:`candor.train.settings`) into a saved, reloadable
artifact and returns its :class:`~candor.train.common.TrainResult`. Adding a
method is one function and one decorator; the CLI never changes. The
methods' packages are imported only when their entry runs, so reading this
table stays cheap. What every method builds on is :mod:`candor.train.common`;
nothing in a method's package imports this table.

What a run cost is measured by :mod:`candor.util.resource_meter`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from candor.annotation.contamination import HeldOutQuestions
from candor.annotation.records import Record, read_records
from candor.train.common import TrainResult, refuse_test_overlap
from candor.train.settings import build_config, convert_settings
from candor.util.registry import Registry
from candor.util.resource_meter import ResourceMeter

logger = logging.getLogger(__name__)


@dataclass
class TrainJob:
    """What ``candor train`` was asked: the same fields for every method.

    ``tests`` are the files the result will be evaluated on (records, QA files
    or dataset names); training refuses a pool or dev file sharing a question
    with them (:mod:`candor.annotation.contamination`).
    """

    records: Path
    out: Path
    model: str
    dev: Path | None = None
    seed: int = 0
    settings: dict[str, str] = field(default_factory=dict)
    tests: list[str] = field(default_factory=list)
    _cache: dict[str, list[Record] | None] = field(default_factory=dict, init=False, repr=False)

    def read_train(self) -> list[Record]:
        if "train" not in self._cache:
            self._cache["train"] = read_records(self.records)
        return list(self._cache["train"] or [])

    def read_dev(self) -> list[Record] | None:
        if "dev" not in self._cache:
            self._cache["dev"] = read_records(self.dev) if self.dev is not None else None
        dev = self._cache["dev"]
        return list(dev) if dev is not None else None

    def refuse_test_overlap(self) -> None:
        """Raise when the pool or the dev file shares a question with the test files."""
        tests = HeldOutQuestions.read(self.tests) if self.tests else None
        refuse_test_overlap(tests, self.read_train(), self.read_dev(), self.records, self.dev)


Trainer = Callable[[TrainJob], TrainResult]
TRAINERS: Registry[Trainer] = Registry("training method")


def run_training(method: str, job: TrainJob) -> TrainResult:
    """Run the named method on ``job``; returns what it saved, sizes and cost.

    Nothing trains when the job's pool or dev file overlaps its test files.
    """
    trainer = TRAINERS.get(method)
    job.refuse_test_overlap()
    return trainer(job)


# ------------------------------------------------------------------ EliCal


def _elical(method: str) -> Trainer:
    def run(job: TrainJob) -> TrainResult:
        from candor.train.elical import Budget, EliCalConfig, TrainingPool
        from candor.train.elical.held_out import train_with_held_out_report
        from candor.util.files import cache_root

        settings = dict(job.settings)
        budget = Budget.parse(settings.pop("budget", "all"))  # the one place `--set budget=` is read
        init_from = settings.pop("init_from", None)
        settings.setdefault("feature_cache", str(cache_root() / "features"))  # head mode: reruns skip the backbone
        config = build_config(EliCalConfig, settings, model=job.model, seed=job.seed)
        # run_training already refused test questions in the pool and dev file.
        data = TrainingPool.of(job.read_train(), job.read_dev(), seed=job.seed, source=job.records, dev_source=job.dev)
        return train_with_held_out_report(
            data, method=method, config=config, budget=budget, out_dir=job.out, init_from=init_from
        )

    return run


for _method in ("elical", "eli-only", "cal-only"):
    TRAINERS.register(_method)(_elical(_method))


@TRAINERS.register("elical-claims")
def _elical_claims(job: TrainJob) -> TrainResult:
    """The EliCal claim head on compound-prompt records (candor.train.elical.claim_head)."""
    from candor.annotation.judges import DEFAULT_CONSISTENCY_JUDGE
    from candor.train.elical import Budget, EliCalConfig, TrainingPool
    from candor.train.elical.claim_head import AUTO, train_claim_head
    from candor.util.errors import CandorError

    settings = dict(job.settings)
    budget = Budget.parse(settings.pop("budget", "all"))  # a number of claim labels, or all
    pooling = settings.pop("pooling", AUTO)
    judge = settings.pop("judge", DEFAULT_CONSISTENCY_JUDGE)
    # A claim has one label: stage 2 trains on it, so the question head's soft target has no meaning here.
    if settings.setdefault("cal_target", "hard") != "hard":
        raise CandorError("elical-claims: stage 2 trains on each claim's label; cal_target can only be 'hard'")
    for key, why in (("mode", "the claim head reads a frozen backbone"), ("feature_cache", "features stay in memory")):
        if key in settings and not (key == "mode" and settings[key] == "head"):
            raise CandorError(f"elical-claims does not take {key}= ({why})")
    config = build_config(EliCalConfig, settings, model=job.model, seed=job.seed)
    data = TrainingPool.of(job.read_train(), job.read_dev(), seed=job.seed, source=job.records, dev_source=job.dev)
    return train_claim_head(
        data.pool,
        data.dev,
        out_dir=job.out,
        config=config,
        budget=budget,
        pooling=pooling,
        judge=judge,
        source=data.source,
        dev_source=data.dev_source,
    )


# ------------------------------------------------------------------ ADVICE, ConfTuner


def _verbal_finetune(method: str) -> Trainer:
    def run(job: TrainJob) -> TrainResult:
        from candor.train.advice import LossWeights, method_config, train

        settings = dict(job.settings)
        # weights.jsd=0 etc. adjust the method's preset loss weights (ablations).
        weight_keys = {k: settings.pop(k) for k in list(settings) if k.startswith("weights.")}
        preset = method_config(method)
        overrides = convert_settings(type(preset), settings, model=job.model, seed=job.seed)
        if weight_keys:
            changes = convert_settings(
                LossWeights, {k.removeprefix("weights."): v for k, v in weight_keys.items()}, prefix="weights."
            )
            overrides["weights"] = dataclasses.replace(preset.weights, **changes)
        config = method_config(method, **overrides)
        return train(config, job.read_train(), job.out, dev_records=job.read_dev(), source=job.records)

    return run


for _method in ("advice", "conftuner", "advice+conftuner"):
    TRAINERS.register(_method)(_verbal_finetune(_method))


# ------------------------------------------------------------------ answer probe


@TRAINERS.register("probe")
def _probe(job: TrainJob) -> TrainResult:
    """The SAPLMA-style answer probe on the greedy answers' hidden states (candor.train.probe)."""
    from candor.backends import load_backend
    from candor.train.probe import ProbeConfig, train_probe
    from candor.util.files import cache_root

    settings = dict(job.settings)
    settings.setdefault("feature_cache", str(cache_root() / "features"))  # reruns skip the backbone
    config = build_config(ProbeConfig, settings)
    backend = load_backend(job.model, device=config.device, batch_size=config.batch_size)
    with ResourceMeter() as meter:
        probe = train_probe(job.read_train(), backend, job.out, config, sources=[str(job.records)])
    return TrainResult(
        path=Path(job.out),
        method="probe",
        n_train=int(probe.info.meta["n_train"]),
        cost=meter.cost.as_dict(),
        config={"layer": probe.info.layer, **dataclasses.asdict(config)},
    )
