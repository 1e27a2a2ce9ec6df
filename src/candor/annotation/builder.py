"""The HonestyBench builder: QA items in, records JSONL out (docs/methods.md "Generation and judging").

For every item: a greedy answer and ``k`` samples with token log-probs, the
correctness of each (against the gold aliases) and the consistency of each
sample with the greedy answer.

Resumable by construction: records are appended a batch at a time with an
fsync, finished ids are skipped on a rerun (after checking that each still
holds the same question and answers), and a line cut by ``kill -9`` is
dropped on reopen. ``shard="i/n"`` takes the i-th of n contiguous slices, and
:func:`merge_shards` puts the shard files back together in input order,
refusing a set with a shard or an item missing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from candor.annotation.judges import (
    CONSISTENCY_JUDGES,
    CORRECTNESS_JUDGES,
    DEFAULT_CONSISTENCY_JUDGE,
    get_consistency_judge,
    get_correctness_judge,
    judge_consistency,
)
from candor.annotation.prompts import QATemplate
from candor.annotation.records import Record, RecordAppender, read_records, truncate_partial_last_line, write_records
from candor.backends.base import Backend, Generations, SamplingParams, applied_params
from candor.data.items import QAItem, QAItems
from candor.util.errors import CandorError
from candor.util.seeds import item_seed
from candor.util.version import __version__

logger = logging.getLogger(__name__)

# Questions handed to one generate call, in batches: the backend refills its running
# batch from the next questions as answers finish (~1.3x faster than one batch per call).
CALL_BATCHES = 4


def questions_per_call(todo: int, batch_size: int, progress_steps: int | None = None) -> int:
    """Questions per generate call: ``CALL_BATCHES`` batches, or fewer so the run shows ``progress_steps`` steps.

    Records are written (and progress seen) once per call: a 100-question shard of ``--workers`` took two
    calls, so its progress jumped from 0 to the end. Never below one batch, so large runs are unchanged.
    """
    full = batch_size * CALL_BATCHES
    if progress_steps is None:
        return full
    return max(batch_size, min(full, -(-todo // progress_steps)))


# Provenance keys that must agree for records to live in one file.
SETTINGS_KEYS = ("model", "dtype", "template", "k", "seed", "decoding", "correctness_judge", "consistency_judge")
# What a record written before a key existed was made with: records without a dtype come from
# candor versions that annotated in the hf backend's CPU default, float32.
LEGACY_SETTINGS = {"dtype": "float32"}


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

    def bounds(self, n: int) -> tuple[int, int]:
        """The ``[start, end)`` positions of this shard in an input of ``n`` items."""
        return self.index * n // self.count, (self.index + 1) * n // self.count

    def select(self, items: Sequence[QAItem]) -> list[QAItem]:
        start, end = self.bounds(len(items))
        return list(items[start:end])

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass
class AnnotateConfig:
    """Everything that decides what a record contains."""

    k: int = 5
    params: SamplingParams = field(default_factory=SamplingParams)
    correctness_judge: str = "contains"
    consistency_judge: str = DEFAULT_CONSISTENCY_JUDGE
    seed: int = 0
    batch_size: int = 16

    def __post_init__(self) -> None:
        if self.k < 0:
            raise CandorError(f"k must be >= 0, got {self.k}")
        if self.batch_size < 1:
            raise CandorError(f"batch size must be >= 1, got {self.batch_size}")
        # Unknown judge names fail here, before a model is loaded.
        CORRECTNESS_JUDGES.get(self.correctness_judge)
        CONSISTENCY_JUDGES.get(self.consistency_judge)


@dataclass
class AnnotateResult:
    path: Path
    written: int
    skipped: int
    total: int


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


def _provenance(
    backend: Backend, template: QATemplate, config: AnnotateConfig, shard: Shard | None, items: Sequence[QAItem]
) -> dict:
    """What made the records.

    A shard also records ``input_items``, the size of the input it is a slice
    of, so :func:`merge_shards` can tell a missing or unfinished shard.
    ``skipped_items`` counts the input rows the loader skipped as unjudgeable.
    """
    params = config.params
    stop = tuple(dict.fromkeys((*params.stop, *template.stop)))
    # What the engine applies: a setting it refused is recorded as dropped, with the value asked for.
    applied = applied_params(backend, params).to_dict()
    samples: dict[str, Any] = {**applied, "stop": list(stop)}
    dropped = {key: value for key, value in params.to_dict().items() if key != "stop" and applied[key] != value}
    if dropped:
        samples["dropped"] = dropped
    decoding = {"greedy": {"temperature": 0.0}, "samples": samples}
    return {
        "model": backend.model_name,
        "dtype": getattr(backend, "dtype", None),  # the weights' dtype where the engine says (hf)
        "template": template.name,
        "k": config.k,
        "seed": config.seed,
        "decoding": decoding,
        "correctness_judge": config.correctness_judge,
        "consistency_judge": config.consistency_judge,
        "candor_version": __version__,
        "shard": str(shard) if shard else None,
        "input_items": len(items) if shard else None,
        "skipped_items": items.skipped if isinstance(items, QAItems) else 0,
    }


def _settings(provenance: dict[str, Any]) -> dict[str, Any]:
    return {key: provenance.get(key, LEGACY_SETTINGS.get(key)) for key in SETTINGS_KEYS}


def finished_ids(path: Path, expected: dict[str, Any], items: Sequence[QAItem]) -> set[str]:
    """Ids already in ``path``; refuses a file made with other settings or for other questions."""
    if not path.exists():
        return set()
    truncate_partial_last_line(path)
    done = read_records(path)
    by_id = {item.id: item for item in items}
    for rec in done:
        found, wanted = _settings(rec.provenance), _settings(expected)
        if found != wanted:
            diff = {k: (found[k], wanted[k]) for k in SETTINGS_KEYS if found[k] != wanted[k]}
            raise CandorError(
                f"{path} holds records made with other settings {diff} (found, requested); "
                "use another --out or delete the file"
            )
        if rec.id in by_id:
            _check_same_item(path, rec.item, by_id[rec.id])
    return {rec.id for rec in done}


def _check_same_item(path: Path, done: QAItem, given: QAItem) -> None:
    """Ids of a plain file are line numbers: an edited or reordered input must not reuse old records."""
    fields = ("question", "answers", "choices", "context")
    changed = [f for f in fields if getattr(done, f) != getattr(given, f)]
    if changed:
        raise CandorError(
            f"{path}: the record for id {given.id!r} was made for question {done.question!r} "
            f"(answers {list(done.answers)}), but the input now has question {given.question!r} "
            f"(answers {list(given.answers)}) under that id; the input changed ({', '.join(changed)}): "
            "use another --out or delete the file"
        )


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
    consistent = judge_consistency(
        consistency,
        [gen.greedy.text for gen in gens],
        [[s.text for s in gen.samples] for gen in gens],
        [item.question for item in items],
    )
    return greedy_correct, sample_correct, consistent


def make_judges(config: AnnotateConfig, judge_backend: Backend | None = None) -> tuple:
    kwargs = {"backend": judge_backend} if judge_backend is not None else {}
    correctness_kwargs = kwargs if config.correctness_judge == "llm" else {}
    consistency_kwargs = kwargs if config.consistency_judge == "llm" else {}
    return (
        get_correctness_judge(config.correctness_judge, **correctness_kwargs),
        get_consistency_judge(config.consistency_judge, **consistency_kwargs),
    )


def run_provenance(
    backend: Backend,
    template: QATemplate,
    config: AnnotateConfig,
    shard: Shard | None,
    items: Sequence[QAItem],
    judges: tuple,
) -> dict[str, Any]:
    """The provenance every record of a run carries (the llm judges described where they are used)."""
    provenance = _provenance(backend, template, config, shard, items)
    if "llm" in (config.correctness_judge, config.consistency_judge):
        provenance = {**provenance, "judges": _judge_provenance(judges)}
    return provenance


def sampling_params(config: AnnotateConfig, provenance: dict[str, Any]) -> SamplingParams:
    """The samples' decoding, with the template's stop strings joined to the user's (as the provenance says)."""
    return SamplingParams(**{**config.params.to_dict(), "stop": tuple(provenance["decoding"]["samples"]["stop"])})


