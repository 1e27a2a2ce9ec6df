"""``candor train METHOD``: every trainable method by name, behind one call.

Each entry of :data:`TRAINERS` turns a :class:`TrainJob` (records files, output
folder, model, seed and ``KEY=VALUE`` settings for the method's config
dataclass) into a saved, reloadable artifact and returns its
:class:`~candor.training.TrainResult`.
Adding a method is one function and one decorator; the CLI never changes.
"""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from candor.cost import ResourceMeter
from candor.errors import CandorError
from candor.leakage import HeldOutQuestions
from candor.records import Record, read_records
from candor.registry import Registry
from candor.training import TrainResult

logger = logging.getLogger(__name__)


@dataclass
class TrainJob:
    """What ``candor train`` was asked: the same fields for every method.

    ``tests`` are the files the result will be evaluated on (records, QA files
    or dataset names); training refuses a pool or dev file sharing a question
    with them (:mod:`candor.leakage`).
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
        if not self.tests:
            logger.info("no --test files: the training pool is not checked against test questions")
            return
        guard = HeldOutQuestions.read(self.tests)
        guard.refuse_overlap((r.item.question for r in self.read_train()), str(self.records))
        dev = self.read_dev()
        if dev is not None:
            guard.refuse_overlap((r.item.question for r in dev), str(self.dev))


Trainer = Callable[[TrainJob], TrainResult]
TRAINERS: Registry[Trainer] = Registry("training method")


def run_training(method: str, job: TrainJob) -> TrainResult:
    """Run the named method on ``job``; returns what it saved, sizes and cost.

    Nothing trains when the job's pool or dev file overlaps its test files.
    """
    trainer = TRAINERS.get(method)
    job.refuse_test_overlap()
    return trainer(job)


# ------------------------------------------------------------------ settings


def parse_settings(pairs: list[str]) -> dict[str, str]:
    """``["lr=1e-4", "mode=lora"]`` → ``{"lr": "1e-4", "mode": "lora"}``."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CandorError(f"--set {pair!r}: expected KEY=VALUE, e.g. mode=lora")
        out[key.strip()] = value.strip()
    return out


def build_config(cls: type, settings: Mapping[str, str], **fixed: Any) -> Any:
    """An instance of the dataclass ``cls`` from string settings; see :func:`convert_settings`."""
    return cls(**convert_settings(cls, settings, **fixed))


def convert_settings(cls: type, settings: Mapping[str, str], prefix: str = "", **fixed: Any) -> dict[str, Any]:
    """String settings converted to the types of the dataclass ``cls``'s fields, plus ``fixed``.

    An unknown key is an error that lists the known ones; ``fixed`` values
    (model, seed) come from the command's own options and cannot be set twice.
    ``prefix`` is how the user spelled the keys' group (``weights.``), for messages.
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = dict(fixed)
    for key, text in settings.items():
        if key not in fields:
            known = ", ".join(prefix + name for name in sorted(fields))
            raise CandorError(f"unknown setting {prefix + key!r} for {cls.__name__}; known: {known}")
        if key in fixed:
            raise CandorError(f"setting {key!r} has its own option; use --{key.replace('_', '-')}")
        values[key] = _convert(text, hints[key], prefix + key)
    return values


def _convert(text: str, hint: Any, key: str) -> Any:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    if union and text.lower() in ("none", "null") and type(None) in typing.get_args(hint):
        return None
    for kind in options:
        origin = typing.get_origin(kind)
        try:
            if kind is bool:
                return _boolean(text)
            if origin is tuple:
                return tuple(part.strip() for part in text.split(",") if part.strip())
            if kind in (int, float, str):
                return kind(text)
        except ValueError:
            continue
    names = " or ".join(getattr(kind, "__name__", str(kind)) for kind in options)
    raise CandorError(f"setting {key}={text!r}: expected {names}")


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


# ------------------------------------------------------------------ EliCal


def _elical(method: str) -> Trainer:
    def run(job: TrainJob) -> TrainResult:
        from candor.backends.default_model import cache_root
        from candor.elical import EliCalConfig, carve_dev, parse_budget, train_elical

        settings = dict(job.settings)
        budget = parse_budget(settings.pop("budget", "all"))
        init_from = settings.pop("init_from", None)
        settings.setdefault("feature_cache", str(cache_root() / "features"))  # head mode: reruns skip the backbone
        config = build_config(EliCalConfig, settings, model=job.model, seed=job.seed)
        pool = job.read_train()
        dev = job.read_dev()
        if dev is None:
            pool, dev = carve_dev(pool, seed=job.seed)
            logger.info("no --dev file: carved a dev slice of %d records from the training pool", len(dev))
        return train_elical(
            pool, dev, method=method, config=config, out_dir=job.out, budget=budget, init_from=init_from,
            source=job.records, dev_source=job.dev if job.dev is not None else f"dev slice carved from {job.records}",
        )

    return run


for _method in ("elical", "eli-only", "cal-only"):
    TRAINERS.register(_method)(_elical(_method))


# ------------------------------------------------------------------ ADVICE, ConfTuner


def _verbal_finetune(method: str) -> Trainer:
    def run(job: TrainJob) -> TrainResult:
        from candor.advice import LossWeights, method_config, train

        settings = dict(job.settings)
        # weights.jsd=0 etc. adjust the method's preset loss weights (ablations).
        weight_keys = {k: settings.pop(k) for k in list(settings) if k.startswith("weights.")}
        preset = method_config(method)
        overrides = convert_settings(type(preset), settings, model=job.model, seed=job.seed)
        if weight_keys:
            changes = convert_settings(LossWeights, {k.removeprefix("weights."): v for k, v in weight_keys.items()},
                                       prefix="weights.")  # fmt: skip
            overrides["weights"] = dataclasses.replace(preset.weights, **changes)
        config = method_config(method, **overrides)
        return train(config, job.read_train(), job.out, dev_records=job.read_dev(), source=job.records)

    return run


for _method in ("advice", "conftuner", "advice+conftuner"):
    TRAINERS.register(_method)(_verbal_finetune(_method))


# ------------------------------------------------------------------ answer probe


@TRAINERS.register("probe")
def _probe(job: TrainJob) -> TrainResult:
    """The SAPLMA-style answer probe on the greedy answers' hidden states (candor.answer_probe)."""
    from candor.answer_probe import ProbeConfig, train_probe
    from candor.backends import load_backend
    from candor.backends.default_model import cache_root

    settings = dict(job.settings)
    settings.setdefault("feature_cache", str(cache_root() / "features"))  # reruns skip the backbone
    config = build_config(ProbeConfig, settings)
    backend = load_backend(job.model, device=config.device, batch_size=config.batch_size)
    with ResourceMeter() as meter:
        probe = train_probe(job.read_train(), backend, job.out, config, sources=[str(job.records)])
    return TrainResult(path=Path(job.out), method="probe", n_train=int(probe.info.meta["n_train"]),
                       cost=meter.cost.as_dict(), config={"layer": probe.info.layer, **dataclasses.asdict(config)})
