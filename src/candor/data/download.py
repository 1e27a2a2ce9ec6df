"""Fetching the named datasets from their public sources into the data dir (``candor datasets --download``).

Two sources (:data:`SOURCES`), each a base URL and the files under it:

- ``elical-qa``: the QA files of HonestyBench, in the ``data/`` folder of the
  EliCal authors' repository (Ni et al., 2025), laid out as candor's data dir
  is (``nq/test.jsonl``, ``squad/dev.jsonl``, ...);
- ``logiqa2``: the LogiQA 2.0 test set from its authors' repository
  (``logiqa/DATA/LOGIQA/test.txt``, one JSON object per line), saved as
  ``logiqa2/test.jsonl``.

A base URL is ``https://``, ``http://`` or ``file://``; each source's
environment variable (``CANDOR_ELICAL_QA_URL``, ``CANDOR_LOGIQA2_URL``) or the
``sources`` argument points it at a mirror. A file is written atomically and
then read back with the dataset's own loader, so a page that is not the
dataset (an error page, a moved file) is removed and reported, not kept.
Files already present are left alone.

The annotated HonestyBench (the paper's released records, per model) is a
different thing: records, not QA items. :data:`ANNOTATED_HONESTYBENCH` says
where it is; ``candor import`` reads its files.
"""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from candor.data.datasets import DATA_DIR_ENV, DATASETS, DatasetSpec, dataset_names, default_data_dir
from candor.data.loaders import load_items
from candor.util.errors import CandorError
from candor.util.files import atomic_target
from candor.util.registry import Registry

logger = logging.getLogger(__name__)

ANNOTATED_HONESTYBENCH = (
    "annotated HonestyBench (the paper's records per model, greedy + 20 samples, judged): "
    "https://huggingface.co/datasets/Shiyunee/HonestyBench, in the authors' Hugging Face collection; "
    "read a file with `candor import FILE --out records.jsonl`"
)
TIMEOUT_S = 60


@dataclass(frozen=True)
class Source:
    """A public place holding dataset files: a base URL, and for each remote file the data-dir path it becomes."""

    name: str
    description: str
    base_url: str
    env: str  # the environment variable that replaces ``base_url`` (a mirror)
    files: Mapping[str, str]  # data-dir path → path under the base URL

    def url(self, local: str, base: str | None = None) -> str:
        base = (base or os.environ.get(self.env) or self.base_url).rstrip("/")
        return f"{base}/{self.files[local]}"


SOURCES: Registry[Source] = Registry("dataset source")

_ELICAL_QA_FILES = (
    "nq/test.jsonl",
    "hq/dev.jsonl",
    "2wikimultihopqa/dev.jsonl",
    "pararel_patterns/test.jsonl",
    "squad/dev.jsonl",
    "musique/dev.jsonl",
    "musique/train.jsonl",
)
SOURCES.register("elical-qa")(
    Source(
        name="elical-qa",
        description="the QA files of HonestyBench, in the data/ folder of the EliCal repository "
        "(github.com/Trustworthy-Information-Access/Annotation-Efficient-Universal-Honesty-Alignment)",
        base_url="https://raw.githubusercontent.com/Trustworthy-Information-Access/"
        "Annotation-Efficient-Universal-Honesty-Alignment/main/data",
        env="CANDOR_ELICAL_QA_URL",
        files={path: path for path in _ELICAL_QA_FILES},
    )
)
SOURCES.register("logiqa2")(
    Source(
        name="logiqa2",
        description="the LogiQA 2.0 test set (github.com/csitfun/LogiQA2.0)",
        base_url="https://raw.githubusercontent.com/csitfun/LogiQA2.0/main/logiqa/DATA/LOGIQA",
        env="CANDOR_LOGIQA2_URL",
        files={"logiqa2/test.jsonl": "test.txt"},
    )
)


@dataclass(frozen=True)
class Fetched:
    """What one download did for one dataset: its file, and whether it was already there."""

    name: str
    path: Path
    already_there: bool


def downloadable() -> list[str]:
    """The named datasets a source can fetch."""
    return [n for n in dataset_names() if DATASETS.get(n).source is not None]


def download_datasets(
    names: Sequence[str] = (),
    data_dir: str | Path | None = None,
    *,
    sources: Mapping[str, str] | None = None,
) -> list[Fetched]:
    """Fetch ``names`` (default: every downloadable dataset) into ``data_dir`` (default: ``$CANDOR_DATA_DIR``, else
    :func:`candor.data.datasets.default_data_dir`), created if missing.

    ``sources`` maps a source name to a base URL that replaces its default
    (and its environment variable). A file already in place is kept as it is.
    """
    target = Path(data_dir or os.environ.get(DATA_DIR_ENV) or default_data_dir())
    specs = [_downloadable_spec(n) for n in (names or downloadable())]
    target.mkdir(parents=True, exist_ok=True)
    return [_fetch(spec, target, (sources or {}).get(spec.source or "")) for spec in specs]


def _downloadable_spec(name: str) -> DatasetSpec:
    spec = DATASETS.get(name)
    if spec.source is None:
        raise CandorError(f"dataset {name!r} is built in; there is nothing to download")
    return spec


def _fetch(spec: DatasetSpec, data_dir: Path, base: str | None) -> Fetched:
    source = SOURCES.get(spec.source or "")
    local = next(p for p in spec.paths if p in source.files)
    path = data_dir / local
    if path.is_file():
        return Fetched(spec.name, path, already_there=True)
    url = source.url(local, base)
    logger.info("%s: fetching %s", spec.name, url)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, atomic_target(path) as tmp:
            tmp.write_bytes(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CandorError(
            f"dataset {spec.name!r}: could not fetch {url} ({exc}); set {source.env} to a mirror of "
            f"{source.description}"
        ) from None
    _check_readable(spec, path, data_dir, url)
    return Fetched(spec.name, path, already_there=False)


def _check_readable(spec: DatasetSpec, path: Path, data_dir: Path, url: str) -> None:
    """Read the fetched file back as the dataset; a file that does not parse is removed."""
    try:
        items = load_items(spec.name, data_dir=data_dir)
    except CandorError as exc:
        path.unlink(missing_ok=True)
        raise CandorError(f"dataset {spec.name!r}: {url} is not the dataset ({exc}); nothing kept") from None
    logger.info("%s: %d items in %s", spec.name, len(items), path)
