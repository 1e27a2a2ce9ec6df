"""Records: a QA item after a model answered it (HonestyBench annotation).

A record is one JSON line. candor's own field names are below; the released
HonestyBench field names are read and written by :func:`from_honestybench` and
:func:`to_honestybench` so the public 560k release can be used directly.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.errors import CandorError, at_line
from candor.jsonl import iter_json_lines, write_json_lines


@dataclass
class Record:
    """One annotated QA item (DESIGN.md §1).

    ``consistency[i]`` says whether sample i is equivalent to the greedy answer;
    ``sample_correct[i]`` whether sample i is correct. ``provenance`` names the
    model, prompt template, decoding, judges and candor version.
    """

    item: QAItem
    greedy: Completion
    samples: list[Completion]
    greedy_correct: int | None = None
    sample_correct: list[int] | None = None
    consistency: list[int] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.item.id

    @property
    def k(self) -> int:
        return len(self.samples)

    @property
    def consistency_rate(self) -> float:
        """Mean consistency verdict over the samples (EliCal's stage-1 target)."""
        if not self.consistency:
            raise CandorError(f"record {self.id!r} has no consistency verdicts")
        return sum(self.consistency) / len(self.consistency)

    @property
    def sample_accuracy(self) -> float:
        """Fraction of the samples judged correct (EliCal's stage-2 soft target)."""
        if not self.sample_correct:
            raise CandorError(f"record {self.id!r} has no sample correctness")
        return sum(self.sample_correct) / len(self.sample_correct)

    def to_dict(self) -> dict[str, Any]:
        return {
            "item": self.item.to_dict(),
            "greedy": self.greedy.to_dict(),
            "samples": [s.to_dict() for s in self.samples],
            "greedy_correct": self.greedy_correct,
            "sample_correct": self.sample_correct,
            "consistency": self.consistency,
            "provenance": self.provenance,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        return cls(
            item=QAItem.from_dict(d["item"]),
            greedy=Completion.from_dict(d["greedy"]),
            samples=[Completion.from_dict(s) for s in d.get("samples", [])],
            greedy_correct=d.get("greedy_correct"),
            sample_correct=d.get("sample_correct"),
            consistency=d.get("consistency"),
            provenance=dict(d.get("provenance") or {}),
        )


# ---------------------------------------------------------------- file I/O


def read_records(path: str | Path) -> list[Record]:
    """Read a records JSONL file written by candor (or imported HonestyBench)."""
    out = []
    for lineno, obj in iter_json_lines(path):
        try:
            out.append(Record.from_dict(obj) if "item" in obj else from_honestybench(obj))
        except (KeyError, TypeError, ValueError) as exc:
            raise at_line(path, lineno, f"not a record: missing or bad field {exc}") from None
    return out


def write_records(path: str | Path, records: Iterable[Record]) -> None:
    """Write records atomically: a temporary file, then a rename."""
    write_json_lines(path, (rec.to_dict() for rec in records))


def read_honestybench(path: str | Path, dataset: str = "") -> list[Record]:
    """Import a file of released-HonestyBench annotations; errors name the line."""
    path = Path(path)
    out = []
    for lineno, obj in iter_json_lines(path):
        try:
            out.append(from_honestybench(obj, dataset=dataset or path.parent.name, index=lineno))
        except (KeyError, TypeError, ValueError) as exc:
            raise at_line(path, lineno, f"not a HonestyBench annotation: missing or bad field {exc}") from None
    return out


class RecordAppender:
    """Append whole lines and fsync per batch, so a killed run loses only its batch.

    On open, a trailing partial line (a write cut by ``kill -9``) is cut off.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        truncate_partial_last_line(self.path)
        self._fh = self.path.open("a", encoding="utf-8")

    def append(self, records: Iterable[Record]) -> None:
        text = "".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in records)
        self._fh.write(text)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> RecordAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def truncate_partial_last_line(path: Path) -> None:
    """Drop bytes after the last newline: they are an interrupted write."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with path.open("r+b") as fh:
            fh.truncate(end)


# ------------------------------------------------- HonestyBench interoperability


def _cumulative(logprobs: list[float]) -> list[float]:
    total, out = 0.0, []
    for lp in logprobs:
        total += lp
        out.append(total)
    return out


def to_honestybench(rec: Record) -> dict[str, Any]:
    """Export a record with the released HonestyBench field names."""
    return {
        "id": rec.item.id,
        "dataset": rec.item.dataset,
        "question": rec.item.question,
        "answer": list(rec.item.answers),
        "greedy_response": rec.greedy.text,
        "greedy_correctness": rec.greedy_correct,
        "greedy_tokens": list(rec.greedy.tokens),
        "greedy_logprobs": list(rec.greedy.logprobs),
        "greedy_cumulative_logprobs": _cumulative(rec.greedy.logprobs),
        "sampling_response": [s.text for s in rec.samples],
        "sampling_logprobs": [list(s.logprobs) for s in rec.samples],
        "sampling_correctness": rec.sample_correct,
        "consistency_judgement": rec.consistency,
    }


def _as_bit(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and not math.isnan(value):
        return int(value >= 0.5)
    if isinstance(value, str):
        return int(value.strip().lower() in {"1", "true", "yes", "correct", "certain", "consistent"})
    raise ValueError(f"cannot read {value!r} as 0/1")


def from_honestybench(d: dict[str, Any], dataset: str = "", index: int = 0) -> Record:
    """Import one released-HonestyBench object into a :class:`Record`."""
    answers = d.get("answer", d.get("answers"))
    if isinstance(answers, str):
        answers = [answers]
    item = QAItem(
        id=str(d.get("id", f"{dataset or d.get('dataset', 'hb')}:{index}")),
        dataset=str(d.get("dataset", dataset)),
        split=str(d.get("split", "")),
        question=str(d["question"]),
        answers=tuple(answers or ()),
    )
    greedy_lp = d.get("greedy_logprobs")
    if greedy_lp is None and d.get("greedy_cumulative_logprobs"):
        cum = list(d["greedy_cumulative_logprobs"])
        greedy_lp = [b - a for a, b in zip([0.0, *cum[:-1]], cum, strict=True)]
    greedy = Completion(
        text=str(d["greedy_response"]),
        tokens=list(d.get("greedy_tokens") or []),
        logprobs=[float(x) for x in greedy_lp or []],
    )
    sample_lps = d.get("sampling_logprobs") or [[] for _ in d.get("sampling_response", [])]
    samples = [
        Completion(text=str(t), logprobs=[float(x) for x in lp])
        for t, lp in zip(d.get("sampling_response", []), sample_lps, strict=False)
    ]

    def bits(key: str) -> list[int] | None:
        return [_as_bit(v) for v in d[key]] if d.get(key) is not None else None

    greedy_correct = d.get("greedy_correctness")
    return Record(
        item=item,
        greedy=greedy,
        samples=samples,
        greedy_correct=_as_bit(greedy_correct) if greedy_correct is not None else None,
        sample_correct=bits("sampling_correctness"),
        consistency=bits("consistency_judgement"),
        provenance={"imported_from": "honestybench"},
    )
