"""HonestyBench-mini for the benchmarks: the data (or a clean skip without it) and its resumable annotation cache."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from benchmarks.common import logger
from candor.annotation.builder import AnnotateConfig, annotate
from candor.annotation.prompts import QATemplate
from candor.annotation.records import Record, read_records
from candor.backends.base import Backend
from candor.data import honestybench_mini, resolve_data_dir
from candor.data.mini import MiniBench
from candor.util.errors import CandorError


def load_mini_or_exit(data_dir: str | None, **sizes: Any) -> MiniBench:
    """HonestyBench-mini, or a clear skip message and exit 0 when the data is absent."""
    try:
        resolve_data_dir(data_dir)
        return honestybench_mini(data_dir, **sizes)
    except CandorError as exc:
        print(f"SKIP: HonestyBench data not available ({exc})", file=sys.stderr)
        raise SystemExit(0) from None


def annotate_part(
    part: dict[str, list],
    part_name: str,
    backend: Backend,
    template: QATemplate,
    config: AnnotateConfig,
    cache: Path,
) -> dict[str, list[Record]]:
    """Annotate every dataset of one mini-bench part into ``cache/<part>/<dataset>.jsonl`` (resumable)."""
    out: dict[str, list[Record]] = {}
    for dataset, items in part.items():
        path = cache / part_name / f"{dataset}.jsonl"
        logger.info("annotate %s/%s: %d items → %s", part_name, dataset, len(items), path)
        annotate(items, backend, path, template, config)
        wanted = {item.id for item in items}
        out[dataset] = [r for r in read_records(path) if r.id in wanted]
    return out
