"""What every candor trainer shares, and the table of trainable methods behind ``candor train METHOD``.

The trainers themselves (EliCal, ADVICE, ConfTuner) are small
``transformers.Trainer`` subclasses that override ``compute_loss`` and nothing
else (docs/architecture.md "Scale", TRL style), so ``accelerate launch`` gives multi-GPU
training unchanged. This module holds what they have in common:

- :func:`load_causal_lm`: the embedded default, a local directory or a cached
  hub id, with its tokenizer (nothing is downloaded);
- :func:`lora_config` and the target-module sets of the papers;
- :func:`training_arguments`: the papers' optimizer settings with CPU-friendly
  defaults (no reports, no checkpoints unless asked, the CPU when no GPU);
- :func:`check_settings`: the ranges of the hyperparameters every config shares;
- :class:`TrainResult`: what every trainer returns.

and the table of methods: each entry of :data:`TRAINERS` turns a
:class:`TrainJob` (records files, output folder, model, seed and
``KEY=VALUE`` settings for the method's config dataclass, parsed by
:func:`parse_settings` and :func:`build_config`) into a saved, reloadable
artifact and returns its :class:`TrainResult`. Adding a method is one
function and one decorator; the CLI never changes. The methods' packages are
imported only when their entry runs, so reading this table stays cheap.

What a run cost is measured by :mod:`candor.util.resource_meter`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from candor.annotation.contamination import HeldOutQuestions
from candor.annotation.records import Record, read_records
from candor.backends.default_model import DEFAULT_MODEL
from candor.util.errors import CandorError
from candor.util.files import atomic_write_text
from candor.util.registry import Registry
from candor.util.resource_meter import ResourceMeter

logger = logging.getLogger(__name__)


# LoRA target modules (Llama/Qwen/Gemma naming).
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
ALL_PROJECTIONS = ATTENTION_PROJECTIONS + MLP_PROJECTIONS
QUERY_VALUE = ("q_proj", "v_proj")


def load_causal_lm(name_or_path: str = DEFAULT_MODEL, dtype: str | None = None, device: str | None = None) -> Any:
    """``(model, tokenizer)`` to train: float32 on CPU, bfloat16 on CUDA unless ``dtype`` says otherwise.

    The tokenizer gets a pad token (EOS) when it has none. Unknown models are a
    :class:`CandorError` naming them; nothing is downloaded.
    """
    import torch

    from candor.backends.hf import load_model_and_tokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_model_and_tokenizer(name_or_path, dtype=dtype, device=device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def lora_config(
    r: int, alpha: int, targets: tuple[str, ...], dropout: float = 0.0, task_type: str | None = "CAUSAL_LM"
) -> Any:
    """A ``peft.LoraConfig``; ``task_type=None`` for a backbone wrapped by a custom head."""
    from peft import LoraConfig

    return LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets), bias="none", task_type=task_type
    )


def training_arguments(
    output_dir: str | Path,
    *,
    learning_rate: float,
    epochs: float,
    batch_size: int,
    gradient_accumulation: int = 1,
    warmup_ratio: float = 0.0,
    weight_decay: float = 0.0,
    seed: int = 0,
    evaluate_each_epoch: bool = False,
    **overrides: Any,
) -> Any:
    """``TrainingArguments`` with AdamW + linear decay and the given paper settings.

    Nothing is reported to trackers. With ``evaluate_each_epoch`` the trainer
    evaluates and checkpoints every epoch and reloads the best checkpoint by
    eval loss at the end (what early stopping needs); otherwise it saves
    nothing itself and the caller saves the final model.
    """
    import torch
    from transformers import TrainingArguments

    strategy = "epoch" if evaluate_each_epoch else "no"
    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "learning_rate": learning_rate,
        "num_train_epochs": epochs,
        "per_device_train_batch_size": batch_size,
        "per_device_eval_batch_size": batch_size,
        "gradient_accumulation_steps": gradient_accumulation,
        **warmup_settings(warmup_ratio),
        "weight_decay": weight_decay,
        "lr_scheduler_type": "linear",
        "optim": "adamw_torch",
        "seed": seed,
        "data_seed": seed,
        "eval_strategy": strategy,
        "save_strategy": strategy,
        "save_total_limit": 1 if evaluate_each_epoch else None,
        "load_best_model_at_end": evaluate_each_epoch,
        "metric_for_best_model": "eval_loss" if evaluate_each_epoch else None,
        "greater_is_better": False if evaluate_each_epoch else None,
        "report_to": "none",
        "logging_strategy": "epoch",
        "disable_tqdm": True,
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
        "use_cpu": not torch.cuda.is_available(),
        # bf16 mixed precision on GPUs that have it (the papers' setting); CPUs train in fp32.
        "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        "save_safetensors": True,
    }
    settings.update(overrides)
    try:
        return TrainingArguments(**settings)
    except TypeError:  # an argument this transformers version does not know (e.g. save_safetensors)
        settings.pop("save_safetensors", None)
        return TrainingArguments(**settings)


def warmup_settings(ratio: float, arguments_class: type | None = None) -> dict[str, float]:
    """The ``TrainingArguments`` keyword that warms up over ``ratio`` of the steps, in this transformers.

    transformers 4.x has a ``warmup_ratio`` field and reads ``warmup_steps`` as a
    count (so 0.1 there means no warmup at all); transformers 5 dropped
    ``warmup_ratio`` and reads a ``warmup_steps`` below 1 as a ratio. Asking the
    dataclass which fields it has works for both without parsing versions.
    """
    if not 0.0 <= ratio < 1.0:
        raise CandorError(f"warmup_ratio must be in [0, 1), got {ratio}")
    if arguments_class is None:
        from transformers import TrainingArguments as arguments_class
    fields = {f.name for f in dataclasses.fields(arguments_class)}
    return {"warmup_ratio": ratio} if "warmup_ratio" in fields else {"warmup_steps": ratio}


# ------------------------------------------------------------------ checks


def _positive(value: Any) -> bool:
    return value > 0


def _at_least_one(value: Any) -> bool:
    return value >= 1


def _not_negative(value: Any) -> bool:
    return value >= 0


def _fraction(value: Any) -> bool:
    return 0 <= value < 1


# What each shared hyperparameter name must be; a config field of that name is checked by it.
SETTING_RULES: dict[str, tuple[Any, str]] = {
    "learning_rate": (_positive, "a positive number"),
    "head_learning_rate": (_not_negative, "at least 0"),  # 0 freezes the head
    "epochs": (_positive, "a positive number"),
    "max_epochs": (_at_least_one, "at least 1"),
    "batch_size": (_at_least_one, "at least 1"),
    "eval_batch_size": (_at_least_one, "at least 1"),
    "gradient_accumulation": (_at_least_one, "at least 1"),
    "patience": (_at_least_one, "at least 1"),
    "max_examples": (_at_least_one, "at least 1"),
    "lora_r": (_at_least_one, "at least 1"),
    "lora_alpha": (_positive, "a positive number"),
    "lora_dropout": (_fraction, "in [0, 1)"),
    "warmup_ratio": (_fraction, "in [0, 1)"),
    "weight_decay": (_not_negative, "at least 0"),
    "extra_samples": (_not_negative, "at least 0"),
    "extra_rounds": (_not_negative, "at least 0"),
    "logging_steps": (_not_negative, "at least 0"),
}


def check_settings(config: Any) -> None:
    """Raise a :class:`CandorError` for the first field of the dataclass ``config`` outside its range.

    Fields set to ``None`` (take the default) pass. Without this, a batch size
    of 0 or a negative learning rate would train quietly, or fail deep inside
    transformers or peft with a traceback.
    """
    for item in dataclasses.fields(config):
        rule = SETTING_RULES.get(item.name)
        value = getattr(config, item.name)
        if rule is not None and value is not None and not rule[0](value):
            raise CandorError(f"{type(config).__name__}: {item.name}={value!r} must be {rule[1]}")


# ------------------------------------------------------------------ results


@dataclass
class TrainResult:
    """What every trainer returns (and writes to ``training.json`` beside what it saved).

    The common part: the saved folder, the method, how many examples it trained
    and stopped on, the cost and the log history. Method-specific parts are
    typed fields left empty by the others: EliCal's ``stages`` and label
    ``budget``, ADVICE's ``triplet_stats``. ``model`` keeps the trained EliCal
    head in memory (not written).
    """

    path: Path
    method: str
    n_train: int
    n_dev: int = 0
    cost: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] | None = None
    stages: list[Any] = field(default_factory=list)
    budget: int | str | None = None
    triplet_stats: Any = None
    held_out: dict[str, Any] | None = None  # EliCal: AUROC on each pool dataset when trained without it
    model: Any = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": str(self.path),
            "method": self.method,
            "n_train": self.n_train,
            "n_dev": self.n_dev,
            "cost": self.cost,
            "history": self.history,
            "config": self.config,
        }
        if self.stages:
            out["budget"] = self.budget
            out["stages"] = [dataclasses.asdict(stage) for stage in self.stages]
        if self.triplet_stats is not None:
            out["triplet_stats"] = self.triplet_stats.as_dict()
        if self.held_out is not None:
            out["held_out_domains"] = self.held_out
        return out


# ------------------------------------------------------------------ the table of methods


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
        from candor.train.elical import EliCalConfig, carve_dev, parse_budget, train_elical
        from candor.train.elical.selection import held_out_report
        from candor.util.files import cache_root

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
        # One frozen backbone for the head and its held-out retrainings (lora mode loads a fresh one per run).
        model, tokenizer = load_causal_lm(config.model, dtype=config.dtype, device=config.device) \
            if config.mode == "head" else (None, None)
        result = train_elical(
            pool, dev, method=method, config=config, out_dir=job.out, budget=budget, init_from=init_from,
            source=job.records, dev_source=job.dev if job.dev is not None else f"dev slice carved from {job.records}",
            model=model, tokenizer=tokenizer,
        )
        # Generality, not just in-domain dev loss: retrain without each dataset of the pool and score it.
        result.held_out = held_out_report(pool, dev, method=method, config=config, budget=budget, model=model,
                                          tokenizer=tokenizer)
        if result.held_out is not None:
            atomic_write_text(Path(result.path) / "training.json", json.dumps(result.to_dict(), indent=2,
                                                                              default=str) + "\n")
        return result

    return run


for _method in ("elical", "eli-only", "cal-only"):
    TRAINERS.register(_method)(_elical(_method))


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
    return TrainResult(path=Path(job.out), method="probe", n_train=int(probe.info.meta["n_train"]),
                       cost=meter.cost.as_dict(), config={"layer": probe.info.layer, **dataclasses.asdict(config)})
