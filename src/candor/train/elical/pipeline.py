"""Training EliCal: stage 1 (Eli), stage 2 (Cal), and the three methods built from them (docs/methods.md "EliCal").

- ``eli-only``: stage 1 on the consistency rate of every training question.
- ``cal-only``: stage 2 from scratch on N labelled questions.
- ``elical``: stage 1, then stage 2 resuming it with the LoRA weights still
  trainable (or from a saved stage-1 head, ``init_from``).

Every stage stops early on the loss of a dev slice carved from the training
pool (patience 4), never on test data. Bad input fails before any training:
a record without the field its stage needs, a budget larger than the pool.

Hyperparameters are the paper's (AdamW, lr 5e-5 for LoRA, weight decay 0.1,
warmup 0.1, linear decay; 10 epochs for a stage on the full set, i.e. stage 1
and stage 2 with budget ``all``, otherwise 50 up to 10k labels and 15 above)
except:

- ``head_learning_rate`` (1e-3): the paper trains the head at the LoRA rate
  (effective batch 512 on 4 GPUs, up to 50 epochs). At CPU scale (a few
  epochs of LoRA, or a frozen backbone where the head is all that trains) a
  head at 5e-5 barely leaves its initialization in the time available. Set it
  equal to ``learning_rate`` to train exactly as the paper does.
- every stage starts the head's bias at the logit of its mean training
  target, and in ``head`` mode a fresh head standardizes its input with the
  training features' mean and spread (see :mod:`candor.train.elical.model`).
  Neither changes the model (a linear head and a sigmoid on the same
  features); they make it train in a few epochs.
- so stage 2 resumes stage 1 with every weight (LoRA, the head's weights, its
  standardization) but re-centres the head's bias on the stage-2 targets
  (``recenter_bias``). Consistency rates average far above accuracies (0.23
  against 0.07 on HonestyBench-mini), and without re-centring the resumed
  head spent its early-stopping patience walking the bias down: its
  dev-slice loss stayed at 0.050 with 100 labels and 0.033 with 1000, against
  0.024 and 0.022 with it (head mode, two seeds; chosen on the dev slice,
  never on test data). ``recenter_bias=False`` resumes exactly as the paper.
- stage 2's own rules (issue 13: with up to 1,800 in-domain labels at 11%
  positives, stage 2 overwrote the stage-1 ranking, and AUROC fell with more
  labels, most out of domain): ``cal_stop`` picks stage 2's best epoch by the
  dev slice's loss (the paper) or its AUROC against greedy correctness, and
  ``cal_anchor`` adds an L2-SP penalty holding the resumed head's weights near
  stage 1's. ``cal_scope="bias-scale"`` trains only a scale and a bias on the
  resumed head's logit (Platt scaling: calibrates without reordering). Stage 1
  always stops on the dev loss, and Cal-Only has no anchor and trains every
  weight (nothing to hold it to). The defaults come from the config's
  ``target`` (:mod:`candor.train.elical.rules`): the rule chosen, with each
  in-domain dataset left out in turn (:mod:`candor.train.elical.selection`),
  for a head meant for every unseen domain (``universal``) or for the mean one
  (``in-domain``).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import PartialState

from candor.annotation.contamination import read_manifest, write_manifest
from candor.annotation.prompts import records_template
from candor.annotation.records import Record
from candor.backends.chat import TokenizerChat
from candor.backends.tokens import encode
from candor.train.common import TrainResult, load_causal_lm, training_arguments
from candor.train.elical.budgets import WHOLE_POOL, Budget
from candor.train.elical.config import EliCalConfig
from candor.train.elical.features import FeatureCache
from candor.train.elical.model import BiasScale, ConfidenceHead, HeadConfig
from candor.train.elical.rules import ALL_WEIGHTS, BIAS_SCALE
from candor.train.elical.targets import check_field, stage_target, targets
from candor.train.elical.trainer import (
    BestOnDev,
    EliCalTrainer,
    PromptCollator,
    auroc_metrics,
    collate_features,
    epoch_history,
    feature_examples,
    prompt_examples,
)
from candor.util.errors import CandorError
from candor.util.files import atomic_write_text
from candor.util.resource_meter import ResourceMeter

logger = logging.getLogger(__name__)

# Which stages each method runs, in order.
STAGES: dict[str, tuple[str, ...]] = {"eli-only": ("eli",), "cal-only": ("cal",), "elical": ("eli", "cal")}


@dataclass
class StageResult:
    """One stage's training: sizes, epochs, dev losses and cost."""

    name: str
    target: str
    n_train: int
    n_dev: int
    epochs_planned: int
    epochs_run: float
    best_epoch: float
    best_dev_loss: float
    stopped_early: bool
    stop_metric: str = "loss"
    best_dev_score: float | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    cost: dict[str, float] = field(default_factory=dict)


