"""Confidence estimators by name, and :func:`score_records` to run several at once.

Training-free, question level (DESIGN.md §4.2): ``prob``, ``n-prob``,
``min-prob``, ``consis-lex``, ``consis-sem``, ``verbal-0``, ``verbal-10``.
Answer level: ``p-true``, ``verbal-{letter,number,text,float,percent}`` and
their ``-prompting`` variants (§4.3, §4.5), ``self-consistency``.

The strong baselines of issue 14, question level: from next-token
distributions ``token-entropy-mean``, ``token-entropy-max``, ``prob-margin``,
``perplexity``; from the samples ``mc-entropy``, ``semantic-entropy``,
``semantic-entropy-discrete``, ``num-sem-sets``, ``eigv``, ``degree``,
``eccentricity``, ``kle``, ``cocoa`` (similarity-based ones take
``similarity=lexical|judge|llm|embedding``); from hidden states
``eigenscore``; answer level, the trained linear ``probe``.

Importing this package registers every estimator module listed below; a new
estimator is one module with one ``@ESTIMATORS.register`` and one import here.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from candor.backends.base import Backend
from candor.confidences import ConfidenceTable, table_from_records
from candor.errors import CandorError
from candor.estimators import (  # noqa: F401
    cocoa,
    consistency,
    eigenscore,
    elical,
    kernel_entropy,
    logprob,
    probe,
    ptrue,
    sample_entropy,
    selfconsistency,
    spectral,
    tokenstats,  # noqa: F401
    verbal_answer,
    verbal_question,
)
from candor.estimators.base import ESTIMATORS, Estimator, get_estimator
from candor.records import Record

logger = logging.getLogger(__name__)

# Records per backend call when scoring with a model: progress updates, bounded memory.
CHUNK_SIZE = 32


def score_records(
    records: Sequence[Record],
    names: Sequence[str],
    backend: Backend | None = None,
    progress: bool = True,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> ConfidenceTable:
    """Score ``records`` with each named estimator into one table (methods are columns).

    ``options`` maps an estimator name to its constructor keywords, e.g.
    ``{"verbal-10": {"examples": train_records}}``. Every estimator is built
    and its backend checked before any work starts, so a missing model fails
    at once. Each column's ``table.columns`` entry holds the estimator's
    :meth:`~Estimator.describe` and, for estimators that parse replies, the
    number of replies that fell back (``parse_fallbacks``).
    """
    _check_unique_ids(records)
    options = options or {}
    estimators = [(name, get_estimator(name, **dict(options.get(name, {})))) for name in names]
    for _, est in estimators:
        est.check_backend(backend)
    table = table_from_records(records)
    ids = [r.id for r in records]
    for name, est in estimators:
        values, fallbacks = _run(est, records, backend, progress and est.needs_backend, chunk_size)
        table.add(name, ids, values)
        table.columns[name] = {"estimator": est.describe()}
        if hasattr(est, "last_fallbacks"):
            table.columns[name]["parse_fallbacks"] = fallbacks
    return table


def _run(
    est: Estimator, records: Sequence[Record], backend: Backend | None, progress: bool, chunk_size: int
) -> tuple[list[float], int]:
    """The estimator's values over ``records`` (in chunks when it runs a model), and its fallback count."""
    if not est.needs_backend:
        return est.estimate(records, backend).tolist(), 0
    values: list[float] = []
    fallbacks = 0
    with tqdm(total=len(records), desc=est.name, unit="rec", disable=not progress) as bar:
        for start in range(0, len(records), chunk_size):
            chunk = records[start : start + chunk_size]
            values.extend(est.estimate(chunk, backend).tolist())
            fallbacks += getattr(est, "last_fallbacks", 0)
            bar.update(len(chunk))
    if fallbacks:
        logger.warning("%s: %d of %d records used the fallback confidence", est.name, fallbacks, len(records))
    return values, fallbacks


def _check_unique_ids(records: Sequence[Record]) -> None:
    counts = Counter(r.id for r in records)
    dupes = [rid for rid, n in counts.items() if n > 1]
    if dupes:
        raise CandorError(
            f"record id {dupes[0]!r} occurs more than once ({len(dupes)} duplicated ids); ids must be unique"
        )


__all__ = ["ESTIMATORS", "Estimator", "get_estimator", "score_records"]
