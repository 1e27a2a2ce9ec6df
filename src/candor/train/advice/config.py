"""The settings of ADVICE, ConfTuner and ADVICE+ConfTuner: one config class per method.

See docs/methods.md "ADVICE and ConfTuner".

Beside :mod:`candor.train.advice.trainer` as TRL keeps ``dpo_config.py`` beside
``dpo_trainer.py``. :class:`AdviceConfig` holds ADVICE's paper settings;
:class:`ConfTunerConfig` is the same fields with ConfTuner's defaults (single
answers, the tokenized Brier loss, a smaller LoRA on q and v, 3 epochs).
ADVICE+ConfTuner is ADVICE with the Brier term switched on. Each field is a
``candor train METHOD -s KEY=VALUE`` setting.

Why not ``transformers.TrainingArguments`` subclasses: a config is frozen
and hashed (the benchmarks key their run caches by :meth:`AdviceConfig.as_dict`),
which ``TrainingArguments``' output folders, device probing and logging fields
would break; :func:`candor.train.advice.pipeline.build_trainer` builds the arguments
from the config instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from candor.backends.default_model import DEFAULT_MODEL
from candor.train.advice.losses import LossWeights
from candor.train.common import ATTENTION_PROJECTIONS, QUERY_VALUE
from candor.train.settings import check_settings
from candor.util.errors import CandorError
from candor.util.registry import Registry
from candor.verbal.formats import get_format

DATA_KINDS = ("pairs", "answers")


@dataclass(frozen=True)
class AdviceConfig:
    """Everything that defines one ADVICE run (see :mod:`candor.train.advice.pipeline` for the presets' table)."""

    method: str = "advice"
    model: str = DEFAULT_MODEL
    data: str = "pairs"  # "pairs" (triplets) or "answers" (records with correctness)
    weights: LossWeights = field(default_factory=LossWeights)
    formats: tuple[str, ...] = ("letter", "number")
    variant: str = "default"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_targets: tuple[str, ...] = ATTENTION_PROJECTIONS
    lora_dropout: float = 0.0
    learning_rate: float = 1e-5
    epochs: float = 4.0
    batch_size: int = 16
    gradient_accumulation: int = 2
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    seed: int = 0
    max_examples: int | None = None  # a seeded cap on triplets / records (CPU-scale runs)
    padding_side: str = "left"
    share_prefix: bool = True  # run the shared system prompt once per batch (same numbers, less compute)
    group_by_length: bool = True  # batch examples of similar length (less padding)
    dtype: str | None = None
    judge: str | None = None  # triplet builder's correctness judge (default: the records' own)
    extra_samples: int = 5  # triplet builder: samples per extra round for records without a wrong sample
    extra_rounds: int = 2
    logging_steps: int = 0  # 0: log once per epoch

    def __post_init__(self) -> None:
        if self.data not in DATA_KINDS:
            raise CandorError(f"training data must be one of {', '.join(DATA_KINDS)}, got {self.data!r}")
        if not self.formats:
            raise CandorError("training needs at least one verbalized confidence format")
        for name in self.formats:
            get_format(name)  # unknown formats fail here
        if self.data == "answers" and self.weights.pairwise:
            raise CandorError(f"{self.method}: the pairwise loss terms (jsd, margin, sum) need pair data")
        check_settings(self)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["formats"], out["lora_targets"] = list(self.formats), list(self.lora_targets)
        return out


@dataclass(frozen=True)
class ConfTunerConfig(AdviceConfig):
    """ConfTuner: (question, answer, correctness) examples, tokenized Brier only, LoRA r=8 α=32 on q, v, 3 epochs."""

    method: str = "conftuner"
    data: str = "answers"
    weights: LossWeights = field(default_factory=lambda: LossWeights(lm=0.0, jsd=0.0, margin=0.0, sum=0.0, brier=1.0))
    lora_r: int = 8
    lora_targets: tuple[str, ...] = QUERY_VALUE
    epochs: float = 3.0


# Each method's config factory: its class with the method's defaults.
METHODS: Registry[Callable[..., AdviceConfig]] = Registry("confidence training method")
METHODS.register("advice")(AdviceConfig)
METHODS.register("conftuner")(ConfTunerConfig)
METHODS.register("advice+conftuner")(partial(AdviceConfig, method="advice+conftuner", weights=LossWeights(brier=1.0)))


def method_config(method: str, /, **overrides: Any) -> AdviceConfig:
    """The paper preset of ``method`` with ``overrides`` (e.g. ``epochs=2``, ``weights=LossWeights(...)``)."""
    factory = METHODS.get(method)
    if "method" in overrides:
        raise CandorError(f"{method}: the method is chosen by name (candor train METHOD), not by a 'method' setting")
    try:
        return factory(method=method, **overrides)
    except TypeError as exc:
        raise CandorError(f"{method}: bad training option ({exc})") from None
