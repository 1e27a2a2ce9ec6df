"""The compound-question benchmark's inputs and generations (benchmarks/claims.py's first phase).

A compound prompt asks 2-4 questions at once ("Answer each question in one short
sentence. 1. … 2. …", candor's ``compound`` template, one worked example in the
conversation). Each prompt draws its questions from one domain: the starter set or one of
HonestyBench-mini's in-domain test sets (nq, hq, 2wikimultihopqa, pararel), so a
trained claim head can be scored leave-one-domain-out. The same questions are also asked
alone (``fewshot`` template) for the answer-level comparison.

Generation is resumable: records are appended batch by batch to
``benchmarks/cache/claims/{compound,alone}.jsonl`` and ids already there are skipped.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import CACHE
from benchmarks.mini import load_mini_or_exit
from candor.annotation.builder import AnnotateConfig, annotate
from candor.annotation.prompts import TEMPLATES, numbered
from candor.annotation.records import Record, RecordAppender, read_records
from candor.backends.base import Backend, SamplingParams
from candor.data.items import QAItem
from candor.data.splits import seeded_shuffle
from candor.data.starter import load_starter

logger = logging.getLogger("benchmarks.claims")

CLAIMS_CACHE = CACHE / "claims"
# The cached generations can be copied out as gzip files (a folder outside the repository: they hold
# the benchmark's questions) and restored on another machine, which then resumes where this one stopped
# instead of starting over: the generation takes hours on 2 CPU cores.
GENERATIONS = ("compound.jsonl", "alone.jsonl")
SIZES = (2, 3, 4)  # questions per prompt, cycled
TOKENS_PER_QUESTION = 24  # the answer's token cap: this many per question asked
SOURCES = ("starter", "nq", "hq", "2wikimultihopqa", "pararel")
MINI_TEST_SIZE = (
    400  # questions drawn per HonestyBench-mini domain (a seeded head: the first 200 are the usual test set)
)


def source_questions(source: str, data_dir: str | None) -> list[QAItem]:
    """The questions a domain offers, in a seeded order."""
    if source == "starter":
        return seeded_shuffle(load_starter(), "claims:starter")
    mini = load_mini_or_exit(data_dir, test_size=MINI_TEST_SIZE, train_pool=0)
    return seeded_shuffle(list(mini.test_id[source]), f"claims:{source}")


def compound_items(source: str, questions: Sequence[QAItem], prompts: int) -> list[QAItem]:
    """``prompts`` compound items from ``questions`` (each question used once), 2-4 per prompt."""
    out: list[QAItem] = []
    at = 0
    for p in range(prompts):
        size = SIZES[p % len(SIZES)]
        parts = list(questions[at : at + size])
        if len(parts) < size:
            break
        at += size
        out.append(
            QAItem(
                id=f"compound:{source}:{p:04d}",
                dataset=f"compound-{source}",
                split="test",
                question=numbered([q.question for q in parts]),
                answers=(),
                meta={"parts": [{"id": q.id, "question": q.question, "answers": list(q.answers)} for q in parts]},
            )
        )
    return out


def interleaved(groups: Sequence[Sequence[QAItem]]) -> list[QAItem]:
    """One item of each group in turn, so a partial run covers every source alike."""
    out: list[QAItem] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def save_snapshot(snapshot: Path, cache: Path = CLAIMS_CACHE) -> list[Path]:
    """The cached generations, gzipped into ``snapshot`` (byte-identical for the same lines: no timestamp)."""
    snapshot.mkdir(parents=True, exist_ok=True)
    written = []
    for name in GENERATIONS:
        source = cache / name
        if not source.exists():
            continue
        target = snapshot / f"{name}.gz"
        tmp = target.with_suffix(".gz.tmp")
        with source.open("rb") as raw, tmp.open("wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
            data = raw.read()
            gz.write(data[: data.rfind(b"\n") + 1])  # whole lines only: a generation may be appending now
        tmp.replace(target)
        written.append(target)
    return written


def restore_snapshot(snapshot: Path, cache: Path = CLAIMS_CACHE) -> int:
    """Append to the cache the snapshot's generations it lacks (by record id); how many lines were added."""
    added = 0
    for name in GENERATIONS:
        source = snapshot / f"{name}.gz"
        if not source.exists():
            continue
        target = cache / name
        have = {r.id for r in read_records(target)} if target.exists() else set()
        with gzip.open(source, "rt", encoding="utf-8") as lines:
            missing = [line for line in lines if line.strip() and Record.from_dict(json.loads(line)).id not in have]
        if missing:
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a", encoding="utf-8") as out:
                out.writelines(line if line.endswith("\n") else line + "\n" for line in missing)
            added += len(missing)
    return added


def generate_compound(
    items: Sequence[QAItem], backend: Backend, k: int, batch_size: int, path: Path = CLAIMS_CACHE / "compound.jsonl"
) -> list[Record]:
    """Greedy answer (with top-k log-probs) and ``k`` samples per compound item, appended per batch."""
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {r.id for r in read_records(path)} if path.exists() else set()
    todo = [item for item in items if item.id not in done]
    logger.info("compound: %d of %d items to generate", len(todo), len(items))
    with RecordAppender(path) as sink:
        for start in range(0, len(todo), batch_size):
            append_batch(todo[start : start + batch_size], backend, k, sink)
            logger.info("compound: %d/%d", min(start + batch_size, len(todo)), len(todo))
    wanted = {item.id for item in items}
    return [r for r in read_records(path) if r.id in wanted]


def append_batch(batch: Sequence[QAItem], backend: Backend, k: int, sink: RecordAppender) -> None:
    """One batch generated (grouped by question count, which sets the token cap) and appended."""
    template = TEMPLATES.get("compound")
    by_size: dict[int, list[QAItem]] = {}
    for item in batch:
        by_size.setdefault(len(item.meta["parts"]), []).append(item)
    rows = []
    for size, group in by_size.items():
        params = SamplingParams(max_new_tokens=TOKENS_PER_QUESTION * size)
        prompts = [template(item, backend) for item in group]
        seeds = [int(item.id.rsplit(":", 1)[1]) for item in group]
        gens = backend.generate(prompts, k, params, greedy=True, seeds=seeds)
        for item, gen in zip(group, gens, strict=True):
            assert gen.greedy is not None
            provenance = {"model": backend.model_name, "template": "compound", "decoding": params.to_dict(), "k": k}
            rows.append(Record(item=item, greedy=gen.greedy, samples=gen.samples, provenance=provenance))
    sink.append(rows)


def generate_alone(
    items: Sequence[QAItem], backend: Backend, k: int, batch_size: int, path: Path = CLAIMS_CACHE / "alone.jsonl"
) -> list[Record]:
    """Every part of every compound item asked alone (``fewshot``), annotated as HonestyBench-mini is."""
    parts = [
        QAItem(id=p["id"], dataset=item.dataset, split="test", question=p["question"], answers=tuple(p["answers"]))
        for item in items
        for p in item.meta["parts"]
    ]
    config = AnnotateConfig(k=k, params=SamplingParams(max_new_tokens=32), batch_size=batch_size)
    annotate(parts, backend, path, TEMPLATES.get("fewshot"), config, progress=False)
    wanted = {p.id for p in parts}
    return [r for r in read_records(path) if r.id in wanted]
