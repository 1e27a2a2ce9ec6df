"""Shared machinery of the sample-based estimators: similarity between answers, and semantic clusters.

Similarities (``SIMILARITIES``, chosen per estimator with ``similarity=``):

- ``lexical``: ROUGE-L F1 (:func:`candor.annotation.text_matching.rouge_l_f1`);
- ``judge``: the consistency judge named by ``judge`` (``lexical`` by default),
  averaged over both orders, so a pair scores 0, 0.5 or 1;
- ``llm``: the same with the ``llm`` consistency judge on the estimator's backend;
- ``embedding``: cosine similarity of sentence embeddings from
  ``candor.backends.embeddings.pair_similarity`` (the offline MiniLM extra), clipped to [0, 1].

Every similarity scores lists of pairs in one batched call, so an LLM judge
sees all the pairs of a chunk of records at once. A similarity matrix has 1 on
its diagonal (an answer is equivalent to itself) and is symmetric. A pair with
an empty answer (:func:`candor.annotation.text_matching.is_empty_answer`) scores 0
under every similarity and is never equivalent in a cluster, the rule the
consistency judges follow, so two empty samples are two clusters whichever
similarity or judge is chosen (an embedding would otherwise call them identical).

The probability-weighted estimators read each sample's probability through
:func:`sequence_logprob`; an answer that is only a stop takes its stop token's
probability, as the semantic-entropy reference code does.

Semantic clusters follow Kuhn et al. (2023): samples are taken in order, and
each joins the first cluster whose first member it is equivalent to in both
directions under a consistency judge, else starts a new cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from candor.annotation.judges import CONSISTENCY_JUDGES, get_consistency_judge
from candor.annotation.records import Record
from candor.annotation.text_matching import is_empty_answer, rouge_l_f1
from candor.backends.base import Backend
from candor.estimators.base import Estimator
from candor.util.errors import CandorError
from candor.util.registry import Registry

logger = logging.getLogger(__name__)


class Similarity(Protocol):
    name: str

    def pairs(self, a: Sequence[str], b: Sequence[str], questions: Sequence[str]) -> np.ndarray:
        """A symmetric similarity in [0, 1] for each pair (a[i], b[i])."""
        ...


SIMILARITIES: Registry[type] = Registry("similarity")


@SIMILARITIES.register("lexical")
class LexicalSimilarity:
    """ROUGE-L F1 between the two answers."""

    name = "lexical"

    def __init__(self, backend: Backend | None = None, judge: str = "lexical") -> None:
        pass

    def pairs(self, a: Sequence[str], b: Sequence[str], questions: Sequence[str]) -> np.ndarray:
        return np.array([rouge_l_f1(x, y) for x, y in zip(a, b, strict=True)], dtype=float)


@SIMILARITIES.register("judge")
class JudgeSimilarity:
    """Mean of a consistency judge's verdicts on (a, b) and (b, a)."""

    name = "judge"

    def __init__(self, backend: Backend | None = None, judge: str = "lexical") -> None:
        self.judge = consistency_judge(judge, backend)

    def pairs(self, a: Sequence[str], b: Sequence[str], questions: Sequence[str]) -> np.ndarray:
        both = np.array(self.judge.judge([*a, *b], [*b, *a], [*questions, *questions]), dtype=float)
        return (both[: len(a)] + both[len(a) :]) / 2


@SIMILARITIES.register("llm")
class LLMSimilarity(JudgeSimilarity):
    """The ``llm`` consistency judge on the estimator's backend, both orders averaged."""

    name = "llm"

    def __init__(self, backend: Backend | None = None, judge: str = "llm") -> None:
        super().__init__(backend, "llm")


@SIMILARITIES.register("embedding")
class EmbeddingSimilarity:
    """Cosine similarity of sentence embeddings (``candor.backends.embeddings.pair_similarity``), clipped to [0, 1].

    The MiniLM wheel loads on first use; without it that call names the pip command.
    """

    name = "embedding"

    def __init__(self, backend: Backend | None = None, judge: str = "lexical") -> None:
        from candor.backends.embeddings import pair_similarity

        self.score = pair_similarity

    def pairs(self, a: Sequence[str], b: Sequence[str], questions: Sequence[str]) -> np.ndarray:
        if not a:
            return np.zeros(0, dtype=float)
        return np.clip(np.asarray(self.score(list(a), list(b)), dtype=float), 0.0, 1.0)


def needs_backend(similarity: str, judge: str = "lexical") -> bool:
    """Whether this similarity (or judge) asks a model, so the estimator needs a backend."""
    return similarity == "llm" or (similarity == "judge" and judge == "llm")


def check_similarity(similarity: str, judge: str = "lexical") -> None:
    """Fail at construction on an unknown similarity or judge name."""
    SIMILARITIES.get(similarity)
    CONSISTENCY_JUDGES.get(judge)


