"""Answer masking: does confidence move when the answer is hidden? (docs/methods.md "ADVICE and ConfTuner")

The answer's tokens in the scoring prompt are replaced by as many pad tokens
(the sequence keeps its length and every other token its position), and
P(C | q, masked a) is read at the confidence position next to the real
P(C | q, a). The pad tokens stay attended to: they stand in for the answer,
they are not padding. A model that ignores its answer keeps its confidence:
``mask_shift``, the mean |μ(real) − μ(masked)|, is near 0.

P(C) comes from :class:`candor.verbal.scorer.LabelScorer`, which reads
the format's labels from token ids (SmolLM2 writes " 9" as "Ġ" + "9", so both
surface forms are scored), the same distribution as inference-time scoring.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from candor.backends.tokens import pad_batch
from candor.data.items import QAItem
from candor.diagnose.regions import PromptRegions, prompt_regions
from candor.diagnose.sensitivity import JSD_THRESHOLD, jensen_shannon
from candor.util.errors import CandorError
from candor.verbal.formats import get_format
from candor.verbal.scorer import LabelScorer

logger = logging.getLogger(__name__)


def mask_answer(regions: PromptRegions, pad_id: int) -> list[int]:
    """The prompt's token ids with every answer token replaced by ``pad_id`` (same length)."""
    start, end = regions.answer_span
    if start == end:
        raise CandorError(f"no answer tokens to mask in prompt ending {regions.prompt[-60:]!r}")
    ids = list(regions.ids)
    ids[start:end] = [pad_id] * (end - start)
    return ids


@dataclass
class MaskingExample:
    """P(C) with the real answer and with the answer masked, for one (question, answer)."""

    item_id: str
    answer: str
    n_answer_tokens: int
    real: np.ndarray
    masked: np.ndarray
    mu_real: float
    mu_masked: float

    @property
    def jsd(self) -> float:
        return float(jensen_shannon(self.real, self.masked))

    def to_dict(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "answer": self.answer,
            "n_answer_tokens": self.n_answer_tokens,
            "real": np.round(self.real, 6).tolist(),
            "masked": np.round(self.masked, 6).tolist(),
            "mu_real": self.mu_real,
            "mu_masked": self.mu_masked,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MaskingExample:
        return cls(
            item_id=d["item_id"],
            answer=d["answer"],
            n_answer_tokens=int(d["n_answer_tokens"]),
            real=np.asarray(d["real"], dtype=float),
            masked=np.asarray(d["masked"], dtype=float),
            mu_real=float(d["mu_real"]),
            mu_masked=float(d["mu_masked"]),
        )


@dataclass
class MaskingResult:
    fmt: str
    examples: list[MaskingExample]

    def mean_distributions(self) -> tuple[np.ndarray, np.ndarray]:
        """P(C) averaged over the examples: (real, masked)."""
        return (np.mean([e.real for e in self.examples], axis=0), np.mean([e.masked for e in self.examples], axis=0))

    def summary(self) -> dict[str, Any]:
        if not self.examples:
            return {"n": 0}
        real = np.array([e.mu_real for e in self.examples])
        masked = np.array([e.mu_masked for e in self.examples])
        jsd = np.array([e.jsd for e in self.examples])
        return {
            "n": len(self.examples),
            "mask_shift": float(np.mean(np.abs(real - masked))),
            "mean_signed_shift": float(np.mean(masked - real)),
            "mean_mu_real": float(real.mean()),
            "mean_mu_masked": float(masked.mean()),
            "mean_jsd_real_masked": float(jsd.mean()),
            "share_jsd_le_0.1": float(np.mean(jsd <= JSD_THRESHOLD)),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"fmt": self.fmt, "examples": [e.to_dict() for e in self.examples]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MaskingResult:
        return cls(d["fmt"], [MaskingExample.from_dict(e) for e in d["examples"]])


def masking_counterfactual(
    backend: Any,
    items: Sequence[QAItem],
    answers: Sequence[str],
    fmt: str = "number",
    variant: str = "default",
    batch_size: int = 8,
) -> MaskingResult:
    """P(C | q, a) and P(C | q, pads in place of a) for each (item, answer)."""
    if len(items) != len(answers):
        raise CandorError(f"masking: {len(items)} items but {len(answers)} answers")
    verbal = get_format(fmt)
    scorer = LabelScorer(backend.tokenizer, verbal)
    pad_id = backend.tokenizer.pad_token_id
    pairs = list(zip(items, answers, strict=True))
    out: list[MaskingExample] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        regions = [prompt_regions(backend.tokenizer, item, answer, verbal.key, variant) for item, answer in chunk]
        real = _distributions(scorer, backend, [list(r.ids) for r in regions])
        masked = _distributions(scorer, backend, [mask_answer(r, pad_id) for r in regions])
        for (item, answer), r, p_real, p_masked in zip(chunk, regions, real, masked, strict=True):
            start_tok, end_tok = r.answer_span
            out.append(
                MaskingExample(
                    item_id=item.id,
                    answer=answer.strip(),
                    n_answer_tokens=end_tok - start_tok,
                    real=p_real,
                    masked=p_masked,
                    mu_real=float(p_real @ verbal.value_array),
                    mu_masked=float(p_masked @ verbal.value_array),
                )
            )
    logger.info("answer masking: %d examples", len(out))
    return MaskingResult(verbal.key, out)


def _distributions(scorer: Any, backend: Any, seqs: list[list[int]]) -> np.ndarray:
    """P(C) at the end of each token sequence (left-padded into one batch)."""
    import torch

    ids, mask = pad_batch(seqs, backend.tokenizer.pad_token_id, side="left")
    with torch.no_grad():
        logp = scorer.log_distribution(backend.model, ids.to(backend.device), mask.to(backend.device))
    return logp.exp().double().cpu().numpy()