def generate_batch(
    batch: Sequence[QAItem], backend: Backend, template: QATemplate, config: AnnotateConfig, params: SamplingParams
) -> list[Generations]:
    """The greedy answer and ``config.k`` samples of each item, seeded per item (so never by its batch)."""
    prompts, seeds = render_prompts(batch, backend, template, config)
    return backend.generate(prompts, config.k, params, greedy=True, seeds=seeds)


def render_prompts(
    batch: Sequence[QAItem], renderer: Any, template: QATemplate, config: AnnotateConfig
) -> tuple[list[str], list[int]]:
    """Each item's prompt (``renderer`` gives the chat template: a backend) and its sampling seed."""
    return [template(item, renderer) for item in batch], [item_seed(config.seed, item.id) for item in batch]


def judge_records(
    batch: Sequence[QAItem],
    gens: Sequence[Generations],
    config: AnnotateConfig,
    judges: tuple,
    provenance: dict[str, Any],
) -> list[Record]:
    """The records of one generated batch: judged, with the llm judges' parse counts in the provenance."""
    greedy_correct, sample_correct, consistent = _judge_batch(batch, gens, config, judges)
    parsed = _parse_counts(gens, judges)
    return [
        Record(
            item=item,
            greedy=gen.greedy,
            samples=gen.samples,
            greedy_correct=gc,
            sample_correct=sc,
            consistency=cs,
            provenance=provenance if counts is None else {**provenance, "judge_parse": counts},
        )
        for item, gen, gc, sc, cs, counts in zip(
            batch, gens, greedy_correct, sample_correct, consistent, parsed, strict=True
        )
    ]


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
    progress_steps: int | None = None,
) -> AnnotateResult:
    """Annotate ``items`` into ``out``, skipping ids already there (resume).

    ``progress_steps`` asks for at least that many writes (see :func:`questions_per_call`).
    """
    config = config or AnnotateConfig()
    out = Path(out)
    check_unique_ids(items)
    judges = make_judges(config, judge_backend or backend)
    provenance = run_provenance(backend, template, config, shard, items, judges)
    done = finished_ids(out, provenance, items)
    if shard is not None:
        items = shard.select(items)
    todo = [item for item in items if item.id not in done]
    params = sampling_params(config, provenance)
    logger.info("%s: %d items, %d already done, %d to annotate", out, len(items), len(items) - len(todo), len(todo))

    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc="annotate", unit="q", disable=not progress)
    written = 0
    with RecordAppender(out) as sink:
        step = questions_per_call(len(todo), config.batch_size, progress_steps)
        for start in range(0, len(todo), step):
            batch = todo[start : start + step]
            gens = generate_batch(batch, backend, template, config, params)
            records = judge_records(batch, gens, config, judges, provenance)
            sink.append(records)
            written += len(records)
            bar.update(len(batch))
    bar.close()
    return AnnotateResult(out, written, len(items) - len(todo), len(items))