def consistency_judge(name: str, backend: Backend | None) -> Any:
    """The named consistency judge; the ``llm`` judge runs on ``backend``."""
    options = {"backend": backend} if name == "llm" else {}
    return get_consistency_judge(name, **options)


def get_similarity(name: str, backend: Backend | None = None, judge: str = "lexical") -> Similarity:
    return SIMILARITIES.build(name, backend=backend, judge=judge)


# Estimators that compare samples with each other: one sample has nothing to compare with,
# and would score 1.0 whatever it says.
PAIRWISE_MIN_SAMPLES = 2


def require_samples(record: Record, name: str, at_least: int = 1) -> list[str]:
    """The record's sample texts; fewer than ``at_least`` of them (none, by default) is a :class:`CandorError`."""
    if not record.samples:
        raise CandorError(f"record {record.id!r} has no sampled answers; {name} needs them")
    if record.k < at_least:
        raise CandorError(
            f"{name} compares sampled answers with each other and needs k >= {at_least} per record; "
            f"record {record.id!r} has k = {record.k} (annotate with --k {at_least} or more)"
        )
    return [s.text for s in record.samples]


def scored_pairs(similarity: Similarity, a: Sequence[str], b: Sequence[str], q: Sequence[str]) -> np.ndarray:
    """``similarity.pairs`` on the pairs without an empty answer; pairs with one score 0 unasked."""
    out = np.zeros(len(a), dtype=float)
    asked = [i for i in range(len(a)) if not (is_empty_answer(a[i]) or is_empty_answer(b[i]))]
    if asked:
        out[asked] = similarity.pairs([a[i] for i in asked], [b[i] for i in asked], [q[i] for i in asked])
    return out


def similarity_matrices(
    groups: Sequence[Sequence[str]], questions: Sequence[str], similarity: Similarity
) -> list[np.ndarray]:
    """One symmetric ``[k, k]`` matrix per group of answers (unit diagonal), all pairs scored in one call."""
    a, b, q, where = [], [], [], []
    for g, (texts, question) in enumerate(zip(groups, questions, strict=True)):
        for i in range(len(texts)):
            for j in range(i + 1, len(texts)):
                a.append(texts[i])
                b.append(texts[j])
                q.append(question)
                where.append((g, i, j))
    scores = scored_pairs(similarity, a, b, q)
    out = [np.eye(len(texts)) for texts in groups]
    for (g, i, j), s in zip(where, scores, strict=True):
        out[g][i, j] = out[g][j, i] = s
    return out


def cross_similarities(
    anchors: Sequence[str], groups: Sequence[Sequence[str]], questions: Sequence[str], similarity: Similarity
) -> list[np.ndarray]:
    """Similarity of each group's anchor (e.g. the greedy answer) to each of its answers."""
    a, b, q, owner = [], [], [], []
    for g, (anchor, texts, question) in enumerate(zip(anchors, groups, questions, strict=True)):
        for text in texts:
            a.append(anchor)
            b.append(text)
            q.append(question)
            owner.append(g)
    scores = scored_pairs(similarity, a, b, q)
    out: list[list[float]] = [[] for _ in groups]
    for g, s in zip(owner, scores, strict=True):
        out[g].append(float(s))
    return [np.array(v, dtype=float) for v in out]


def semantic_clusters(groups: Sequence[Sequence[str]], questions: Sequence[str], judge: Any) -> list[list[int]]:
    """The cluster index of every answer of every group (Kuhn et al.'s greedy bidirectional clustering).

    All candidate pairs are judged in one batch first: every pair (i, j), i < j,
    in both orders. That is more verdicts than the sequential algorithm needs
    (it compares only with each cluster's first member) but the same clusters.
    A pair with an empty answer is not equivalent and is not asked.
    """
    a, b, q, where = [], [], [], []
    for g, (texts, question) in enumerate(zip(groups, questions, strict=True)):
        for i in range(len(texts)):
            for j in range(i + 1, len(texts)):
                if is_empty_answer(texts[i]) or is_empty_answer(texts[j]):
                    continue
                a.extend([texts[i], texts[j]])
                b.extend([texts[j], texts[i]])
                q.extend([question, question])
                where.append((g, i, j))
    verdicts = judge.judge(a, b, q) if a else []
    equivalent = [np.zeros((len(t), len(t)), dtype=bool) for t in groups]
    for n, (g, i, j) in enumerate(where):
        equivalent[g][i, j] = equivalent[g][j, i] = bool(verdicts[2 * n]) and bool(verdicts[2 * n + 1])
    return [cluster_ids(eq) for eq in equivalent]


