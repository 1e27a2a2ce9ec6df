"""EliCal's settings: :class:`EliCalConfig` and the paper's epoch rule (docs/methods.md "EliCal").

Beside :mod:`candor.train.elical.trainer` as TRL keeps ``dpo_config.py`` beside
``dpo_trainer.py``: what a run is asked to do, apart from how it runs. Each
field is a ``candor train elical -s KEY=VALUE`` setting.

Why not a ``transformers.TrainingArguments`` subclass: one EliCal run is up to
two stages, each with its own epochs (from its data size, below) and
learning rate (the head's in ``head`` mode), so each stage builds its own
``TrainingArguments`` from this config (:func:`candor.train.common.training_arguments`);
and the config's :meth:`~EliCalConfig.fingerprint` keys the sweep's cache,
which output folders, logging and device fields would break.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from candor.backends.default_model import DEFAULT_MODEL
from candor.train.common import ALL_PROJECTIONS
from candor.train.elical.model import MODES
from candor.train.elical.rules import CAL_SCOPES, DEFAULT_TARGET, RULE_FIELDS, target_rule
from candor.train.elical.targets import stage_target
from candor.train.elical.trainer import STOP_METRICS
from candor.train.settings import check_settings
from candor.util.errors import CandorError

# The paper's epochs (docs/methods.md "EliCal"; the official training scripts): 10 for a stage that trains on the
# full set (stage 1 always, stage 2 with budget "all"), else 50 when N ≤ 10k labels and 15 above.
SMALL_N = 10_000
EPOCHS_FULL, EPOCHS_SMALL, EPOCHS_LARGE = 10, 50, 15

DEFAULT_BATCH = {"head": 32, "lora": 8}


def paper_epochs(n: int, full_set: bool) -> int:
    """The paper's epochs for a stage: 10 on the full set, else 50 for up to 10k labels and 15 above."""
    if full_set:
        return EPOCHS_FULL
    return EPOCHS_SMALL if n <= SMALL_N else EPOCHS_LARGE


@dataclass
class EliCalConfig:
    """Settings of one EliCal training run; ``None`` fields take the mode's default."""

    mode: str = "head"
    model: str = DEFAULT_MODEL
    template: str = "auto"
    layer: int = -1
    cal_target: str = "soft"
    # The claim the head is trained for (rules.TARGETS): "universal" (no unseen domain loses ranking with more
    # labels) or "in-domain" (the best mean over domains). It sets stage 2's rule; cal_stop, cal_anchor and
    # cal_scope left as None take that rule's values, and one set explicitly overrides it.
    target: str = DEFAULT_TARGET
    cal_stop: str | None = None
    cal_anchor: float | None = None
    cal_scope: str | None = None
    learning_rate: float = 5e-5
    head_learning_rate: float = 1e-3
    weight_decay: float = 0.1
    warmup_ratio: float = 0.1
    epochs: int | None = None
    max_epochs: int | None = None
    batch_size: int | None = None
    eval_batch_size: int = 32
    gradient_accumulation: int = 1
    patience: int = 4
    recenter_bias: bool = True
    seed: int = 0
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ALL_PROJECTIONS
    feature_cache: str | None = None
    device: str | None = None
    dtype: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise CandorError(f"unknown EliCal mode {self.mode!r}; known: {', '.join(MODES)}")
        stage_target("cal", self.cal_target)
        shipped = target_rule(self.target).settings()
        for name in RULE_FIELDS:  # the target's rule fills what was not set explicitly
            if getattr(self, name) is None:
                setattr(self, name, shipped[name])
        if self.cal_stop not in STOP_METRICS:
            raise CandorError(f"unknown cal_stop {self.cal_stop!r}; known: {', '.join(STOP_METRICS)}")
        if self.cal_scope not in CAL_SCOPES:
            raise CandorError(f"unknown cal_scope {self.cal_scope!r}; known: {', '.join(CAL_SCOPES)}")
        if self.cal_anchor < 0:
            raise CandorError(f"cal_anchor is a penalty weight and cannot be negative, got {self.cal_anchor}")
        check_settings(self)

    @property
    def train_batch_size(self) -> int:
        return self.batch_size or DEFAULT_BATCH[self.mode]

    def epochs_for(self, n: int, full_set: bool = False) -> int:
        """Epochs of a stage on ``n`` questions: ``epochs`` when set, else the paper's rule; at most ``max_epochs``.

        ``full_set``: the stage trains on the whole pool (stage 1, or stage 2 with budget ``all``), not a budget.
        """
        epochs = self.epochs or paper_epochs(n, full_set)
        return min(epochs, self.max_epochs) if self.max_epochs else epochs

    def lora_settings(self) -> dict[str, Any] | None:
        if self.mode != "lora":
            return None
        return {
            "r": self.lora_r,
            "alpha": self.lora_alpha,
            "dropout": self.lora_dropout,
            "targets": list(self.lora_targets),
        }

    def fingerprint(self) -> dict[str, Any]:
        """The settings that change results (not where files go or which device runs them)."""
        out = asdict(self)
        for key in ("feature_cache", "device"):
            out.pop(key)
        out["lora_targets"] = list(self.lora_targets)
        if self.epochs is None:  # the rule decides the epochs, so it keys cached runs too
            out["epoch_rule"] = {"full": EPOCHS_FULL, "up_to": SMALL_N, "small": EPOCHS_SMALL, "large": EPOCHS_LARGE}
        return out