def merge_shards(paths: Sequence[str | Path], out: str | Path) -> int:
    """Merge the shard files of one ``annotate --shard i/n`` run into ``out``, in input order.

    Refuses, writing nothing: files made with other settings, a file that is
    not a shard, shards of different n or of different inputs, a shard given
    twice, a missing shard, a shard that holds fewer items than its slice
    (a run that did not finish), and an id in two shards.
    """
    if not paths:
        raise CandorError("merge: no input files")
    shards = [_read_shard(Path(p)) for p in paths]
    present = [s for s in shards if s.records]
    if not present:
        raise CandorError(f"merge: no records in {', '.join(str(p) for p in paths)}")
    first = present[0]
    for part in present:
        if _settings(part.provenance) != _settings(first.provenance):
            raise CandorError(f"{part.path} was made with other settings than {first.path}; cannot merge")
        if part.shard.count != first.shard.count or part.input_items != first.input_items:
            raise CandorError(
                f"{part.path} is shard {part.shard} of {part.input_items} input items, "
                f"{first.path} shard {first.shard} of {first.input_items}: not parts of one run"
            )
    _check_coverage(present, first.shard.count, first.input_items)
    merged: list[Record] = []
    owner: dict[str, Path] = {}
    for part in sorted(present, key=lambda s: s.shard.index):
        for rec in part.records:
            if rec.id in owner:
                raise CandorError(f"merge: id {rec.id!r} is in both {owner[rec.id]} and {part.path}")
            owner[rec.id] = part.path
            rec.provenance = {**rec.provenance, "shard": None, "input_items": None}  # as a single run writes it
            merged.append(rec)
    write_records(out, merged)
    return len(merged)


@dataclass
class _ShardFile:
    path: Path
    records: list[Record]
    shard: Shard
    input_items: int | None
    provenance: dict[str, Any]


def _read_shard(path: Path) -> _ShardFile:
    """A shard file and which shard it is, read from its records' provenance."""
    records = read_records(path)
    if not records:  # a shard of an input smaller than n can be empty; coverage decides
        return _ShardFile(path=path, records=[], shard=Shard(0, 1), input_items=None, provenance={})
    provenance = records[0].provenance
    names = {rec.provenance.get("shard") for rec in records}
    if len(names) != 1 or not provenance.get("shard"):
        found = ", ".join(sorted(str(n) for n in names))
        raise CandorError(f"{path}: not one shard of `annotate --shard i/n` (shard in provenance: {found})")
    sizes = {rec.provenance.get("input_items") for rec in records}
    if len(sizes) != 1:
        raise CandorError(f"{path}: records made from inputs of different sizes {sorted(map(str, sizes))}")
    return _ShardFile(
        path=path,
        records=records,
        shard=Shard.parse(provenance["shard"]),
        input_items=provenance.get("input_items"),
        provenance=provenance,
    )


def _check_coverage(parts: Sequence[_ShardFile], count: int, input_items: int | None) -> None:
    """Every shard once, each complete. Records from before ``input_items`` was kept skip the size check."""
    by_index: dict[int, _ShardFile] = {}
    for part in parts:
        if part.shard.index in by_index:
            raise CandorError(f"merge: shard {part.shard} given twice ({by_index[part.shard.index].path}, {part.path})")
        by_index[part.shard.index] = part
    given = ", ".join(str(by_index[i].shard) for i in sorted(by_index))
    for index in range(count):
        shard = Shard(index, count)
        start, end = shard.bounds(input_items) if input_items is not None else (0, 1)
        part = by_index.get(index)
        if part is None and end > start:
            raise CandorError(
                f"merge: shard {shard} is missing (given: {given}); "
                f"run `candor annotate --shard {shard}` and merge again"
            )
        if part is not None and input_items is not None and len(part.records) != end - start:
            raise CandorError(
                f"merge: {part.path} (shard {shard}) holds {len(part.records)} of its {end - start} items; "
                f"rerun `candor annotate --shard {shard}` to finish it (it resumes)"
            )
