"""Training targets of the two EliCal stages, with the checks that make bad input fail early (docs/methods.md "EliCal").

- Stage 1 (Eli): the consistency rate, the mean consistency verdict of the k
  samples; no gold labels needed.
- Stage 2 (Cal): the sample accuracy, the fraction of the k samples judged
  correct (``soft``, the paper's default), or the greedy answer's correctness
  (``hard``).

A record that lacks the field its stage needs is a :class:`CandorError` naming
the record, the field and, when the caller says which file the records came
from (in file order), the file and line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from candor.annotation.records import Record
from candor.util.errors import CandorError, at_line
from candor.util.registry import Registry


@dataclass(frozen=True)
class TargetKind:
    """How one stage turns a record into a target in [0, 1], and the field it needs."""

    name: str
    field: str
    needs: str  # what to tell a user whose records lack the field
    value: Callable[[Record], float]
    present: Callable[[Record], bool]


TARGETS: Registry[TargetKind] = Registry("EliCal target")

TARGETS.register("consistency")(
    TargetKind(
        name="consistency",
        field="consistency",
        needs="stage 1 (Eli) trains on the consistency rate; annotate with samples and a consistency judge",
        value=lambda r: r.consistency_rate,
        present=lambda r: bool(r.consistency),
    )
)
TARGETS.register("soft")(
    TargetKind(
        name="soft",
        field="sample_correct",
        needs="stage 2 (Cal) with soft targets trains on the sample accuracy; annotate with gold answers and samples",
        value=lambda r: r.sample_accuracy,
        present=lambda r: bool(r.sample_correct),
    )
)
TARGETS.register("hard")(
    TargetKind(
        name="hard",
        field="greedy_correct",
        needs="stage 2 (Cal) with hard targets trains on the greedy answer's correctness; annotate with gold answers",
        value=lambda r: float(r.greedy_correct),  # type: ignore[arg-type]
        present=lambda r: r.greedy_correct is not None,
    )
)


def check_field(records: Sequence[Record], kind: str, source: str | Path | None = None, what: str = "") -> None:
    """Raise when any record lacks the field ``kind`` needs; the error names the first one."""
    target = TARGETS.get(kind)
    missing = [i for i, r in enumerate(records) if not target.present(r)]
    if not missing:
        return
    i = missing[0]
    where = f" of {what}" if what else ""
    message = (
        f"record {records[i].id!r}{where} has no {target.field!r} ({len(missing)} of {len(records)} records "
        f"lack it): {target.needs}"
    )
    raise at_line(source, i + 1, message) if source is not None else CandorError(message)


def targets(records: Sequence[Record], kind: str, source: str | Path | None = None, what: str = "") -> np.ndarray:
    """One float32 target in [0, 1] per record, after :func:`check_field`."""
    check_field(records, kind, source, what)
    value = TARGETS.get(kind).value
    return np.array([value(r) for r in records], dtype=np.float32)


def stage_target(stage: str, cal_target: str) -> str:
    """The target kind of a stage: ``eli`` → consistency, ``cal`` → ``cal_target`` (soft or hard)."""
    if stage == "eli":
        return "consistency"
    if cal_target not in ("soft", "hard"):
        raise CandorError(f"the stage-2 target must be 'soft' (sample accuracy) or 'hard' (greedy), got {cal_target!r}")
    return cal_target
