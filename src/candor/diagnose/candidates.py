"""Candidate answers per question, for asking whether confidence depends on the answer.

For each record the candidates are, in this order: the greedy answer, the
sampled answers, the gold aliases, and answers borrowed from other questions
(their greedy answers and first gold aliases; the same dataset first,
shuffled with a seed per question, so a question's candidates depend on the
pool they borrow from but not on its order).
Candidates that normalize to the same text (``candor.annotation.text_matching.normalize``) are
kept once, empty ones dropped, and the list is capped (30 by default). Each is
labelled by the correctness judge against the question's gold aliases.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from candor.annotation.judges import get_correctness_judge
from candor.annotation.records import Record
from candor.annotation.text_matching import normalize
from candor.data.items import QAItem
from candor.util.errors import CandorError
from candor.util.seeds import item_rng

MAX_CANDIDATES = 30
SOURCES = ("greedy", "sample", "gold", "borrowed")


@dataclass(frozen=True)
class CandidateSet:
    """One question and its candidate answers, each with its source and 0/1 correctness."""

    item: QAItem
    answers: tuple[str, ...]
    correct: tuple[int, ...]
    sources: tuple[str, ...]

    def __post_init__(self) -> None:
        if not (len(self.answers) == len(self.correct) == len(self.sources)):
            raise CandorError(f"candidates of {self.item.id!r}: answers, correct and sources differ in length")

    def __len__(self) -> int:
        return len(self.answers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "item": self.item.to_dict(),
            "answers": list(self.answers),
            "correct": list(self.correct),
            "sources": list(self.sources),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CandidateSet:
        return cls(QAItem.from_dict(d["item"]), tuple(d["answers"]), tuple(d["correct"]), tuple(d["sources"]))


def build_candidates(
    records: Sequence[Record],
    *,
    max_candidates: int = MAX_CANDIDATES,
    seed: int = 0,
    judge: str = "contains",
    pool: Sequence[Record] | None = None,
) -> list[CandidateSet]:
    """One :class:`CandidateSet` per record; ``pool`` (default: ``records``) lends the borrowed answers."""
    if max_candidates < 2:
        raise CandorError(f"max_candidates must be at least 2 (pairs are compared), got {max_candidates}")
    pool = list(records if pool is None else pool)
    correctness = get_correctness_judge(judge)
    out = []
    for record in records:
        answers, sources = _collect(record, pool, max_candidates, seed)
        correct = correctness.judge(answers, [list(record.item.answers)] * len(answers))
        out.append(CandidateSet(record.item, tuple(answers), tuple(correct), tuple(sources)))
    return out


def _collect(record: Record, pool: Sequence[Record], cap: int, seed: int) -> tuple[list[str], list[str]]:
    answers: list[str] = []
    sources: list[str] = []
    seen: set[str] = set()
    for text, source in _proposals(record, pool, seed):
        key = normalize(text)
        if not key or key in seen:
            continue
        seen.add(key)
        answers.append(text.strip())
        sources.append(source)
        if len(answers) == cap:
            break
    return answers, sources


def _proposals(record: Record, pool: Sequence[Record], seed: int) -> Iterator[tuple[str, str]]:
    yield record.greedy.text, "greedy"
    for sample in record.samples:
        yield sample.text, "sample"
    for alias in record.item.answers:
        yield alias, "gold"
    for text in _borrowed(record, pool, seed):
        yield text, "borrowed"


def _borrowed(record: Record, pool: Sequence[Record], seed: int) -> list[str]:
    """Other questions' greedy answers and first gold aliases: same dataset first, each group shuffled."""
    rng = item_rng(seed, record.id)
    others = sorted((r for r in pool if r.id != record.id), key=lambda r: r.id)
    same = [r for r in others if r.item.dataset == record.item.dataset]
    rest = [r for r in others if r.item.dataset != record.item.dataset]
    out = []
    for group in (same, rest):
        texts = [t for r in group for t in (r.greedy.text, r.item.answers[0] if r.item.answers else "")]
        rng.shuffle(texts)
        out.extend(texts)
    return out
