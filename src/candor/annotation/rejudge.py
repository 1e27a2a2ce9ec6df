"""Judge existing records again with another consistency judge (``candor rejudge``).

Generation is the expensive part of annotation and judging the cheap part, so
switching judges never needs the model again: the samples' verdicts are
recomputed from the stored texts and the provenance names the new judge (so a
resumed ``annotate`` with that judge accepts the file, and ``consis-sem`` knows
whose verdicts it reads).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from candor.annotation.judges import get_consistency_judge, judge_consistency
from candor.annotation.records import Record
from candor.backends.base import Backend

logger = logging.getLogger(__name__)


def rejudge_consistency(
    records: Sequence[Record], judge: str, *, backend: Backend | None = None, **options: Any
) -> list[Record]:
    """Copies of ``records`` with ``consistency`` recomputed by ``judge`` (provenance updated)."""
    kwargs = {**options, **({"backend": backend} if backend is not None else {})}
    consistency = get_consistency_judge(judge, **kwargs)
    verdicts = judge_consistency(
        consistency,
        [r.greedy.text for r in records],
        [[s.text for s in r.samples] for r in records],
        [r.item.question for r in records],
    )
    changed = sum(v != (r.consistency or []) for v, r in zip(verdicts, records, strict=True))
    logger.info("rejudged %d records with %s: %d changed", len(records), judge, changed)
    return [
        dataclasses.replace(r, consistency=v, provenance={**r.provenance, "consistency_judge": judge})
        for r, v in zip(records, verdicts, strict=True)
    ]
