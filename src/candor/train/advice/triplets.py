"""ADVICE training triplets: (question, a_correct, a_wrong) from annotated records.

See docs/methods.md "ADVICE and ConfTuner".

- Only questions whose greedy answer is correct are used; ``a_correct`` is
  the model's own greedy answer (as an estimator shows it: the option letter
  for multiple choice).
- ``a_wrong`` is a hard negative: among the record's sampled answers that
  the judge marks wrong, the one the model found most likely (highest mean
  token log-prob).
- A record without one gets more samples from ``backend`` (with the
  record's own prompt template and decoding), up to ``extra_rounds`` times.
- As a last resort ``a_wrong`` is an answer given to another question of the
  same dataset that the judge marks wrong for this one. These are counted
  (``TripletStats.from_other_questions``), and a record still without a
  wrong answer is dropped and counted.

A candidate is wrong only when the judge says so against *this* question's
gold answers (and, for annotated samples, the annotation agreed), and never
when it states the same answer as ``a_correct`` after normalization.
Triplets are written as JSONL so they can be inspected and reused.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from candor.annotation.judges import CorrectnessJudge, get_correctness_judge
from candor.annotation.prompts import TEMPLATES, QATemplate, resolve_template
from candor.annotation.records import Record
from candor.annotation.text_matching import normalize
from candor.backends.base import Backend, SamplingParams
from candor.data.items import QAItem
from candor.data.splits import seeded_shuffle
from candor.estimators.answers import record_answer, stated_answer
from candor.util.errors import at_line
from candor.util.jsonl import iter_json_lines, write_json_lines
from candor.util.seeds import item_seed

logger = logging.getLogger(__name__)

SOURCES = ("sample", "resample", "other-question")
# Answers from other questions tried per record in the last-resort step.
MAX_OTHER_CANDIDATES = 200


@dataclass(frozen=True)
class Triplet:
    """One training pair for a question: the model's correct answer and a wrong one."""

    item: QAItem
    a_correct: str
    a_wrong: str
    source: str  # one of SOURCES
    wrong_from: str  # id of the record whose answer a_wrong is

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.item.id,
            "item": self.item.to_dict(),
            "a_correct": self.a_correct,
            "a_wrong": self.a_wrong,
            "source": self.source,
            "wrong_from": self.wrong_from,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Triplet:
        return cls(
            item=QAItem.from_dict(d["item"]),
            a_correct=str(d["a_correct"]),
            a_wrong=str(d["a_wrong"]),
            source=str(d["source"]),
            wrong_from=str(d.get("wrong_from", "")),
        )


@dataclass
class TripletStats:
    """Where the wrong answers came from."""

    records: int = 0
    eligible: int = 0  # records whose greedy answer is correct
    from_samples: int = 0
    from_resamples: int = 0
    from_other_questions: int = 0
    dropped: int = 0  # eligible records left without any wrong answer

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class TripletSet:
    triplets: list[Triplet] = field(default_factory=list)
    stats: TripletStats = field(default_factory=TripletStats)


def _same(a: str, b: str) -> bool:
    return normalize(a) == normalize(b)


def _mean_logprob(logprobs: Sequence[float]) -> float:
    return float(np.mean(logprobs)) if len(logprobs) else float("-inf")


class _WrongFinder:
    """Picks wrong answers for one question with the correctness judge."""

    def __init__(self, judge: CorrectnessJudge) -> None:
        self.judge = judge

    def wrong(self, item: QAItem, a_correct: str, candidates: Sequence[str]) -> list[bool]:
        """For each candidate: is it a different answer that the judge marks wrong for ``item``?"""
        if not candidates:
            return []
        verdicts = self.judge.judge(
            list(candidates), [item.answers] * len(candidates), questions=[item.question] * len(candidates)
        )
        return [
            bool(c.strip()) and v == 0 and not _same(c, a_correct) for c, v in zip(candidates, verdicts, strict=True)
        ]

    def best_sample(self, record: Record, a_correct: str, samples: Sequence[Any], annotated: bool) -> str | None:
        """The most likely sampled answer that is wrong (and, when ``annotated``, was annotated wrong)."""
        texts = [stated_answer(s.text, record.item) for s in samples]
        ok = self.wrong(record.item, a_correct, texts)
        if annotated and record.sample_correct is not None:
            ok = [w and c == 0 for w, c in zip(ok, record.sample_correct, strict=True)]
        scored = [(_mean_logprob(s.logprobs), t) for s, t, w in zip(samples, texts, ok, strict=True) if w]
        return max(scored, key=lambda st: st[0])[1] if scored else None


