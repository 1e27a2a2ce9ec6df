"""The ADVICE / ConfTuner training pipeline: records → triplets or scored answers → the Trainer → a saved adapter.

(``trainer.py`` beside it holds the ``Trainer`` subclasses and their ``compute_loss``;
``config.py`` the method presets; this module runs them end to end.)

    from candor.train.advice import method_config, train
    config = method_config("advice", epochs=2)
    result = train(config, records, "runs/advice")   # records: annotated training records
    backend = HFBackend.from_pretrained(config.model, adapter=str(result.path))

The presets (:mod:`candor.train.advice.config`: :class:`AdviceConfig`,
:class:`ConfTunerConfig`) are the papers' settings (docs/methods.md "ADVICE and ConfTuner"):

============== =========================== ===================== ==========================
method         losses                      LoRA                  optimizer
============== =========================== ===================== ==========================
advice         LM + JSD + Margin + Sum     r=16 α=32 q,k,v,o     lr 1e-5, 4 epochs, 16 × 2
conftuner      tokenized Brier             r=8 α=32 q,v          lr 1e-5, 3 epochs, 16 × 2
advice+conf…   ADVICE + Brier              as ADVICE             as ADVICE
============== =========================== ===================== ==========================

All use AdamW with 5% linear warmup and linear decay. ``batch_size`` counts
pairs (ADVICE) or answers (ConfTuner) per device; the effective batch is
``batch_size × gradient_accumulation × processes``. On a CPU, a smaller
``batch_size`` with a larger ``gradient_accumulation`` gives the same
effective batch in less memory.

ADVICE trains on triplets (built from the records with
:func:`candor.train.advice.triplets.build_triplets` unless given; written to
``<out>/triplets.jsonl``). ConfTuner trains on the records themselves: each
greedy answer with its correctness, the (question, answer, correctness)
examples of the ConfTuner paper. ADVICE+ConfTuner adds the Brier term to
ADVICE's batches, on both answers of each pair (correctness 1 and 0).

The output directory holds the PEFT adapter (``adapter_config.json``,
``adapter_model.safetensors``), which ``HFBackend.from_pretrained(...,
adapter=dir)`` merges, ``training.json`` (config, cost, history, triplet
counts) and the ``training.done`` marker written last.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from candor.annotation.contamination import write_manifest
from candor.annotation.records import Record
from candor.data.items import QAItem
from candor.data.splits import seeded_shuffle
from candor.train.advice.config import AdviceConfig
from candor.train.advice.triplets import Triplet, TripletStats, build_triplets, write_triplets
from candor.train.common import TrainResult
from candor.util.errors import CandorError
from candor.util.resource_meter import ResourceMeter

logger = logging.getLogger(__name__)

DONE_MARKER = "training.done"


def is_trained(out_dir: str | Path) -> bool:
    """Whether ``out_dir`` holds a finished run (its done-marker exists)."""
    return (Path(out_dir) / DONE_MARKER).exists()


def load_result(out_dir: str | Path) -> dict[str, Any]:
    """The ``training.json`` of a finished run."""
    path = Path(out_dir) / "training.json"
    if not path.exists():
        raise CandorError(f"{path}: no training record (was the run finished?)")
    return json.loads(path.read_text())


def _capped(items: Sequence[Any], cap: int | None, seed: int) -> list[Any]:
    return list(items) if cap is None or cap >= len(items) else seeded_shuffle(items, f"cap:{seed}")[:cap]


def train(
    config: AdviceConfig,
    records: Sequence[Record] | None,
    out_dir: str | Path,
    *,
    triplets: Sequence[Triplet] | None = None,
    dev_records: Sequence[Record] | None = None,
    dev_triplets: Sequence[Triplet] | None = None,
    source: str | Path | None = None,
) -> TrainResult:
    """Train ``config`` and save the LoRA adapter to ``out_dir``; see the module docstring.

    Pair methods take ``triplets`` or build them from ``records`` (drawing
    extra samples with the base model); answer methods take ``records``. A
    dev split (``dev_records`` / ``dev_triplets``) is evaluated each epoch
    (``eval_loss`` in the history); nothing is selected on it here, so its
    questions are not in the adapter's ``training_questions.json`` manifest,
    which lists the questions of the examples trained on. ``source`` names
    the records file there.
    """
    from transformers import set_seed

    from candor.train.common import load_causal_lm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / DONE_MARKER).unlink(missing_ok=True)
    set_seed(config.seed)
    model, tokenizer = load_causal_lm(config.model, dtype=config.dtype)
    stats = None
    if config.data == "pairs":
        if triplets is None:
            if records is None:
                raise CandorError(f"{config.method}: needs training records or triplets")
            triplets, stats = _build(config, model, tokenizer, records, out)
        used = _capped(triplets, config.max_examples, config.seed)
        train_set = _pairs(config, tokenizer, used)
        items = [t.item for t in used]
        dev_pairs = dev_triplets if dev_triplets is not None else _dev_triplets(config, dev_records)
        dev_set = _pairs(config, tokenizer, dev_pairs) if dev_pairs else None
    else:
        if records is None:
            raise CandorError(f"{config.method}: needs annotated training records")
        used_records = _capped(records, config.max_examples, config.seed)
        train_set = _answers(config, tokenizer, used_records)
        items = [r.item for r in used_records]
        dev_set = _answers(config, tokenizer, dev_records) if dev_records else None
    if len(train_set) == 0:
        raise CandorError(f"{config.method}: no training examples (no record with a correct greedy answer?)")

    trainer = build_trainer(config, model, tokenizer, train_set, dev_set, out)
    logger.info(
        "%s: %d examples (%d formats), %s", config.method, len(train_set), len(config.formats), config.weights.active()
    )
    with ResourceMeter() as meter:
        trainer.train()
    trainer.save_model(str(out))
    result = TrainResult(
        path=out,
        method=config.method,
        n_train=len(train_set),
        n_dev=len(dev_set) if dev_set is not None else 0,
        cost=meter.cost.as_dict(),
        history=list(trainer.state.log_history),
        config=config.as_dict(),
        triplet_stats=stats,
    )
    if trainer.is_world_process_zero():
        (out / "training.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        write_manifest(out, _questions_of(train_set, items), [str(source)] if source is not None else [])
        (out / DONE_MARKER).write_text("done\n")
    return result


def _questions_of(dataset: Any, items: Sequence[QAItem]) -> list[str]:
    """The questions of the items that gave ``dataset`` at least one example (empty answers give none)."""
    used = {example["id"] for example in dataset.examples}
    return [item.question for item in items if item.id in used]


def _build(
    config: AdviceConfig, model: Any, tokenizer: Any, records: Sequence[Record], out: Path
) -> tuple[list[Triplet], TripletStats]:
    from candor.backends.hf import HFBackend

    backend = HFBackend(model, tokenizer, model_name=config.model, seed=config.seed)
    built = build_triplets(
        records,
        backend=backend,
        judge=config.judge,
        extra_samples=config.extra_samples,
        extra_rounds=config.extra_rounds,
        seed=config.seed,
    )
    if _is_main_process():  # every process builds the same (seeded) triplets; one writes them
        write_triplets(out / "triplets.jsonl", built.triplets)
    return built.triplets, built.stats


def _is_main_process() -> bool:
    # Before the Trainer exists, torch.distributed is not set up yet; launchers set RANK.
    return os.environ.get("RANK", "0") == "0"


def _dev_triplets(config: AdviceConfig, dev_records: Sequence[Record] | None) -> list[Triplet]:
    """Dev triplets from annotated samples only (no extra sampling for a dev split)."""
    if not dev_records:
        return []
    return build_triplets(dev_records, judge=config.judge, extra_samples=0).triplets


def _pairs(config: AdviceConfig, tokenizer: Any, triplets: Sequence[Triplet]) -> Any:
    from candor.train.advice.data import ExampleDataset, pair_examples

    return ExampleDataset(pair_examples(tokenizer, triplets, config.formats, config.variant))


def _answers(config: AdviceConfig, tokenizer: Any, records: Sequence[Record]) -> Any:
    from candor.train.advice.data import ExampleDataset, scored_examples

    return ExampleDataset(scored_examples(tokenizer, records, config.formats, config.variant))


def build_trainer(config: AdviceConfig, model: Any, tokenizer: Any, train_set: Any, dev_set: Any, out: Path) -> Any:
    """The method's Trainer around a fresh LoRA on ``model`` (exposed for tests and custom loops)."""
    from peft import get_peft_model

    from candor.train.advice.data import ExampleCollator
    from candor.train.advice.trainer import AdviceTrainer, ConfTunerTrainer
    from candor.train.common import lora_config, training_arguments
    from candor.verbal.scorer import LabelScorer

    peft_model = get_peft_model(
        model, lora_config(config.lora_r, config.lora_alpha, config.lora_targets, config.lora_dropout)
    )
    logging_overrides: dict[str, Any] = {}
    if config.logging_steps > 0:
        logging_overrides = {"logging_strategy": "steps", "logging_steps": config.logging_steps}
    if dev_set is not None:
        logging_overrides["eval_strategy"] = "epoch"
    args = training_arguments(
        out / "checkpoints",
        learning_rate=config.learning_rate,
        epochs=config.epochs,
        batch_size=config.batch_size,
        gradient_accumulation=config.gradient_accumulation,
        warmup_ratio=config.warmup_ratio,
        weight_decay=config.weight_decay,
        seed=config.seed,
        **logging_overrides,
    )
    pad = int(tokenizer.pad_token_id)
    pairs = config.data == "pairs"
    collator = ExampleCollator(pad, config.padding_side)
    trainer_cls = AdviceTrainer if pairs else ConfTunerTrainer
    return trainer_cls(
        model=peft_model,
        args=args,
        train_dataset=train_set,
        eval_dataset=dev_set,
        data_collator=collator,
        scorers=[LabelScorer(tokenizer, f) for f in config.formats],
        weights=config.weights,
        share_prefix=config.share_prefix,
        group_by_length=config.group_by_length,
    )
