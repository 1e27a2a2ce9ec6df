"""The HonestyBench builder: QA items in, records JSONL out (DESIGN.md §4.1).

For every item: a greedy answer and ``k`` samples with token log-probs, the
correctness of each (against the gold aliases) and the consistency of each
sample with the greedy answer.

Resumable by construction: records are appended a batch at a time with an
fsync, finished ids are skipped on a rerun, and a line cut by ``kill -9`` is
dropped on reopen. ``shard="i/n"`` takes the i-th of n contiguous slices, and
:func:`merge_shards` puts the shard files back together in input order.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

import candor
from candor.backends.base import Backend, Generations, SamplingParams
from candor.data.items import QAItem
from candor.errors import CandorError
from candor.judges import get_consistency_judge, get_correctness_judge
from candor.prompts import QATemplate
from candor.records import Record, RecordAppender, read_records, truncate_partial_last_line, write_records

logger = logging.getLogger(__name__)

# Questions handed to one generate call, in batches: the backend refills its running
# batch from the next questions as answers finish (~1.3x faster than one batch per call).
CALL_BATCHES = 4

# Provenance keys that must agree for records to live in one file.
SETTINGS_KEYS = ("model", "template", "k", "seed", "decoding", "correctness_judge", "consistency_judge")


@dataclass(frozen=True)
class Shard:
    """The ``index``-th of ``count`` contiguous slices of the input (0-based)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            index, count = (int(x) for x in text.split("/"))
        except ValueError:
            raise CandorError(f"--shard {text!r}: expected i/n, e.g. 0/4") from None
        if count < 1 or not 0 <= index < count:
            raise CandorError(f"--shard {text!r}: need 0 <= i < n")
        return cls(index, count)

    def select(self, items: Sequence[QAItem]) -> list[QAItem]:
        n = len(items)
        return list(items[self.index * n // self.count : (self.index + 1) * n // self.count])

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass
class AnnotateConfig:
    """Everything that decides what a record contains."""

    k: int = 5
    params: SamplingParams = field(default_factory=SamplingParams)
    correctness_judge: str = "contains"
    consistency_judge: str = "lexical"
    seed: int = 0
    batch_size: int = 16

    def __post_init__(self) -> None:
        if self.k < 0:
            raise CandorError(f"k must be >= 0, got {self.k}")
        if self.batch_size < 1:
            raise CandorError(f"batch size must be >= 1, got {self.batch_size}")


@dataclass
class AnnotateResult:
    path: Path
    written: int
    skipped: int
    total: int


def item_seed(seed: int, item_id: str) -> int:
    """A per-item seed, so an item's samples do not depend on its batch or shard."""
    digest = hashlib.sha256(f"{seed}:{item_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def check_unique_ids(items: Sequence[QAItem]) -> None:
    seen: set[str] = set()
    for item in items:
        if item.id in seen:
            raise CandorError(f"item id {item.id!r} appears twice in the input; ids must be unique")
        seen.add(item.id)


def _judge_provenance(judges: tuple) -> dict[str, Any]:
    """What the judges are (an llm judge names its model and prompt style)."""
    correctness, consistency = judges
    return {"correctness": correctness.describe(), "consistency": consistency.describe()}


def _parse_counts(gens: Sequence[Generations], judges: tuple) -> list[dict[str, int] | None]:
    """Per record: llm-judge replies asked and replies that stated no verdict (None without llm judges).

    The parse-failure rate of a file is the sum of ``unparsed`` over the sum of ``asked``.
    """
    sizes = [(1 + len(g.samples), len(g.samples)) for g in gens]
    flags = []
    for j, judge in enumerate(judges):
        asked = getattr(judge, "last_asked", None)
        # A judge not called for this batch (no samples) still holds an older call's flags: skip it.
        fresh = asked is not None and len(asked) == sum(size[j] for size in sizes)
        flags.append((asked, getattr(judge, "last_unparsed", None)) if fresh else (None, None))
    if all(asked is None for asked, _ in flags):
        return [None] * len(gens)
    out: list[dict[str, int] | None] = []
    starts = [0, 0]
    for size in sizes:
        asked = unparsed = 0
        for j, (a, u) in enumerate(flags):
            if a:
                window = slice(starts[j], starts[j] + size[j])
                asked += sum(a[window])
                unparsed += sum(u[window])  # type: ignore[index]
            starts[j] += size[j]
        out.append({"asked": asked, "unparsed": unparsed})
    return out


def _provenance(backend: Backend, template: QATemplate, config: AnnotateConfig, shard: Shard | None) -> dict:
    params = config.params
    stop = tuple(dict.fromkeys((*params.stop, *template.stop)))
    decoding = {"greedy": {"temperature": 0.0}, "samples": {**params.to_dict(), "stop": list(stop)}}
    return {
        "model": backend.model_name,
        "template": template.name,
        "k": config.k,
        "seed": config.seed,
        "decoding": decoding,
        "correctness_judge": config.correctness_judge,
        "consistency_judge": config.consistency_judge,
        "candor_version": candor.__version__,
        "shard": str(shard) if shard else None,
    }


def _settings(provenance: dict[str, Any]) -> dict[str, Any]:
    return {key: provenance.get(key) for key in SETTINGS_KEYS}


def _finished_ids(path: Path, expected: dict[str, Any]) -> set[str]:
    """Ids already in ``path``; refuses a file made with other settings."""
    if not path.exists():
        return set()
    truncate_partial_last_line(path)
    done = read_records(path)
    for rec in done:
        found = _settings(rec.provenance)
        if found != _settings(expected):
            diff = {k: (found[k], expected[k]) for k in SETTINGS_KEYS if found[k] != expected.get(k)}
            raise CandorError(
                f"{path} holds records made with other settings {diff} (found, requested); "
                "use another --out or delete the file"
            )
    return {rec.id for rec in done}


def _judge_batch(
    items: Sequence[QAItem], gens: Sequence[Generations], config: AnnotateConfig, judges: tuple
) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """Correctness of greedy and samples, and sample-vs-greedy consistency, in three batched calls."""
    correctness, consistency = judges
    k = config.k
    responses, golds, questions = [], [], []
    for item, gen in zip(items, gens, strict=True):
        for comp in [gen.greedy, *gen.samples]:
            responses.append(comp.text)
            golds.append(item.answers)
            questions.append(item.question)
    verdicts = correctness.judge(responses, golds, questions=questions)
    greedy_correct = [verdicts[i * (k + 1)] for i in range(len(items))]
    sample_correct = [verdicts[i * (k + 1) + 1 : (i + 1) * (k + 1)] for i in range(len(items))]
    left = [gen.greedy.text for gen in gens for _ in gen.samples]
    right = [s.text for gen in gens for s in gen.samples]
    sample_questions = [item.question for item, gen in zip(items, gens, strict=True) for _ in gen.samples]
    flat = consistency.judge(right, left, questions=sample_questions) if right else []
    consistent = [flat[i * k : (i + 1) * k] for i in range(len(items))]
    return greedy_correct, sample_correct, consistent


def make_judges(config: AnnotateConfig, judge_backend: Backend | None = None) -> tuple:
    kwargs = {"backend": judge_backend} if judge_backend is not None else {}
    correctness_kwargs = kwargs if config.correctness_judge == "llm" else {}
    consistency_kwargs = kwargs if config.consistency_judge == "llm" else {}
    return (
        get_correctness_judge(config.correctness_judge, **correctness_kwargs),
        get_consistency_judge(config.consistency_judge, **consistency_kwargs),
    )


def annotate(
    items: Sequence[QAItem],
    backend: Backend,
    out: str | Path,
    template: QATemplate,
    config: AnnotateConfig | None = None,
    *,
    shard: Shard | None = None,
    judge_backend: Backend | None = None,
    progress: bool = True,
) -> AnnotateResult:
    """Annotate ``items`` into ``out``, skipping ids already there (resume)."""
    config = config or AnnotateConfig()
    out = Path(out)
    check_unique_ids(items)
    if shard is not None:
        items = shard.select(items)
    provenance = _provenance(backend, template, config, shard)
    done = _finished_ids(out, provenance)
    todo = [item for item in items if item.id not in done]
    judges = make_judges(config, judge_backend or backend)
    if "llm" in (config.correctness_judge, config.consistency_judge):
        provenance = {**provenance, "judges": _judge_provenance(judges)}
    params = SamplingParams(**{**config.params.to_dict(), "stop": tuple(provenance["decoding"]["samples"]["stop"])})
    logger.info("%s: %d items, %d already done, %d to annotate", out, len(items), len(items) - len(todo), len(todo))

    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc="annotate", unit="q", disable=not progress)
    written = 0
    with RecordAppender(out) as sink:
        step = config.batch_size * CALL_BATCHES
        for start in range(0, len(todo), step):
            batch = todo[start : start + step]
            prompts = [template(item, backend) for item in batch]
            seeds = [item_seed(config.seed, item.id) for item in batch]
            gens = backend.generate(prompts, config.k, params, greedy=True, seeds=seeds)
            greedy_correct, sample_correct, consistent = _judge_batch(batch, gens, config, judges)
            parsed = _parse_counts(gens, judges)
            records = [
                Record(item, gen.greedy, gen.samples, gc, sc, cs,
                       provenance if counts is None else {**provenance, "judge_parse": counts})
                for item, gen, gc, sc, cs, counts in zip(
                    batch, gens, greedy_correct, sample_correct, consistent, parsed, strict=True
                )
            ]
            sink.append(records)
            written += len(records)
            bar.update(len(batch))
    bar.close()
    return AnnotateResult(out, written, len(items) - len(todo), len(items))


def merge_shards(paths: Sequence[str | Path], out: str | Path) -> int:
    """Merge shard files into one, in input order; refuses mixed settings or duplicate ids."""
    if not paths:
        raise CandorError("merge: no input files")
    loaded = []
    for path in paths:
        records = read_records(path)
        if not records:
            raise CandorError(f"{path}: no records")
        loaded.append((path, records))
    reference_path, reference = loaded[0][0], _settings(loaded[0][1][0].provenance)
    for path, records in loaded:
        if _settings(records[0].provenance) != reference:
            raise CandorError(f"{path} was made with other settings than {reference_path}; cannot merge")
    loaded.sort(key=lambda pr: _shard_index(pr[1][0].provenance))
    merged: list[Record] = []
    seen: set[str] = set()
    for path, records in loaded:
        for rec in records:
            if rec.id in seen:
                raise CandorError(f"{path}: id {rec.id!r} is already in another shard")
            seen.add(rec.id)
            rec.provenance = {**rec.provenance, "shard": None}
            merged.append(rec)
    write_records(out, merged)
    return len(merged)


def _shard_index(provenance: dict[str, Any]) -> int:
    shard = provenance.get("shard")
    return Shard.parse(shard).index if shard else 0