def cluster_ids(equivalent: np.ndarray) -> list[int]:
    """Greedy clustering from a symmetric equivalence matrix: join the first cluster whose first member matches."""
    firsts: list[int] = []
    ids: list[int] = []
    for i in range(equivalent.shape[0]):
        for c, first in enumerate(firsts):
            if equivalent[i, first]:
                ids.append(c)
                break
        else:
            ids.append(len(firsts))
            firsts.append(i)
    return ids


def sequence_logprob(record: Record, index: int, mean: bool = False) -> float | None:
    """Sum (or with ``mean``, the mean) of sample ``index``'s token log-probs; None when unknown.

    An answer with no tokens of its own (backends drop the stop token from
    ``logprobs``) is the stop token alone: its probability is that token's,
    ``Completion.stop_logprob``, as a one-token sequence, the way Farquhar et
    al.'s semantic-entropy code takes an answer that is only a stop word. (The
    stop token may also carry the whole answer, as "Paris\n" does when "\n"
    stops.) An empty answer from a record written before candor kept that
    log-prob gives None: its probability is unknown, and callers leave it out
    (:func:`sample_logprobs`). A non-empty answer without any log-prob (an
    import that dropped them) is a :class:`CandorError`.
    """
    sample = record.samples[index]
    if sample.logprobs:
        lps = np.asarray(sample.logprobs, dtype=float)
    elif sample.stop_logprob is not None:
        lps = np.asarray([sample.stop_logprob], dtype=float)
    elif sample.text.strip():
        raise CandorError(f"record {record.id!r}: sample {index} has no token log-probs; this estimator needs them")
    else:
        return None
    if not np.isfinite(lps).all():
        raise CandorError(f"record {record.id!r}: sample {index} has non-finite token log-probs")
    lps = np.minimum(lps, 0.0)
    return float(lps.mean() if mean else lps.sum())


def sample_logprobs(records: Sequence[Record], name: str, mean: bool = False) -> list[np.ndarray]:
    """Every record's :func:`sequence_logprob` per sample, NaN where unknown (logged with a count).

    A record whose every sample is unknown is a :class:`CandorError`: there is
    no probability left to weigh by.
    """
    out, unknown = [], 0
    for rec in records:
        require_samples(rec, name)
        values = [sequence_logprob(rec, j, mean=mean) for j in range(rec.k)]
        row = np.array([np.nan if v is None else v for v in values], dtype=float)
        if np.isnan(row).all():
            raise CandorError(
                f"record {rec.id!r}: every sample is an empty answer without its stop token's log-prob "
                f"(records written before candor kept it); {name} needs them: annotate again"
            )
        unknown += int(np.isnan(row).sum())
        out.append(row)
    if unknown:
        logger.warning(
            "%s: %d empty sampled answer(s) have no stop-token log-prob (records written before candor "
            "kept it) and are left out of the probability weights; annotate again to include them",
            name,
            unknown,
        )
    return out


# ---------------------------------------------------------------- estimator bases


class SimilarityEstimator(Estimator):
    """An estimator over each record's sample-similarity matrix (``similarity=``, ``judge=`` options)."""

    level = "question"
    min_samples = PAIRWISE_MIN_SAMPLES
    default_samples = 5

    def __init__(self, similarity: str = "lexical", judge: str = "lexical") -> None:
        check_similarity(similarity, judge)
        self.similarity = similarity
        self.judge_name = judge
        self.needs_backend = needs_backend(similarity, judge)

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        groups = [require_samples(r, self.name, self.min_samples) for r in records]
        sim = get_similarity(self.similarity, backend, self.judge_name)
        matrices = similarity_matrices(groups, [r.item.question for r in records], sim)
        return np.array([self.from_matrix(m) for m in matrices])

    def from_matrix(self, similarity: np.ndarray) -> float:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        out = {**super().describe(), "similarity": self.similarity}
        if self.similarity == "judge":
            out["judge"] = self.judge_name
        return out


class ClusterEstimator(Estimator):
    """An estimator over each record's semantic clusters under a consistency judge (``judge=`` option)."""

    level = "question"
    min_samples = PAIRWISE_MIN_SAMPLES
    default_samples = 5

    def __init__(self, judge: str = "lexical") -> None:
        CONSISTENCY_JUDGES.get(judge)
        self.judge_name = judge
        self.needs_backend = judge == "llm"

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        clusters = self.clusters(records, backend)
        return np.array([self.from_clusters(r, c) for r, c in zip(records, clusters, strict=True)])

    def clusters(self, records: Sequence[Record], backend: Backend | None) -> list[list[int]]:
        """Every record's semantic cluster ids, all pairs judged in one batch."""
        groups = [require_samples(r, self.name, self.min_samples) for r in records]
        judge = consistency_judge(self.judge_name, backend)
        return semantic_clusters(groups, [r.item.question for r in records], judge)

    def from_clusters(self, record: Record, clusters: list[int]) -> float:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "judge": self.judge_name}