def stages_cost(stages: Sequence[StageResult]) -> dict[str, float]:
    """Wall time summed over stages; peak memory as the largest stage peak."""
    out = {
        "wall_s": round(sum(s.cost.get("wall_s", 0.0) for s in stages), 2),
        "peak_rss_mib": max((s.cost.get("peak_rss_mib", 0.0) for s in stages), default=0.0),
    }
    gpu = [s.cost["peak_gpu_mib"] for s in stages if "peak_gpu_mib" in s.cost]
    if gpu:
        out["peak_gpu_mib"] = max(gpu)
    return out


def train_elical(
    train_records: Sequence[Record],
    dev_records: Sequence[Record],
    *,
    method: str = "elical",
    config: EliCalConfig | None = None,
    out_dir: str | Path,
    budget: Budget = WHOLE_POOL,
    cal_records: Sequence[Record] | None = None,
    init_from: str | Path | None = None,
    model: Any = None,
    tokenizer: Any = None,
    source: str | Path | None = None,
    dev_source: str | Path | None = None,
) -> TrainResult:
    """Train ``method`` (``eli-only``, ``cal-only`` or ``elical``) and save the head to ``out_dir``.

    ``train_records`` is the training pool (stage 1 uses all of it);
    stage 2 draws ``budget`` labelled questions (a :class:`Budget`) from
    ``cal_records`` (default: the pool). ``dev_records`` is the dev slice
    for early stopping. ``init_from`` resumes a saved stage-1 head instead of
    running stage 1 again. ``model``/``tokenizer`` reuse a loaded backbone
    (``head`` mode; ``lora`` mode adds LoRA layers to the model it is given,
    so give it a fresh one). ``source`` and ``dev_source`` name the files the
    training and dev records were read from, for error messages and the
    manifest.

    Beside the head goes ``training_questions.json``
    (:mod:`candor.annotation.contamination`): fingerprints of every question the head was
    trained or early-stopped on (stage 1's pool, stage 2's budget, the dev
    slice, and the manifest of an ``init_from`` head).
    """
    config = config or EliCalConfig()
    stages = _stages(method, init_from)
    pool = list(cal_records if cal_records is not None else train_records)
    _check_inputs(stages, train_records, dev_records, pool, budget, config, source)
    if model is None or tokenizer is None:
        model, tokenizer = load_causal_lm(config.model, dtype=config.dtype, device=config.device)
    head = _initial_head(train_records, init_from, config, model, tokenizer)
    results = []
    # The dev slice picks the best epoch, so its questions count as seen in training too.
    seen = [r.item.question for r in dev_records]
    for stage in stages:
        records = train_records if stage == "eli" else budget.draw(pool, config.seed)
        seen += [r.item.question for r in records]
        fresh = not results and not init_from
        full_set = stage == "eli" or budget.is_all
        results.append(train_stage(head, records, dev_records, stage, config, fresh=fresh, full_set=full_set))
    head.config.meta = {
        "method": method,
        "budget": budget.as_json() if "cal" in stages else None,
        "cal_target": config.cal_target,
        "stages": [s.name for s in results],
    }
    path = Path(out_dir)
    result = TrainResult(
        path=path,
        method=method,
        n_train=results[-1].n_train,
        n_dev=results[-1].n_dev,
        cost=stages_cost(results),
        config=config.fingerprint(),
        stages=results,
        budget=budget.as_json() if "cal" in stages else None,
        model=head,
    )
    # Under a multi-process launch (torchrun, accelerate launch) every process holds the same head;
    # one writes it, the others wait, so the folder is written once.
    state = PartialState()
    if state.is_main_process:
        head.save_pretrained(path)
        sources = [str(s) for s in (source, dev_source, init_from) if s is not None]
        write_manifest(path, seen, sources, inherited=_resumed_questions(init_from))
        atomic_write_text(path / "training.json", _json(result.to_dict()))
    state.wait_for_everyone()
    return result