def build_triplets(
    records: Sequence[Record],
    *,
    backend: Backend | None = None,
    judge: str | None = None,
    extra_samples: int = 5,
    extra_rounds: int = 2,
    seed: int = 0,
) -> TripletSet:
    """Triplets from the records whose greedy answer is correct; see the module docstring.

    ``judge`` defaults to the records' own correctness judge (their
    provenance), else ``contains``. Without ``backend`` no extra samples are
    drawn.
    """
    judge_name = judge or _provenance_judge(records)
    finder = _WrongFinder(get_correctness_judge(judge_name, **({"backend": backend} if judge_name == "llm" else {})))
    stats = TripletStats(records=len(records))
    eligible = [r for r in records if r.greedy_correct == 1 and record_answer(r).strip()]
    stats.eligible = len(eligible)
    found: dict[str, tuple[str, str, str]] = {}  # record id → (a_wrong, source, wrong_from)
    for rec in eligible:
        wrong = finder.best_sample(rec, record_answer(rec), rec.samples, annotated=True)
        if wrong is not None:
            found[rec.id] = (wrong, "sample", rec.id)
    missing = [r for r in eligible if r.id not in found]
    if missing and backend is not None and extra_samples > 0:
        _resample(missing, backend, finder, extra_samples, extra_rounds, seed, found)
    for rec in [r for r in eligible if r.id not in found]:
        wrong_from = _other_question(rec, records, finder, seed)
        if wrong_from is not None:
            found[rec.id] = (*wrong_from[:1], "other-question", wrong_from[1])
    triplets = []
    for rec in eligible:
        if rec.id not in found:
            stats.dropped += 1
            continue
        wrong, source, origin = found[rec.id]
        triplets.append(
            Triplet(item=rec.item, a_correct=record_answer(rec), a_wrong=wrong, source=source, wrong_from=origin)
        )
    stats.from_samples = sum(t.source == "sample" for t in triplets)
    stats.from_resamples = sum(t.source == "resample" for t in triplets)
    stats.from_other_questions = sum(t.source == "other-question" for t in triplets)
    logger.info("triplets: %s", stats.as_dict())
    return TripletSet(triplets, stats)


def _provenance_judge(records: Sequence[Record]) -> str:
    for rec in records:
        name = rec.provenance.get("correctness_judge")
        if name:
            return str(name)
    return "contains"


def _template_and_params(record: Record, backend: Backend) -> tuple[QATemplate, SamplingParams]:
    """The prompt template and sampling settings the record was annotated with (§4.1 defaults otherwise)."""
    name = record.provenance.get("template")
    template = TEMPLATES.get(name) if name in TEMPLATES else resolve_template("auto", backend.model_name, backend)
    decoding = (record.provenance.get("decoding") or {}).get("samples") or {}
    keys = ("max_new_tokens", "temperature", "top_p", "top_k")
    params = SamplingParams(
        **{k: decoding[k] for k in keys if k in decoding}, stop=tuple(decoding.get("stop") or template.stop)
    )
    return template, params


def _resample(
    missing: Sequence[Record],
    backend: Backend,
    finder: _WrongFinder,
    n: int,
    rounds: int,
    seed: int,
    found: dict[str, tuple[str, str, str]],
) -> None:
    """Draw ``n`` more samples per record, up to ``rounds`` times, until each has a wrong answer."""
    todo = list(missing)
    for round_ in range(rounds):
        if not todo:
            return
        groups: dict[tuple[str, SamplingParams], list[Record]] = {}
        templates: dict[str, QATemplate] = {}
        for rec in todo:
            template, params = _template_and_params(rec, backend)
            templates[template.name] = template
            groups.setdefault((template.name, params), []).append(rec)
        for (name, params), recs in groups.items():
            prompts = [templates[name](r.item, backend) for r in recs]
            # A label part unlike the annotation's, so these are new samples.
            seeds = [item_seed("triplets", seed, round_, r.id) for r in recs]
            gens = backend.generate(prompts, n, params, greedy=False, seeds=seeds)
            for rec, gen in zip(recs, gens, strict=True):
                wrong = finder.best_sample(rec, record_answer(rec), gen.samples, annotated=False)
                if wrong is not None:
                    found[rec.id] = (wrong, "resample", rec.id)
        todo = [r for r in todo if r.id not in found]
        logger.info("triplets: resampling round %d left %d records without a wrong answer", round_ + 1, len(todo))


def _other_question(
    record: Record, records: Sequence[Record], finder: _WrongFinder, seed: int
) -> tuple[str, str] | None:
    """``(answer, record id)``: an answer to another question of the same dataset, wrong for this one."""
    pool = [r for r in records if r.item.dataset == record.item.dataset and r.id != record.id]
    pool = seeded_shuffle(pool, f"triplets:{seed}:{record.id}")
    candidates: list[tuple[str, str]] = []
    for other in pool:
        for text in [other.greedy.text, *(s.text for s in other.samples)]:
            answer = stated_answer(text, record.item)
            if answer.strip():
                candidates.append((answer, other.id))
        if len(candidates) >= MAX_OTHER_CANDIDATES:
            break
    ok = finder.wrong(record.item, record_answer(record), [c for c, _ in candidates])
    for (answer, origin), good in zip(candidates, ok, strict=True):
        if good:
            return answer, origin
    return None


def write_triplets(path: str | Path, triplets: Sequence[Triplet]) -> None:
    """Write triplets as JSONL, atomically."""
    write_json_lines(path, (t.to_dict() for t in triplets))


def read_triplets(path: str | Path) -> list[Triplet]:
    """Read a triplets JSONL file; a bad line is an error naming it."""
    out = []
    for lineno, obj in iter_json_lines(path):
        try:
            triplet = Triplet.from_dict(obj)
        except (KeyError, TypeError, ValueError) as exc:
            raise at_line(path, lineno, f"not a triplet: missing or bad field {exc}") from None
        if triplet.source not in SOURCES:
            raise at_line(path, lineno, f"unknown triplet source {triplet.source!r}; known: {', '.join(SOURCES)}")
        out.append(triplet)
    return out
