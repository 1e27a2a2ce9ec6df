"""The ADVICE and ConfTuner trainers: ``transformers.Trainer`` subclasses.

See docs/methods.md "ADVICE and ConfTuner"; docs/architecture.md "Scale".

Each overrides ``compute_loss`` with its method's loss and nothing else, so
``accelerate launch`` runs them on many GPUs (DDP, FSDP, DeepSpeed) unchanged.
The shared base adds what the losses need around it:

- the data loaders use :class:`~candor.train.advice.data.FormatBatchSampler`, so a
  mini-batch holds one format (``accelerate`` hands whole batches to each
  process), and by default examples of similar length (less padding);
- one :class:`~candor.verbal.scorer.LabelScorer` per format reads
  P(C | q, a) from the same forward that gives the answer tokens' log-probs;
- ``prediction_step`` returns the loss, so ``evaluate`` reports ``eval_loss``
  on a dev split;
- the mean of every active loss term since the last log is added to the
  logs (``loss_jsd``, ``loss_margin``, ...), so the history shows what moved.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import PrinterCallback

from candor.train.advice.data import ExampleDataset, FormatBatchSampler
from candor.train.advice.losses import LossWeights, brier, jsd_hinge, margin_hinge, sum_penalty
from candor.util.errors import CandorError
from candor.verbal.scorer import LabelScorer

logger = logging.getLogger(__name__)


class _LogToLogging(TrainerCallback):
    """Training logs go to ``logging`` (INFO), not to stdout as transformers' printer does."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs and state.is_world_process_zero:
            shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in logs.items()}
            logger.info("step %d: %s", state.global_step, shown)


class _ConfidenceTrainer(Trainer):
    """What ADVICE and ConfTuner share; subclasses define :meth:`loss_terms`."""

    def __init__(
        self,
        *args: Any,
        scorers: Sequence[LabelScorer],
        weights: LossWeights,
        share_prefix: bool = True,
        group_by_length: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.remove_callback(PrinterCallback)
        self.add_callback(_LogToLogging())
        self.scorers = list(scorers)
        self.weights = weights
        self.share_prefix = share_prefix
        self.group_by_length = group_by_length
        self._term_sums: dict[str, float] = {}
        self._term_count = 0

    # ------------------------------------------------------------ loss

    def compute_loss(
        self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        scorer = self.scorers[_batch_format(inputs)]
        terms = self.loss_terms(model, inputs, scorer)
        loss = sum(getattr(self.weights, name) * value for name, value in terms.items())
        if model.training:
            self._remember(terms)
        return (loss, {}) if return_outputs else loss

    def loss_terms(self, model: Any, inputs: dict[str, torch.Tensor], scorer: LabelScorer) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def prediction_step(
        self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool, ignore_keys: list[str] | None = None
    ) -> tuple[torch.Tensor | None, None, None]:
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    # ------------------------------------------------------------ data

    def _format_loader(self, dataset: ExampleDataset, batch_size: int) -> DataLoader:
        lengths = dataset.lengths if self.group_by_length else None
        sampler = FormatBatchSampler(dataset.formats, batch_size, seed=self.args.seed, lengths=lengths)
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise CandorError("training needs a train_dataset")
        return self._format_loader(self.train_dataset, self._train_batch_size)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise CandorError("evaluation needs an eval_dataset")
        return self._format_loader(dataset, self.args.eval_batch_size)

    # ------------------------------------------------------------ logs

    def _remember(self, terms: dict[str, torch.Tensor]) -> None:
        for name, value in terms.items():
            self._term_sums[name] = self._term_sums.get(name, 0.0) + float(value.detach())
        self._term_count += 1

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs and self._term_count:
            for name, total in self._term_sums.items():
                logs[f"loss_{name}"] = round(total / self._term_count, 6)
            self._term_sums, self._term_count = {}, 0
        super().log(logs, *args, **kwargs)


def _batch_format(inputs: dict[str, torch.Tensor]) -> int:
    formats = inputs["format"]
    first = int(formats[0])
    if bool((formats != first).any()):
        raise CandorError("a mini-batch mixes formats; ADVICE and ConfTuner read one format per batch")
    return first


class AdviceTrainer(_ConfidenceTrainer):
    """ADVICE: L_LM + L_JSD + L_Margin + L_Sum over the (a_correct, a_wrong) pair (+ Brier for ADVICE+ConfTuner).

    A batch holds B pairs as 2B rows, a_correct first (see
    :class:`~candor.train.advice.data.ExampleCollator`); both run in one forward.
    """

    def loss_terms(self, model: Any, inputs: dict[str, torch.Tensor], scorer: LabelScorer) -> dict[str, torch.Tensor]:
        w = self.weights
        pairs = inputs["format"].shape[0]
        targets = inputs["targets"] if w.lm > 0 else None
        out = scorer.forward(
            model, inputs["input_ids"], inputs["attention_mask"], targets=targets, share_prefix=self.share_prefix
        )
        lp_c, lp_w = out.log_probs[:pairs], out.log_probs[pairs:]
        mu = scorer.expected_value(out.log_probs)
        mu_c, mu_w = mu[:pairs], mu[pairs:]
        terms: dict[str, torch.Tensor] = {}
        if targets is not None and out.token_logprobs is not None:
            terms["lm"] = -out.token_logprobs.sum() / targets.sum().clamp(min=1)
        if w.jsd > 0:
            terms["jsd"] = jsd_hinge(lp_c, lp_w, w.jsd_target).mean()
        if w.margin > 0:
            terms["margin"] = margin_hinge(mu_c, mu_w, w.margin_delta).mean()
        if w.sum > 0:
            terms["sum"] = sum_penalty(mu_c, mu_w).mean()
        if w.brier > 0:
            # ConfTuner's loss on both answers of the pair: a_correct is correct (1), a_wrong wrong (0).
            y = torch.cat([torch.ones(pairs), torch.zeros(pairs)]).to(out.log_probs.device)
            terms["brier"] = brier(out.log_probs, scorer.values, y).mean()
        return terms


class ConfTunerTrainer(_ConfidenceTrainer):
    """ConfTuner: the tokenized Brier score of (question, answer, correctness) examples, optionally + L_LM.

    The LM term, when on, is the NLL of the answer tokens of the examples whose
    answer is correct (teaching a wrong answer would hurt accuracy).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.weights.pairwise:
            raise CandorError("ConfTuner trains on single answers: the pairwise terms (jsd, margin, sum) must be 0")

    def loss_terms(self, model: Any, inputs: dict[str, torch.Tensor], scorer: LabelScorer) -> dict[str, torch.Tensor]:
        w = self.weights
        correct = inputs["correct"]
        targets = inputs["targets"] & (correct > 0.5).unsqueeze(1) if w.lm > 0 else None
        out = scorer.forward(
            model, inputs["input_ids"], inputs["attention_mask"], targets=targets, share_prefix=self.share_prefix
        )
        terms: dict[str, torch.Tensor] = {}
        if w.brier > 0:
            terms["brier"] = brier(out.log_probs, scorer.values, correct).mean()
        if targets is not None and out.token_logprobs is not None:
            terms["lm"] = -out.token_logprobs.sum() / targets.sum().clamp(min=1)
        return terms
