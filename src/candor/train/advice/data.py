"""Training data for ADVICE and ConfTuner: tokenized examples, one-format-per-batch sampling, collation.

Each triplet (or record) appears once per training format (ScoreLetter and
ScoreNumber by default), tokenized as the exact §4.3 prompt that evaluation
scores (:func:`candor.verbal.scorer.build_prompt`). A mini-batch holds
one format only (:class:`FormatBatchSampler`), so its rows share the system
prompt and are read with one :class:`~candor.verbal.scorer.LabelScorer`.

Examples are plain dicts of lists (so ``accelerate`` can shard them);
:class:`ExampleCollator` turns a batch of either kind into padded tensors:

- pairs (ADVICE): ``input_ids`` / ``attention_mask`` with the a_correct rows
  first and the a_wrong rows after them, ``targets`` marking a_correct's
  answer tokens (for L_LM), ``format``;
- scored answers (ConfTuner): ``input_ids``, ``attention_mask``,
  ``targets`` (the answer's tokens), ``correct`` (0/1) and ``format``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

from candor.annotation.records import Record
from candor.backends.tokens import pad_batch
from candor.estimators.answers import record_answer
from candor.train.advice.triplets import Triplet
from candor.util.errors import CandorError
from candor.util.seeds import item_rng
from candor.verbal.formats import get_format
from candor.verbal.scorer import build_prompt, span_mask


def pair_examples(
    tokenizer: Any, triplets: Sequence[Triplet], formats: Sequence[str], variant: str = "default"
) -> list[dict[str, Any]]:
    """One example per (triplet, format): the a_correct and a_wrong prompts as token ids."""
    out = []
    for f, name in enumerate(formats):
        fmt = get_format(name)
        for t in triplets:
            good = build_prompt(tokenizer, t.item, t.a_correct, fmt, variant)
            bad = build_prompt(tokenizer, t.item, t.a_wrong, fmt, variant)
            out.append(
                {
                    "format": f,
                    "correct_ids": list(good.ids),
                    "correct_span": list(good.answer_span),
                    "wrong_ids": list(bad.ids),
                    "id": t.item.id,
                }
            )
    return out


def scored_examples(
    tokenizer: Any, records: Sequence[Record], formats: Sequence[str], variant: str = "default"
) -> list[dict[str, Any]]:
    """One example per (record, format): the greedy answer's prompt and its correctness (ConfTuner)."""
    out = []
    for f, name in enumerate(formats):
        fmt = get_format(name)
        for rec in records:
            if rec.greedy_correct is None:
                raise CandorError(f"record {rec.id!r} has no greedy correctness; ConfTuner needs labelled records")
            answer = record_answer(rec)
            if not answer.strip():
                continue  # an empty answer has nothing to be confident about
            prompt = build_prompt(tokenizer, rec.item, answer, fmt, variant)
            out.append(
                {
                    "format": f,
                    "ids": list(prompt.ids),
                    "span": list(prompt.answer_span),
                    "correct": int(rec.greedy_correct),
                    "id": rec.id,
                }
            )
    return out


