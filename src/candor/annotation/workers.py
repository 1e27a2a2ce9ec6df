"""Data-parallel annotation on one CPU machine: n worker processes, one shard each, merged into one file.

A decode step of a small model is many small products; torch's threads split
each of them, and every product wakes and waits for every thread. Worker
processes split the questions instead (on the 2-core machine measured in
benchmarks/README.md, two 1-thread processes beat one 2-thread process): each
loads its own copy of the model, runs ``annotate --shard i/n`` on its share
of the cores, and the parent merges the shards into ``out`` in input order
(:func:`candor.annotation.builder.merge_shards`), as a single run writes it.
Seeds are per question, so the records are a single run's (a batch of other
neighbours may round a log-prob differently in the last bits).

The shard files under ``<out>.parts/`` are the run's state: a run that
stopped (killed, a worker's error) resumes them when started again, and the
merge is redone. Memory: one model per worker.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue as queue_module
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from candor.annotation.builder import AnnotateConfig, AnnotateResult, Shard, annotate, check_unique_ids, merge_shards
from candor.annotation.prompts import QATemplate, resolve_template
from candor.backends import load_backend
from candor.backends.base import Backend
from candor.data.items import QAItem
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5
# Writes per worker at least (smaller calls for a small shard), so the parent's progress bar moves.
PROGRESS_STEPS = 8


@dataclass(frozen=True)
class BackendRecipe:
    """How to load the answering model, the judging one and the template: settings a worker can receive."""

    model: str
    backend: str = "hf"
    options: dict[str, Any] = field(default_factory=dict)
    template: str = "auto"
    judge_model: str | None = None
    judge_backend: str | None = None
    judge_options: dict[str, Any] = field(default_factory=dict)

    def load(self) -> tuple[Backend, Backend | None, QATemplate]:
        """The answering backend, the judging one (None: judges use the answering model) and the template."""
        answering = load_backend(self.model, self.backend, **self.options)
        judging = None
        if self.judge_model is not None:
            judging = load_backend(self.judge_model, self.judge_backend or self.backend, **self.judge_options)
        return answering, judging, resolve_template(self.template, self.model, answering)


def parts_folder(out: Path) -> Path:
    """Where a worker run keeps its shard files: ``<out>.parts/`` beside ``out``."""
    return out.with_name(out.name + ".parts")


def part_path(out: Path, shard: Shard) -> Path:
    return parts_folder(out) / f"shard-{shard.index}-of-{shard.count}.jsonl"


def available_cores() -> int:
    """The cores this process may run on (``OMP_NUM_THREADS`` when set: the user's budget for the whole run)."""
    budget = os.environ.get("OMP_NUM_THREADS", "")
    if budget.isdigit() and int(budget) > 0:
        return int(budget)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Each worker's share of the cores, at least one."""
    cores = available_cores() if cores is None else cores
    if workers > cores:
        logger.warning(
            "%d workers on %d cores: they will share cores and run slower than %d would", workers, cores, cores
        )
    return max(1, cores // workers)


def check_workers(workers: int, out: Path) -> None:
    """Refuse what a worker run cannot resume: a bad count, an ``out`` written without workers, other counts."""
    if workers < 2:
        raise CandorError(f"--workers {workers}: a worker run needs at least 2 (1 runs in this process)")
    folder = parts_folder(out)
    if out.exists() and not folder.exists():
        raise CandorError(
            f"{out} exists and was not written by a worker run ({folder} is missing): resume it without "
            "--workers, or choose another --out"
        )
    counts = sorted({p.name.rsplit("-of-", 1)[-1].removesuffix(".jsonl") for p in folder.glob("shard-*-of-*.jsonl")})
    if counts and counts != [str(workers)]:
        raise CandorError(
            f"{folder} holds the shards of a run with --workers {', '.join(counts)}: resume it with that "
            "count, or remove the folder to start again"
        )


def check_cpu_backend(recipe: BackendRecipe) -> None:
    """Workers split a CPU's cores: the hf backend (a server or vLLM batches on its own).

    That the model runs on the CPU is checked by each worker once loaded
    (:func:`refuse_gpu`), so that this process never imports torch.
    """
    if recipe.backend != "hf":
        raise CandorError(
            f"--workers runs the hf backend on CPU in several processes; the {recipe.backend} backend "
            "batches on its own (see --max-concurrency, --data-parallel-size)"
        )


def refuse_gpu(backend: Backend) -> None:
    """Refuse a worker whose model was placed on a GPU (checked once loaded, in the worker)."""
    device = str(getattr(backend, "device", "cpu"))
    if not device.startswith("cpu"):
        raise CandorError(
            f"--workers splits a CPU's cores; this model runs on {device}, where one process "
            "batches better (drop --workers)"
        )


def annotate_with_workers(
    items: Sequence[QAItem],
    recipe: BackendRecipe,
    out: str | Path,
    config: AnnotateConfig,
    workers: int,
    *,
    threads: int | None = None,
    progress: bool = True,
) -> AnnotateResult:
    """Annotate ``items`` into ``out`` with ``workers`` processes of ``threads`` threads each, then merge.

    Raises :class:`CandorError` naming the worker when one fails; the others
    are stopped, and what every worker wrote stays for the next run.
    """
    out = Path(out)
    check_workers(workers, out)
    check_cpu_backend(recipe)
    check_unique_ids(items)
    threads = threads or threads_per_worker(workers)
    shards = [Shard(i, workers) for i in range(workers)]
    parts = [part_path(out, shard) for shard in shards]
    parts_folder(out).mkdir(parents=True, exist_ok=True)
    done_before = sum(RecordCount(p).update() for p in parts)
    logger.info(
        "%s: %d items in %d workers, %d thread(s) each (%d already done)",
        out,
        len(items),
        workers,
        threads,
        done_before,
    )
    written = _run_workers(items, recipe, config, shards, parts, threads, progress, done_before)
    merged = merge_shards(parts, out)
    return AnnotateResult(out, written, merged - written, len(items))


def _run_workers(
    items: Sequence[QAItem],
    recipe: BackendRecipe,
    config: AnnotateConfig,
    shards: list[Shard],
    parts: list[Path],
    threads: int,
    progress: bool,
    done_before: int,
) -> int:
    """Start one process per shard, follow their files for the progress bar, stop them all if one fails."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold torch's threads
    reports = context.Queue()
    processes = [
        context.Process(
            target=_work,
            args=(recipe, items, part, config, shard, threads, reports),
            name=f"candor-annotate-{shard}",
            daemon=True,
        )
        for shard, part in zip(shards, parts, strict=True)
    ]
    bar = tqdm(total=len(items), initial=done_before, desc="annotate", unit="q", disable=not progress)
    counts = [RecordCount(p) for p in parts]
    written: dict[int, int] = {}
    try:
        for process in processes:
            process.start()
        while len(written) < len(processes):
            written.update(_collect(reports, processes, shards))
            bar.update(sum(count.update() for count in counts) - bar.n)
        for process in processes:
            process.join()
    finally:
        _stop(processes)
        bar.close()
    return sum(written.values())


def _collect(reports: Any, processes: list[Any], shards: list[Shard]) -> dict[int, int]:
    """The workers that finished since the last poll (index: records written); raise on one that failed."""
    finished: dict[int, int] = {}
    try:
        while True:
            kind, index, value = reports.get(timeout=POLL_SECONDS)
            if kind == "error":
                raise CandorError(f"worker {index} (shard {shards[index]}): {value}")
            finished[index] = value
    except queue_module.Empty:
        pass
    for index, process in enumerate(processes):
        if index not in finished and process.exitcode not in (None, 0) and reports.empty():
            raise CandorError(
                f"worker {index} (shard {shards[index]}) died with exit code {process.exitcode}"
                f"{' (killed: out of memory?)' if process.exitcode < 0 else ''}"
            )
    return finished


def _stop(processes: list[Any]) -> None:
    """Terminate workers still running (records are appended whole, so their files resume), then reap them."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        if process.pid is not None:
            process.join(timeout=30)


class RecordCount:
    """Whole records appended to a worker's file so far, reading only the bytes added since the last look."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.lines = path, 0, 0

    def update(self) -> int:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                added = f.read()
        except FileNotFoundError:
            return self.lines
        self.offset += len(added)
        self.lines += added.count(b"\n")
        return self.lines


def _work(
    recipe: BackendRecipe,
    items: Sequence[QAItem],
    part: Path,
    config: AnnotateConfig,
    shard: Shard,
    threads: int,
    reports: Any,
) -> None:
    """One worker: its share of the threads, its own model, ``annotate`` of one shard; the outcome reported."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format=f"%(levelname)s worker {shard.index}: %(name)s: %(message)s"
    )
    try:
        import torch

        torch.set_num_threads(threads)
        answering, judging, template = recipe.load()
        refuse_gpu(answering)
        result = annotate(
            items,
            answering,
            part,
            template,
            config,
            shard=shard,
            judge_backend=judging,
            progress=False,
            progress_steps=PROGRESS_STEPS,
        )
    except CandorError as exc:
        reports.put(("error", shard.index, str(exc)))  # a process's queue is flushed before it exits
        sys.exit(2)
    except BaseException as exc:
        reports.put(("error", shard.index, f"{type(exc).__name__}: {exc}"))
        raise
    reports.put(("done", shard.index, result.written))