def train_stage(
    head: ConfidenceHead,
    records: Sequence[Record],
    dev: Sequence[Record],
    stage: str,
    config: EliCalConfig,
    fresh: bool = True,
    full_set: bool = False,
) -> StageResult:
    """Train ``head`` in place on one stage's targets with early stopping on ``dev``.

    ``fresh`` (a stage that does not resume another) fits the head's input
    standardization in ``head`` mode; a fresh stage, or any stage with
    ``config.recenter_bias``, starts the head's bias at the mean target.
    ``full_set`` says ``records`` is the whole pool, not a label budget (it
    picks the paper's epochs, see :meth:`EliCalConfig.epochs_for`).
    """
    kind = stage_target(stage, config.cal_target)
    y, y_dev = targets(records, kind, what="the training set"), targets(dev, kind, what="the dev slice")
    stop = config.cal_stop if stage == "cal" else "loss"
    dev_correct = targets(dev, "hard", what="the dev slice") if stop == "auroc" else None

    def inputs() -> tuple[Any, Any, Any, Any, float | None]:
        if config.mode == "head":
            x = head_features(head, head.prompts(records), config.feature_cache)
            x_dev = head_features(head, head.prompts(dev), config.feature_cache)
            return feature_stage_data(head, x, x_dev, y, y_dev, config, fresh)
        return _lora_mode_data(head, records, dev, y, y_dev, config, fresh)

    spec = StageSpec(stage=stage, target=kind, n_train=len(records), n_dev=len(dev), fresh=fresh, full_set=full_set)
    return run_stage(head, spec, config, inputs, dev_correct)


@dataclass(frozen=True)
class StageSpec:
    """What one stage is, apart from its inputs: its name, its target's name, its sizes, how it starts."""

    stage: str
    target: str
    n_train: int
    n_dev: int
    fresh: bool
    full_set: bool


def train_feature_stage(
    head: ConfidenceHead,
    x: np.ndarray,
    y: np.ndarray,
    x_dev: np.ndarray,
    y_dev: np.ndarray,
    *,
    spec: StageSpec,
    config: EliCalConfig,
    dev_correct: np.ndarray | None = None,
) -> StageResult:
    """One stage of a ``head``-mode head on feature rows already read (the claim head's features, say).

    The same training as :func:`train_stage` in ``head`` mode: ``x``/``y`` train, ``x_dev``/``y_dev`` stop it,
    ``dev_correct`` (the dev rows' 0/1 correctness) is what ``cal_stop="auroc"`` ranks against.
    """
    if config.mode != "head":
        raise CandorError(f"feature rows train a head-mode head; this config is in {config.mode!r} mode")
    stop = config.cal_stop if spec.stage == "cal" else "loss"
    if stop == "auroc" and dev_correct is None:
        raise CandorError("cal_stop='auroc' needs the dev rows' correctness (dev_correct)")

    def inputs() -> tuple[Any, Any, Any, Any, float | None]:
        return feature_stage_data(head, x, x_dev, y, y_dev, config, spec.fresh)

    return run_stage(head, spec, config, inputs, dev_correct)


