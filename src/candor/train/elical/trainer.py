"""The EliCal Trainer: MSE between predicted confidence and soft targets.

See docs/methods.md "EliCal"; docs/architecture.md "Scale".

:class:`EliCalTrainer` is a ``transformers.Trainer`` whose ``compute_loss``
holds the method's loss and nothing else, so ``accelerate launch`` gives
multi-GPU training unchanged. It trains either model the package has:

- a :class:`~candor.train.elical.model.ConfidenceHead` on token ids (``lora`` mode),
  batches made by :class:`PromptCollator`;
- a bare :class:`~candor.train.elical.model.LinearHead` on cached features (``head``
  mode), batches made by :func:`collate_features`.

Early stopping is :class:`BestOnDev`: it evaluates the dev slice every epoch
(its loss, or its AUROC against greedy correctness, see :data:`STOP_METRICS`),
keeps an in-memory copy of the trainable weights at the best epoch, stops
after ``patience`` epochs without improvement and restores the best weights at
the end. ``anchor`` adds an L2-SP penalty, ``anchor * sum ||w - w_start||^2``
over the trainable weights (not biases), that keeps a resumed stage near the
weights it started from. Keeping only the trainable weights (head, LoRA) avoids the Trainer's
per-epoch checkpoints, which would write the whole frozen backbone each epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import PrinterCallback

from candor.backends.tokens import pad_batch

logger = logging.getLogger(__name__)

TARGET_KEY = "labels"

# Early-stopping metrics: name -> (key in the Trainer's eval metrics, whether higher is better).
STOP_METRICS: dict[str, tuple[str, bool]] = {"loss": ("eval_loss", False), "auroc": ("eval_auroc", True)}


class Examples(Dataset):
    """A list of example dicts (token ids or a feature row, and a target)."""

    def __init__(self, examples: list[dict[str, Any]]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.examples[i]


def prompt_examples(token_ids: Sequence[Sequence[int]], targets: np.ndarray) -> Examples:
    return Examples([{"input_ids": list(ids), TARGET_KEY: float(t)} for ids, t in zip(token_ids, targets, strict=True)])


def feature_examples(features: np.ndarray, targets: np.ndarray) -> Examples:
    rows = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    return Examples([{"features": rows[i], TARGET_KEY: float(t)} for i, t in enumerate(targets)])


@dataclass
class PromptCollator:
    """Pad token ids (left by default; the model reads the last real token either way)."""

    pad_id: int
    side: str = "left"

    def __call__(self, batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids, mask = pad_batch([ex["input_ids"] for ex in batch], self.pad_id, self.side)
        targets = torch.tensor([ex[TARGET_KEY] for ex in batch], dtype=torch.float32)
        return {"input_ids": ids, "attention_mask": mask, TARGET_KEY: targets}


def collate_features(batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {
        "features": torch.stack([ex["features"] for ex in batch]),
        TARGET_KEY: torch.tensor([ex[TARGET_KEY] for ex in batch], dtype=torch.float32),
    }


class EliCalTrainer(Trainer):
    """``Trainer`` with EliCal's loss; ``head_learning_rate`` gives the head its own rate (lora mode)."""

    def __init__(
        self,
        *args: Any,
        head_parameters: Iterable[nn.Parameter] = (),
        head_learning_rate: float | None = None,
        anchor: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.head_parameters = list(head_parameters)
        self.head_learning_rate = head_learning_rate
        self.anchor = anchor
        # L2-SP's reference point: the trainable weights as the stage starts (biases move freely).
        self._start = {n: p.detach().clone() for n, p in anchored_parameters(self.model)} if anchor > 0 else {}
        self.remove_callback(PrinterCallback)  # library code logs; it does not print

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        targets = inputs[TARGET_KEY]
        confidence = model(**{k: v for k, v in inputs.items() if k != TARGET_KEY})
        loss = F.mse_loss(confidence.float(), targets.float())
        if self._start and model.training:
            loss = loss + self.anchor * l2_sp(model, self._start)
        return (loss, {"confidence": confidence}) if return_outputs else loss

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        optimizer = super().create_optimizer(model)
        if self.head_learning_rate is not None and self.head_parameters:
            _split_head_groups(optimizer, self.head_parameters, self.head_learning_rate)
        return optimizer


def anchored_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The weights L2-SP holds near their start: trainable, and not a bias."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad and not n.endswith("bias")]


def l2_sp(model: nn.Module, start: dict[str, torch.Tensor]) -> torch.Tensor:
    """``sum ||w - w_start||^2`` over ``start``'s weights (Li et al., 2018, "L2-SP")."""
    params = dict(model.named_parameters())
    return sum(((params[n].float() - w.float()) ** 2).sum() for n, w in start.items())


def auroc_metrics(labels: np.ndarray) -> Callable[[Any], dict[str, float]]:
    """A Trainer ``compute_metrics`` scoring dev confidences by AUROC against ``labels`` (greedy correctness).

    The eval loader keeps the dev order, so predictions line up with ``labels``. A dev slice with one
    class has no AUROC; the score is then 0.5 (no ranking), so stopping falls back to the first epoch.
    """
    labels = np.asarray(labels).astype(int)

    def compute(prediction: Any) -> dict[str, float]:
        scores = np.asarray(prediction.predictions, dtype=float).reshape(-1)
        if labels.min() == labels.max():
            return {"auroc": 0.5}
        return {"auroc": float(roc_auc_score(labels, scores))}

    return compute


def _split_head_groups(optimizer: torch.optim.Optimizer, head: list[nn.Parameter], lr: float) -> None:
    """Move the head's parameters into groups of their own at rate ``lr`` (before any step)."""
    ids = {id(p) for p in head}
    for group in list(optimizer.param_groups):
        mine = [p for p in group["params"] if id(p) in ids]
        if not mine:
            continue
        group["params"] = [p for p in group["params"] if id(p) not in ids]
        optimizer.add_param_group({**{k: v for k, v in group.items() if k != "params"}, "params": mine, "lr": lr})


@dataclass
class BestOnDev(TrainerCallback):
    """Early stopping on a dev metric (:data:`STOP_METRICS`) with the best trainable weights kept and restored.

    ``best_loss`` is the dev loss at the best epoch, whichever metric picks it; ``best_score`` the metric there.
    """

    patience: int = 4
    metric: str = "loss"
    best_loss: float = float("inf")
    best_score: float | None = None
    best_epoch: float = 0.0
    bad_epochs: int = 0
    stopped_early: bool = False
    _best: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict | None = None, model: Any = None, **kwargs: Any
    ) -> None:
        key, higher = STOP_METRICS[self.metric]
        score, loss = (metrics or {}).get(key), (metrics or {}).get("eval_loss")
        if score is None or model is None:
            return
        logger.info("epoch %.0f: dev %s %.5f", state.epoch or 0, self.metric, score)
        if self._improves(float(score), higher):
            self.best_score, self.best_epoch, self.bad_epochs = float(score), float(state.epoch or 0), 0
            self.best_loss = float(loss) if loss is not None else float("nan")
            self._best = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
            return
        self.bad_epochs += 1
        if self.bad_epochs >= self.patience:
            control.should_training_stop = True
            # Patience running out on the last planned epoch stops nothing: training ends there anyway.
            planned = getattr(args, "num_train_epochs", None)
            self.stopped_early = planned is None or (state.epoch or 0) < planned

    def _improves(self, score: float, higher: bool) -> bool:
        if self.best_score is None:
            return True
        return score > self.best_score if higher else score < self.best_score

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None or not self._best:
            return
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in self._best.items():
                params[name].copy_(value)
        self._best = {}


def epoch_history(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """``[{"epoch", "train_loss", "dev_loss"}]`` from a Trainer's log history (one entry per epoch)."""
    by_epoch: dict[float, dict[str, float]] = {}
    for entry in log_history:
        epoch = round(float(entry.get("epoch", 0.0)), 3)
        row = by_epoch.setdefault(epoch, {"epoch": epoch})
        if "loss" in entry:
            row["train_loss"] = float(entry["loss"])
        if "eval_loss" in entry:
            row["dev_loss"] = float(entry["eval_loss"])
    return [row for _, row in sorted(by_epoch.items()) if len(row) > 1]
