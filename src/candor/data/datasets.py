"""Named datasets: short names (``nq``, ``squad``, ``starter``) for QA files.

Benchmark files live under a data dir laid out like HonestyBench's raw release
(``nq/test.jsonl``, ``hq/dev.jsonl``, ...). The dir is found by
:func:`resolve_data_dir`: ``--data-dir``, else ``$CANDOR_DATA_DIR``, else
``data/`` in candor's own folder (``$CANDOR_CACHE`` or ``~/.cache/candor``),
where ``candor datasets --download`` puts the files
(:mod:`candor.data.download`). No command needs it unless a named dataset is
asked for: the built-in ``starter`` set ships inside the package.

Each entry records its role in HonestyBench-mini: ``in-domain`` sets are split
into train and test, ``ood`` sets are evaluated only; and ``source``, the
public place :mod:`candor.data.download` fetches it from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from candor.util.errors import CandorError
from candor.util.files import cache_root
from candor.util.registry import Registry

Role = Literal["in-domain", "ood", "demo"]

DATA_DIR_ENV = "CANDOR_DATA_DIR"
PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class DatasetSpec:
    """One named dataset: where its file is, and what it is for.

    ``paths`` are tried in order, relative to the data dir (or to the package
    for a ``builtin`` set); the first that exists wins. ``name`` becomes the
    items' ``dataset`` field, so ids like ``nq:12`` are unique across entries.
    ``id_field`` names the file's id column; ``None`` numbers lines instead
    (LogiQA's own ids repeat). ``source`` names the entry of
    :data:`candor.data.download.SOURCES` that fetches the file (None: built in).
    """

    name: str
    paths: tuple[str, ...]
    split: str
    role: Role
    description: str
    builtin: bool = False
    id_field: str | None = "id"
    source: str | None = "elical-qa"

    def resolve(self, data_dir: str | Path | None = None) -> Path:
        """The file this name stands for; a clear error when it is missing."""
        base = PACKAGE_DIR if self.builtin else resolve_data_dir(data_dir)
        candidates = [base / p for p in self.paths]
        for path in candidates:
            if path.is_file():
                return path
        tried = ", ".join(str(p) for p in candidates)
        fetch = f"; get it with `{self.fetch_command(data_dir)}`" if self.source is not None else ""
        raise CandorError(f"dataset {self.name!r}: file not found (tried {tried}){fetch}")

    def fetch_command(self, data_dir: str | Path | None = None) -> str:
        """The command that downloads this dataset into the data dir."""
        return f"candor datasets --download {self.name}" + (f" --data-dir {data_dir}" if data_dir else "")


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def _add(spec: DatasetSpec, *aliases: str) -> None:
    for name in (spec.name, *aliases):
        DATASETS.register(name)(spec)


_add(
    DatasetSpec(
        name="nq",
        paths=("nq/test.jsonl",),
        split="test",
        role="in-domain",
        description="Natural Questions (open), test",
    )
)
# No "nq-dev": the shared data's nq/dev.jsonl holds the same 3,610 question-answer pairs as
# nq/test.jsonl, shuffled, so anything tuned on it would be tuned on the test set.
_add(
    DatasetSpec(name="hq", paths=("hq/dev.jsonl",), split="dev", role="in-domain", description="HotpotQA, dev"),
    "hotpotqa",
)
_add(
    DatasetSpec(
        name="2wikimultihopqa",
        paths=("2wikimultihopqa/dev.jsonl",),
        split="dev",
        role="in-domain",
        description="2WikiMultihopQA, dev",
    ),
    "2wiki",
)
_add(
    DatasetSpec(
        name="pararel",
        paths=("pararel_patterns/test.jsonl",),
        split="test",
        role="in-domain",
        description="ParaRel patterns, test",
    ),
    "pararel_patterns",
)
_add(
    DatasetSpec(
        name="squad", paths=("squad/dev.jsonl",), split="dev", role="ood", description="SQuAD without passages, dev"
    )
)
_add(DatasetSpec(name="musique", paths=("musique/dev.jsonl",), split="dev", role="ood", description="MuSiQue, dev"))
_add(
    DatasetSpec(
        name="musique-train", paths=("musique/train.jsonl",), split="train", role="ood", description="MuSiQue, train"
    )
)
_add(
    DatasetSpec(
        name="logiqa",
        paths=("../logiqa2/test.jsonl", "logiqa2/test.jsonl"),
        split="test",
        role="ood",
        description="LogiQA 2.0 multiple choice, test",
        id_field=None,
        source="logiqa2",
    ),
    "logiqa2",
)
_add(
    DatasetSpec(
        name="starter",
        paths=("starter.jsonl",),
        split="test",
        role="demo",
        description="built-in starter set",
        builtin=True,
        source=None,
    )
)


def get_dataset(name: str) -> DatasetSpec:
    """Look up a named dataset; an unknown name lists the known ones."""
    return DATASETS.get(name)


def dataset_names(role: Role | None = None) -> list[str]:
    """Canonical dataset names (no aliases), optionally only those with ``role``."""
    specs = {DATASETS.get(n).name: DATASETS.get(n) for n in DATASETS.names()}
    return sorted(name for name, spec in specs.items() if role is None or spec.role == role)


def default_data_dir() -> Path:
    """Where named datasets live when no dir is given: ``data/`` in candor's own folder."""
    return cache_root() / "data"


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The benchmark data dir: explicit, else ``$CANDOR_DATA_DIR``, else :func:`default_data_dir`.

    An explicit choice (argument or environment) must exist; so must the
    default, which ``candor datasets --download`` creates.
    """
    for given, origin in ((data_dir, "--data-dir"), (os.environ.get(DATA_DIR_ENV), DATA_DIR_ENV)):
        if given:
            path = Path(given)
            if not path.is_dir():
                raise CandorError(f"{path}: data dir not found (from {origin})")
            return path
    default = default_data_dir()
    if default.is_dir():
        return default
    raise CandorError(
        f"no benchmark data dir: run `candor datasets --download` (it fetches the named datasets into "
        f"{default}), or pass --data-dir DIR (the folder holding nq/, hq/, squad/, ...) or set {DATA_DIR_ENV}; "
        "the built-in 'starter' set needs none"
    )


def _where(spec: DatasetSpec, data_dir: str | Path | None, has_dir: bool) -> str:
    if not spec.builtin and not has_dir:
        return f"not downloaded; get it with `{spec.fetch_command(data_dir)}`"
    try:
        return str(spec.resolve(data_dir))
    except CandorError:
        return f"not in the data dir; get it with `{spec.fetch_command(data_dir)}`"


def describe_datasets(data_dir: str | Path | None = None) -> list[str]:
    """One line per named dataset: name, aliases, role, description and where it resolves.

    Never raises for a missing data dir or file: listing is how a user finds out.
    """
    aliases: dict[str, list[str]] = {}
    for name in DATASETS.names():
        spec = DATASETS.get(name)
        if name != spec.name:
            aliases.setdefault(spec.name, []).append(name)
    lines = []
    try:
        resolve_data_dir(data_dir)
        has_dir = True
    except CandorError as exc:  # said once, not on every dataset's line
        lines.append(f"data dir: {exc}")
        has_dir = False
    for name in dataset_names():
        spec = DATASETS.get(name)
        also = f" (also: {', '.join(aliases[name])})" if name in aliases else ""
        lines.append(f"{name}{also} [{spec.role}] {spec.description}: {_where(spec, data_dir, has_dir)}")
    return lines