def run_stage(
    head: ConfidenceHead,
    spec: StageSpec,
    config: EliCalConfig,
    inputs: Any,
    dev_correct: np.ndarray | None,
) -> StageResult:
    """The stage itself: ``inputs()`` builds (model, train set, dev set, collator, head rate); the Trainer runs
    with the stage's rules (stop metric, L2-SP anchor, scope) and early stopping on the dev set."""
    stage = spec.stage
    epochs = config.epochs_for(spec.n_train, spec.full_set)
    # Stage 2's own rules: what picks its best epoch, and L2-SP toward the weights it resumes (not from scratch).
    stop = config.cal_stop if stage == "cal" else "loss"
    anchor = config.cal_anchor if stage == "cal" and not spec.fresh else 0.0
    metrics = auroc_metrics(dev_correct) if stop == "auroc" and dev_correct is not None else None
    logger.info(
        "EliCal %s (%s mode): %d train, %d dev, up to %d epochs", stage, config.mode, spec.n_train, spec.n_dev, epochs
    )
    _reset_gpu_peak()
    with ResourceMeter() as meter:
        inputs_start = time.perf_counter()
        model, train_set, dev_set, collate, head_lr = inputs()
        inputs_s = time.perf_counter() - inputs_start
        scope = _Scope(head, config.cal_scope if stage == "cal" and not spec.fresh else ALL_WEIGHTS)
        model = scope.model if config.mode == "head" else model
        with scope, tempfile.TemporaryDirectory(prefix="candor-elical-") as scratch:
            args = _arguments(scratch, config, epochs, head_lr, loss_only=metrics is None)
            stopper = BestOnDev(patience=config.patience, metric=stop)
            trainer = EliCalTrainer(
                model=model,
                args=args,
                train_dataset=train_set,
                eval_dataset=dev_set,
                data_collator=collate,
                callbacks=[stopper],
                head_parameters=head.head.parameters() if config.mode == "lora" else (),
                head_learning_rate=config.head_learning_rate if config.mode == "lora" else None,
                anchor=anchor,
                compute_metrics=metrics,
            )
            trainer.train()
    history = epoch_history(trainer.state.log_history)
    # wall_s covers the whole stage; inputs_s the part spent on features (head mode) or tokens.
    cost = {**meter.cost.as_dict(), "inputs_s": round(inputs_s, 2), **_gpu_peak()}
    return StageResult(
        name=stage,
        target=spec.target,
        n_train=spec.n_train,
        n_dev=spec.n_dev,
        epochs_planned=epochs,
        epochs_run=float(trainer.state.epoch or 0),
        best_epoch=stopper.best_epoch,
        best_dev_loss=stopper.best_loss,
        stopped_early=stopper.stopped_early,
        stop_metric=stop,
        best_dev_score=stopper.best_score,
        history=history,
        cost=cost,
    )