class ExampleDataset(Dataset):
    """A list of examples as a torch ``Dataset``."""

    def __init__(self, examples: Sequence[dict[str, Any]]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.examples[index]

    @property
    def formats(self) -> list[int]:
        return [int(e["format"]) for e in self.examples]

    @property
    def lengths(self) -> list[int]:
        """Tokens per example (the longer prompt of a pair)."""
        keys = ("ids", "correct_ids", "wrong_ids")
        return [max(len(e[k]) for k in keys if k in e) for e in self.examples]


class FormatBatchSampler(Sampler[list[int]]):
    """Batches of indices that share one format, shuffled anew each epoch (seeded).

    Within each format the indices are shuffled and cut into batches of
    ``batch_size`` (the last one may be smaller unless ``drop_last``); then
    the batches of all formats are shuffled together. With ``lengths``, each
    run of ``group`` batches is first sorted by length, so a batch holds
    examples of similar length and pads less (what ``group_by_length`` does
    in transformers). ``set_epoch`` (called by the Trainer) changes the
    shuffle; iterating again without it moves to the next epoch as well.
    """

    def __init__(
        self,
        formats: Sequence[int],
        batch_size: int,
        seed: int = 0,
        drop_last: bool = False,
        lengths: Sequence[int] | None = None,
        group: int = 4,
    ) -> None:
        if batch_size < 1:
            raise CandorError(f"batch size must be at least 1, got {batch_size}")
        if lengths is not None and len(lengths) != len(formats):
            raise CandorError(f"{len(lengths)} lengths for {len(formats)} examples")
        self.formats = list(formats)
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last
        self.lengths = list(lengths) if lengths is not None else None
        self.group = max(1, group)
        self.epoch = 0
        self._epoch_set = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._epoch_set = True

    def _groups(self) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for i, f in enumerate(self.formats):
            groups.setdefault(f, []).append(i)
        return groups

    def __iter__(self) -> Iterator[list[int]]:
        rng = item_rng(self.seed, self.epoch)
        if not self._epoch_set:
            self.epoch += 1
        self._epoch_set = False
        batches = []
        for _, indices in sorted(self._groups().items()):
            rng.shuffle(indices)
            if self.lengths is not None:
                lengths = self.lengths
                span = self.batch_size * self.group
                indices = [
                    i
                    for k in range(0, len(indices), span)
                    for i in sorted(indices[k : k + span], key=lambda i: -lengths[i])
                ]
            for k in range(0, len(indices), self.batch_size):
                chunk = indices[k : k + self.batch_size]
                if len(chunk) == self.batch_size or not self.drop_last:
                    batches.append(chunk)
        rng.shuffle(batches)
        return iter(batches)

    def __len__(self) -> int:
        sizes = [len(v) for v in self._groups().values()]
        if self.drop_last:
            return sum(n // self.batch_size for n in sizes)
        return sum(-(-n // self.batch_size) for n in sizes)


def _one_format(batch: Sequence[dict[str, Any]]) -> int:
    formats = {int(e["format"]) for e in batch}
    if len(formats) != 1:
        raise CandorError(f"a mini-batch mixes formats {sorted(formats)}; use FormatBatchSampler")
    return formats.pop()


class ExampleCollator:
    """Pads a one-format batch of pair examples (ADVICE) or of scored-answer examples (ConfTuner).

    Pairs give a_correct rows, then a_wrong rows, with ``targets`` on a_correct's answer tokens only;
    scored answers give one row each, ``targets`` on its answer and ``correct`` (see the module docstring).
    """

    def __init__(self, pad_id: int, side: str = "left") -> None:
        self.pad_id = pad_id
        self.side = side

    def __call__(self, batch: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        fmt = _one_format(batch)
        pairs = _is_pairs(batch)
        if pairs:
            seqs = [e["correct_ids"] for e in batch] + [e["wrong_ids"] for e in batch]
            spans = [tuple(e["correct_span"]) for e in batch] + [(0, 0)] * len(batch)
        else:
            seqs = [e["ids"] for e in batch]
            spans = [tuple(e["span"]) for e in batch]
        ids, mask = pad_batch(seqs, self.pad_id, self.side)
        out = {
            "input_ids": ids,
            "attention_mask": mask,
            "targets": span_mask(spans, [len(s) for s in seqs], ids.shape[1], self.side),
        }
        if not pairs:
            out["correct"] = torch.tensor([int(e["correct"]) for e in batch], dtype=torch.float32)
        out["format"] = torch.full((len(batch),), fmt, dtype=torch.long)
        return out


def _is_pairs(batch: Sequence[dict[str, Any]]) -> bool:
    kinds = {"correct_ids" in e for e in batch}
    if len(kinds) != 1:
        raise CandorError("a mini-batch mixes pair examples and scored-answer examples")
    return kinds.pop()
