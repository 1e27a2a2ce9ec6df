"""Estimators from the greedy answer's next-token distributions: entropy, margin, perplexity.

- ``token-entropy-mean`` / ``token-entropy-max``: the mean / largest entropy H
  (nats) of the model's next-token distribution over the greedy answer's
  tokens; confidence ``exp(-H)``.
- ``prob-margin``: the mean over tokens of ``p(top-1) - p(top-2)``, already a
  confidence in [0, 1] (for greedy decoding the top-1 token is the answer's).
- ``perplexity``: confidence ``1 / perplexity = exp(mean token log-prob)``.
  This is exactly ``n-prob`` (any monotone map of perplexity ranks records as
  n-prob does); it is registered under its own name because papers report it.

Where the distributions come from (``source``):

- ``model`` (default): one teacher-forced pass of the record's QA prompt and
  the stored greedy ``token_ids`` through a backend that offers
  ``token_distribution_stats`` (the ``hf`` backend). Entropies are exact over
  the full vocabulary.
- ``topk``: the records' stored top-k log-probs (``greedy.top_logprobs``, one
  ``{token: log-prob}`` map per token). The entropy is then a top-k
  approximation, ``-sum over the top k of p log p``, which never exceeds the
  full entropy; the margin is exact when k ≥ 2.

An answer with no tokens has no distribution: it is a :class:`CandorError`.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.annotation.prompts import record_prompts
from candor.annotation.records import Record
from candor.backends.base import LOGPROBS, TOP_LOGPROBS, Backend
from candor.estimators.base import ESTIMATORS, Estimator
from candor.estimators.logprob import greedy_logprobs
from candor.util.errors import CandorError

SOURCES = ("model", "topk")

# Columns of a statistics row: entropy (nats), top-1 log-prob, top-2 log-prob.
ENTROPY, TOP1, TOP2 = 0, 1, 2

# Statistics per backend object, by (prompt, answer token ids): the three estimators of this
# module scored in one run share one teacher-forced pass. A backend is one model (and adapter).
_MEMO: weakref.WeakKeyDictionary[Any, dict[tuple[str, tuple[int, ...]], np.ndarray]] = weakref.WeakKeyDictionary()


def model_token_stats(records: Sequence[Record], backend: Backend) -> list[np.ndarray]:
    """``[tokens, 3]`` statistics per record from one teacher-forced pass (see the module docstring)."""
    stats_fn = getattr(backend, "token_distribution_stats", None)
    if stats_fn is None:
        raise CandorError(
            f"backend {type(backend).__name__} cannot give full next-token distributions; "
            "use the hf backend, or source=topk with records that carry top-k log-probs"
        )
    for rec in records:
        if not rec.greedy.token_ids:
            raise CandorError(f"record {rec.id!r}: the greedy answer has no token ids to score")
    prompts, _ = record_prompts(records, backend)
    keys = [(p, tuple(r.greedy.token_ids)) for p, r in zip(prompts, records, strict=True)]
    memo: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}
    with contextlib.suppress(TypeError):  # a backend that cannot be weakly referenced is not memoized
        memo = _MEMO.setdefault(backend, {})
    todo = list(dict.fromkeys(k for k in keys if k not in memo))
    if todo:
        computed = stats_fn([p for p, _ in todo], [list(ids) for _, ids in todo])
        memo.update(zip(todo, computed, strict=True))
    out = [memo[k] for k in keys]
    if len(memo) > 4096:  # bounded: a long run keeps only its latest chunks
        memo.clear()
    return out


def topk_token_stats(record: Record) -> np.ndarray:
    """``[tokens, 3]`` statistics from the record's stored top-k log-probs (entropy: top-k approximation)."""
    tops = getattr(record.greedy, "top_logprobs", None)
    if not tops:
        raise CandorError(
            f"record {record.id!r}: the greedy answer carries no top-k log-probs (greedy.top_logprobs); "
            "use source=model with the hf backend"
        )
    rows = []
    for position in tops:
        lps = np.sort(np.minimum(np.asarray(list(dict(position).values()), dtype=float), 0.0))[::-1]
        if lps.size == 0:
            raise CandorError(f"record {record.id!r}: an empty top-k log-prob entry")
        second = lps[1] if lps.size > 1 else -np.inf
        rows.append([float(-(np.exp(lps) * lps).sum()), lps[0], second])
    return np.array(rows, dtype=float)


class _TokenStatsEstimator(Estimator):
    level = "question"

    def __init__(self, source: str = "model") -> None:
        if source not in SOURCES:
            raise CandorError(f"{self.name}: source must be one of {', '.join(SOURCES)}, got {source!r}")
        self.source = source
        self.needs_backend = source == "model"
        # The model source reads the answer's token ids alone; topk reads the stored alternatives.
        self.requires = frozenset({TOP_LOGPROBS}) if source == "topk" else frozenset()

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        if self.source == "model":
            assert backend is not None  # checked by estimate()
            stats = model_token_stats(records, backend)
        else:
            stats = [topk_token_stats(r) for r in records]
        return np.array([self.reduce(s) for s in stats])

    def reduce(self, stats: np.ndarray) -> float:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        approx = "exact, full vocabulary" if self.source == "model" else "top-k approximation"
        return {**super().describe(), "source": self.source, "entropy": approx}


@ESTIMATORS.register("token-entropy-mean")
class MeanTokenEntropy(_TokenStatsEstimator):
    """exp(-mean token entropy) over the greedy answer."""

    name = "token-entropy-mean"

    def reduce(self, stats: np.ndarray) -> float:
        return float(np.exp(-stats[:, ENTROPY].mean()))


@ESTIMATORS.register("token-entropy-max")
class MaxTokenEntropy(_TokenStatsEstimator):
    """exp(-largest token entropy) over the greedy answer."""

    name = "token-entropy-max"

    def reduce(self, stats: np.ndarray) -> float:
        return float(np.exp(-stats[:, ENTROPY].max()))


@ESTIMATORS.register("prob-margin")
class ProbabilityMargin(_TokenStatsEstimator):
    """Mean over the greedy answer's tokens of p(top-1) - p(top-2)."""

    name = "prob-margin"

    def reduce(self, stats: np.ndarray) -> float:
        return float((np.exp(stats[:, TOP1]) - np.exp(stats[:, TOP2])).mean())


@ESTIMATORS.register("perplexity")
class Perplexity(Estimator):
    """1 / perplexity of the greedy answer = exp(mean token log-prob) (equal to ``n-prob``)."""

    name = "perplexity"
    level = "question"
    requires = frozenset({LOGPROBS})

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        return np.array([float(np.exp(greedy_logprobs(r).mean())) for r in records])
