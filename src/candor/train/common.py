"""What every candor trainer builds on: the model it trains, its LoRA and optimizer settings, and its result.

The trainers themselves (EliCal, ADVICE, ConfTuner) are small
``transformers.Trainer`` subclasses that override ``compute_loss`` and nothing
else (docs/architecture.md "Scale", TRL style), so ``accelerate launch`` gives multi-GPU
training unchanged. This module holds what they have in common:

- :func:`load_causal_lm`: the embedded default, a local directory or a cached
  hub id, with its tokenizer (nothing is downloaded);
- :func:`lora_config` and the target-module sets of the papers;
- :func:`training_arguments`: the papers' optimizer settings with CPU-friendly
  defaults (no reports, no checkpoints unless asked, the CPU when no GPU);
- :class:`TrainResult`: what every trainer returns;
- :func:`refuse_test_overlap`: no training or dev record may be a test question.

It sits below every method package (:mod:`candor.train.elical`,
:mod:`candor.train.advice`) and imports none of them; the table of methods
is :mod:`candor.train.trainers`, the settings' parsing and ranges
:mod:`candor.train.settings`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from candor.annotation.contamination import HeldOutQuestions
from candor.annotation.records import Record
from candor.backends.default_model import DEFAULT_MODEL
from candor.util.errors import CandorError

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
    budget: int | str | None = None  # EliCal: the label budget as written, a count or "all" (Budget.as_json)
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


# ------------------------------------------------------------------ test questions


def refuse_test_overlap(
    tests: HeldOutQuestions | None,
    pool: Sequence[Record],
    dev: Sequence[Record] | None,
    source: str | Path | None,
    dev_source: str | Path | None,
) -> None:
    """Raise when the training pool or the dev records share a question with the test questions ``tests``.

    ``source`` and ``dev_source`` name the files they came from, for the message. ``tests`` None
    checks nothing (and says so in the log).
    """
    if tests is None:
        logger.info("no test files: the training pool is not checked against test questions")
        return
    tests.refuse_overlap((r.item.question for r in pool), str(source))
    if dev is not None:
        tests.refuse_overlap((r.item.question for r in dev), str(dev_source))