class _Scope:
    """What a stage trains (``cal_scope``): every trainable weight, or only a scale and bias on the head's logit.

    For ``bias-scale`` the head is wrapped in :class:`BiasScale` and the LoRA weights are frozen for the
    stage; on exit the scale and bias are folded back into the head and the LoRA weights thaw.
    """

    def __init__(self, head: ConfidenceHead, scope: str) -> None:
        self.head = head
        self.wrapper = BiasScale(head.head) if scope == BIAS_SCALE else None
        self.model = self.wrapper if self.wrapper is not None else head.head
        self.frozen: list[torch.nn.Parameter] = []

    def __enter__(self) -> _Scope:
        if self.wrapper is not None:
            self.head.head = self.wrapper
            self.frozen = [p for p in self.head.backbone.parameters() if p.requires_grad]
            for p in self.frozen:
                p.requires_grad_(False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.wrapper is not None:
            self.head.head = self.wrapper.fold_into_head()
            for p in self.frozen:
                p.requires_grad_(True)


def head_features(head: ConfidenceHead, prompts: Sequence[str], cache_root: str | Path | None) -> np.ndarray:
    """Frozen-backbone features of ``prompts``, through the on-disk cache when one is configured."""
    if cache_root is None:
        return head.prompt_features(prompts)
    dtype = str(next(head.backbone.parameters()).dtype).removeprefix("torch.")
    cache = FeatureCache(cache_root, head.config.backbone, head.config.layer, head.config.template, dtype)
    return cache.get(prompts, head.prompt_features)


# ---------------------------------------------------------------- helpers


def _stages(method: str, init_from: str | Path | None) -> tuple[str, ...]:
    if method not in STAGES:
        raise CandorError(f"unknown EliCal method {method!r}; known: {', '.join(STAGES)}")
    stages = STAGES[method]
    if init_from is not None:
        if method != "elical":
            raise CandorError(f"init_from resumes a stage-1 head for 'elical'; it makes no sense for {method!r}")
        return ("cal",)
    return stages


def _check_inputs(
    stages: Sequence[str],
    train: Sequence[Record],
    dev: Sequence[Record],
    pool: Sequence[Record],
    budget: Budget,
    config: EliCalConfig,
    source: str | Path | None,
) -> None:
    """Fail before any training on a missing field, an empty set or a budget over the pool."""
    if not dev:
        raise CandorError("EliCal needs a dev slice for early stopping (carve one with candor.train.elical.carve_dev)")
    for stage in stages:
        kind = stage_target(stage, config.cal_target)
        records = train if stage == "eli" else pool
        if not records:
            raise CandorError(f"no training records for EliCal stage {stage!r}")
        check_field(records, kind, source, "the training set")
        check_field(dev, kind, None, "the dev slice")
    if "cal" in stages:
        budget.size(len(pool))


def _resumed_questions(init_from: str | Path | None) -> set[str]:
    """The training fingerprints of the head that stage 2 resumes (none when it starts fresh)."""
    if init_from is None:
        return set()
    prints = read_manifest(init_from)
    if prints is None:
        logger.warning("%s has no training-questions manifest; the new manifest lists only this run's", init_from)
    return prints or set()


def _initial_head(
    train: Sequence[Record], init_from: str | Path | None, config: EliCalConfig, model: Any, tokenizer: Any
) -> ConfidenceHead:
    if init_from is not None:
        head = ConfidenceHead.from_pretrained(init_from, model=model, tokenizer=tokenizer, trainable=True)
        if head.config.mode != config.mode:
            raise CandorError(f"{init_from}: a {head.config.mode!r}-mode head cannot resume in {config.mode!r} mode")
        return head
    template = records_template(train, config.template, TokenizerChat(tokenizer, config.model))
    spec = HeadConfig(
        backbone=config.model, template=template, layer=config.layer, mode=config.mode, lora=config.lora_settings()
    )
    return ConfidenceHead.create(model, tokenizer, spec, seed=config.seed)


def feature_stage_data(
    head: ConfidenceHead,
    x: np.ndarray,
    x_dev: np.ndarray,
    y: np.ndarray,
    y_dev: np.ndarray,
    config: EliCalConfig,
    fresh: bool,
) -> tuple[Any, Any, Any, Any, float]:
    """A head-mode stage's inputs from feature rows: a fresh head standardizes on ``x``; its bias starts at
    the mean target when fresh or ``config.recenter_bias``."""
    if fresh:
        head.head.standardize_on(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(head.device))
    if fresh or config.recenter_bias:
        head.head.start_at(float(y.mean()))
    return (
        head.head,
        feature_examples(x, y),
        feature_examples(x_dev, y_dev),
        collate_features,
        config.head_learning_rate,
    )


def _lora_mode_data(
    head: ConfidenceHead,
    records: Sequence[Record],
    dev: Sequence[Record],
    y: np.ndarray,
    y_dev: np.ndarray,
    config: EliCalConfig,
    fresh: bool,
) -> tuple[Any, Any, Any, Any, None]:
    if fresh or config.recenter_bias:
        head.head.start_at(float(y.mean()))
    ids = encode(head.tokenizer, head.prompts(records))
    ids_dev = encode(head.tokenizer, head.prompts(dev))
    collate = PromptCollator(int(head.tokenizer.pad_token_id))
    return head, prompt_examples(ids, y), prompt_examples(ids_dev, y_dev), collate, None


def _arguments(scratch: str, config: EliCalConfig, epochs: int, head_lr: float | None, loss_only: bool = True) -> Any:
    """The paper's optimizer settings, dev loss (and predictions when ``not loss_only``) each epoch, no checkpoints."""
    return training_arguments(
        scratch,
        learning_rate=head_lr if head_lr is not None else config.learning_rate,
        epochs=epochs,
        batch_size=config.train_batch_size,
        gradient_accumulation=config.gradient_accumulation,
        warmup_ratio=config.warmup_ratio,
        weight_decay=config.weight_decay,
        seed=config.seed,
        eval_strategy="epoch",
        per_device_eval_batch_size=config.eval_batch_size,
        label_names=["labels"],
        prediction_loss_only=loss_only,
    )


def _reset_gpu_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _gpu_peak() -> dict[str, float]:
    """Peak GPU memory of the stage (what must fit a 24 GiB card), when a GPU ran it."""
    if not torch.cuda.is_available():
        return {}
    return {"peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)}


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str) + "\n"
