"""Records: a QA item after a model answered it (HonestyBench annotation).

A record is one JSON line. candor's own field names are below; the released
HonestyBench field names are read and written by :func:`from_honestybench` and
:func:`to_honestybench` so the public 560k release can be used directly.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from candor.annotation.claims import Claim
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.data.judgeable import SkippedItems, UnjudgeableItem, judgeable_aliases
from candor.data.loaders import names_from_path
from candor.util.errors import CandorError, at_line
from candor.util.jsonl import iter_json_lines, write_json_lines


@dataclass
class Record:
    """One annotated QA item (docs/architecture.md "Vocabulary").

    ``consistency[i]`` says whether sample i is equivalent to the greedy answer;
    ``sample_correct[i]`` whether sample i is correct. ``provenance`` names the
    model, prompt template, decoding, judges and candor version.

    ``greedy_total_logprob`` is the greedy answer's total log-prob as an import
    gave it (HonestyBench's ``greedy_cumulative_logprobs``); it is kept so an
    export writes it back, and no estimator reads it: a total gives neither
    n-prob nor min-prob. candor's own records leave it None (the total is the
    sum of ``greedy.logprobs``).

    ``claims`` holds the greedy answer's claims with their labels (docs/claims.md
    "The records' format"); None for a record never split, which is every record
    written before claims existed (the key is absent from its line).
    """

    item: QAItem
    greedy: Completion
    samples: list[Completion]
    greedy_correct: int | None = None
    sample_correct: list[int] | None = None
    consistency: list[int] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    greedy_total_logprob: float | None = None
    claims: list[Claim] | None = None

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
        out = {
            "item": self.item.to_dict(),
            "greedy": self.greedy.to_dict(),
            "samples": [s.to_dict() for s in self.samples],
            "greedy_correct": self.greedy_correct,
            "sample_correct": self.sample_correct,
            "consistency": self.consistency,
            "provenance": self.provenance,
        }
        if self.greedy_total_logprob is not None:
            out["greedy_total_logprob"] = self.greedy_total_logprob
        if self.claims is not None:
            out["claims"] = [c.to_dict() for c in self.claims]
        return out

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
            greedy_total_logprob=d.get("greedy_total_logprob"),
            claims=None if d.get("claims") is None else [Claim.from_dict(c) for c in d["claims"]],
        )


# ---------------------------------------------------------------- file I/O

# A served log also holds label lines ``{"label": {...}}`` (candor.annotation.served_labels); reading
# records passes over them, so ``candor score`` and ``candor eval`` read a labelled log as it is.
LABEL_LINE_KEY = "label"


def read_records(path: str | Path, *, strict: bool = False) -> list[Record]:
    """Read a records JSONL file written by candor; lines in the released HonestyBench shape are imported."""
    path = Path(path)
    dataset = names_from_path(path)[0]

    def parse(obj: dict[str, Any], lineno: int) -> Record | None:
        if LABEL_LINE_KEY in obj and "item" not in obj:
            return None  # a label on a served answer, not a record
        return Record.from_dict(obj) if "item" in obj else from_honestybench(obj, dataset=dataset, index=lineno)

    return _read(path, parse, "not a record", strict)


def write_records(path: str | Path, records: Iterable[Record]) -> None:
    """Write records atomically: a temporary file, then a rename."""
    write_json_lines(path, (rec.to_dict() for rec in records))


def read_honestybench(path: str | Path, dataset: str = "", *, strict: bool = False) -> list[Record]:
    """Import a file of released-HonestyBench annotations; errors name the line.

    The dataset name defaults to the file's stem (``nq.jsonl`` → ``nq``; a
    split-named file like ``nq/test.jsonl`` takes its folder's name), and ids
    are ``{dataset}:{line}`` unless a line has its own ``id``. Items with no
    non-empty gold alias are skipped with one warning and counted in each
    record's ``provenance["skipped_items"]``; ``strict`` refuses them.
    """
    path = Path(path)
    dataset = dataset or names_from_path(path)[0]

    def parse(obj: dict[str, Any], lineno: int) -> Record:
        return from_honestybench(obj, dataset=dataset, index=lineno)

    return _read(path, parse, "not a HonestyBench annotation", strict)


def _read(path: Path, parse: Callable[[dict[str, Any], int], Record | None], what: str, strict: bool) -> list[Record]:
    """Parse each line (None: a line that is not a record, passed over); unjudgeable imported items are skipped
    and counted, other faults name the line."""
    out: list[Record] = []
    skipped = SkippedItems(str(path), strict=strict)
    for lineno, obj in iter_json_lines(path):
        try:
            rec = parse(obj, lineno)
            if rec is not None:
                out.append(rec)
        except UnjudgeableItem as exc:
            skipped.skip(lineno, exc)
        except (KeyError, TypeError, ValueError) as exc:
            raise at_line(path, lineno, f"{what}: missing or bad field {exc}") from None
    skipped.check_something_left(len(out))
    skipped.warn()
    for rec in out:
        if skipped.count and rec.provenance.get("imported_from"):
            rec.provenance["skipped_items"] = skipped.count
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
#
# The official repository's README documents one JSON object per line, with lists
# because vLLM returns one entry per output (docs/methods.md "Generation and judging"):
#   question: str, answer: [str],
#   greedy_response: [str] (one string), greedy_correctness: 0|1,
#   greedy_tokens: [[str]], greedy_cumulative_logprobs: [number] (the whole sequence's total),
#   greedy_logprobs: [[number]] (per token),
#   sampling_response: [str], sampling_correctness: [0|1], consistency_judgement: [0|1].

HONESTYBENCH_FIELDS = (
    "question",
    "answer",
    "greedy_response",
    "greedy_correctness",
    "greedy_tokens",
    "greedy_cumulative_logprobs",
    "greedy_logprobs",
    "sampling_response",
    "sampling_correctness",
    "consistency_judgement",
)


def to_honestybench(rec: Record) -> dict[str, Any]:
    """One line of the released HonestyBench, exactly its documented fields and shapes.

    What that format has no field for (ids, the samples' log-probs, provenance)
    is not written. The cumulative log-prob is the imported total when there
    was one, else the sum of the per-token log-probs, else null (unknown).
    """
    logprobs = [float(x) for x in rec.greedy.logprobs]
    total = rec.greedy_total_logprob
    if total is None and logprobs:
        total = math.fsum(logprobs)
    return {
        "question": rec.item.question,
        "answer": list(rec.item.answers),
        "greedy_response": [rec.greedy.text],
        "greedy_correctness": rec.greedy_correct,
        "greedy_tokens": [list(rec.greedy.tokens)],
        "greedy_cumulative_logprobs": [total],
        "greedy_logprobs": [logprobs],
        "sampling_response": [s.text for s in rec.samples],
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


def _single(d: dict[str, Any], key: str) -> Any:
    """The one entry of a field documented as a one-element list; None when absent or empty."""
    value = d.get(key)
    if value is None or value == []:
        return None
    if not isinstance(value, list) or len(value) != 1:
        raise ValueError(f"{key!r} must be a list holding one entry (one per vLLM output), got {value!r:.80}")
    return value[0]


def _per_token(d: dict[str, Any], key: str, kind: type) -> list[Any]:
    """``greedy_tokens`` / ``greedy_logprobs``: ``[[...]]``, the inner list per token."""
    inner = _single(d, key)
    if inner is None:
        return []
    if not isinstance(inner, list):
        raise ValueError(f"{key!r} must be [[...]], a list holding one per-token list, got {d[key]!r:.80}")
    return [kind(x) for x in inner]


def _greedy(d: dict[str, Any]) -> tuple[Completion, float | None]:
    """The greedy completion and the imported sequence total (never turned into per-token values)."""
    text = d["greedy_response"]
    if not isinstance(text, str):  # documented as [str]; a bare string is unambiguous too
        text = _single(d, "greedy_response")
    if not isinstance(text, str):
        raise ValueError(f"'greedy_response' must be [str], got {d['greedy_response']!r:.80}")
    tokens = _per_token(d, "greedy_tokens", str)
    logprobs = _per_token(d, "greedy_logprobs", float)
    if tokens and logprobs and len(tokens) != len(logprobs):
        raise ValueError(f"'greedy_tokens' has {len(tokens)} tokens but 'greedy_logprobs' {len(logprobs)} values")
    total = _single(d, "greedy_cumulative_logprobs")
    return Completion(text=text, tokens=tokens, logprobs=logprobs), None if total is None else float(total)


def _bits(d: dict[str, Any], key: str, n: int) -> list[int] | None:
    if d.get(key) is None:
        return None
    values = d[key]
    if not isinstance(values, list) or len(values) != n:
        raise ValueError(f"{key!r} must be a list of {n} verdicts (one per sample), got {values!r:.80}")
    return [_as_bit(v) for v in values]


def from_honestybench(d: dict[str, Any], dataset: str = "", index: int = 0) -> Record:
    """Import one released-HonestyBench object into a :class:`Record`.

    Raises :class:`UnjudgeableItem` for an item with no non-empty gold alias
    (readers skip and count those), and ``KeyError``/``TypeError``/``ValueError``
    for a line not in the documented shape.
    """
    answers = d["answer"] if "answer" in d else d["answers"]
    if answers is None or isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list):
        raise ValueError(f"'answer' must be [str], got {answers!r:.80}")
    dataset = str(d.get("dataset", dataset))
    item = QAItem(
        id=str(d.get("id", f"{dataset or 'hb'}:{index}")),
        dataset=dataset,
        split=str(d.get("split", "")),
        question=str(d["question"]),
        answers=judgeable_aliases(a if a is None else str(a) for a in answers),
    )
    greedy, total = _greedy(d)
    texts = d.get("sampling_response") or []
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"'sampling_response' must be [str], got {texts!r:.80}")
    greedy_correct = d.get("greedy_correctness")
    return Record(
        item=item,
        greedy=greedy,
        samples=[Completion(text=t) for t in texts],
        greedy_correct=_as_bit(greedy_correct) if greedy_correct is not None else None,
        sample_correct=_bits(d, "sampling_correctness", len(texts)),
        consistency=_bits(d, "consistency_judgement", len(texts)),
        provenance={"imported_from": "honestybench"},
        greedy_total_logprob=total,
    )
