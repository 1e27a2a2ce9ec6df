"""Loaders: QA files, Hugging Face datasets and named datasets → ``list[QAItem]``.

One entry point, :func:`load_items`, takes a registered name (``nq``,
``starter``), a file path (format chosen by suffix from :data:`FORMATS`) or
``hf:<id or dir>[:split]``. Every format yields plain rows; one row parser
turns a row into a :class:`QAItem`, so the rules below hold everywhere:

- open QA: ``question`` plus ``answer`` or ``answers`` (a list of aliases, or
  one string); CSV separates aliases with ``|``;
- multiple choice (the LogiQA 2.0 layout): ``options`` (or ``choices``), an
  ``answer`` index (or letter) and an optional passage ``text``;
- the id is the row's ``id`` or ``{dataset}:{line}`` (1-based, stable);
- other fields go to ``meta``;
- blank aliases are dropped, and an item left with none (``"answer": [""]``,
  a null answer) is skipped with one warning per file and counted in the
  returned :class:`QAItems` (see :mod:`candor.data.judgeable`); ``strict=True``
  refuses it instead.

Mistakes raise :class:`CandorError` naming the file and 1-based line.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from candor.data.datasets import DATASETS, get_dataset
from candor.data.items import OPTION_LETTERS, QAItem, QAItems
from candor.data.judgeable import SkippedItems, UnjudgeableItem, judgeable_aliases
from candor.util.errors import CandorError, at_line
from candor.util.jsonl import iter_json_lines
from candor.util.registry import Registry

log = logging.getLogger(__name__)

SPLIT_NAMES = frozenset({"train", "dev", "validation", "val", "test"})
CSV_ALIAS_SEPARATOR = "|"
HF_PREFIX = "hf:"


@dataclass(frozen=True)
class Fields:
    """Which row fields hold what. The first present name of each tuple is used."""

    question: str = "question"
    answers: tuple[str, ...] = ("answer", "answers")
    id: str | None = "id"
    choices: tuple[str, ...] = ("options", "choices")
    context: tuple[str, ...] = ("text",)


DEFAULT_FIELDS = Fields()

Row = dict[str, Any]
# A row reader yields (1-based line or row number, row) for one file format.
RowReader = Callable[[Path, Fields], Iterator[tuple[int, Row]]]
FORMATS: Registry[RowReader] = Registry("QA file format")


# ------------------------------------------------------------------ row parser


def _first(row: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str | None, Any]:
    for name in names:
        if name in row:
            return name, row[name]
    return None, None


def _text(value: Any) -> str | None:
    """A string, or a number written as one; None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _aliases(value: Any, fail: Callable[[str], CandorError]) -> tuple[str, ...]:
    # Hugging Face sets nest aliases: SQuAD {"text": [...]}, TriviaQA {"aliases": [...]}.
    if isinstance(value, Mapping):
        _, value = _first(value, ("text", "aliases", "value"))
    values = [value] if not isinstance(value, (list, tuple)) else list(value)
    out: list[str | None] = []
    for v in values:
        alias = _text(v)
        if alias is None and v is not None:
            raise fail(f"answer alias must be a string, got {v!r}")
        out.append(alias)
    return judgeable_aliases(out)


def _choice(
    row: Row, choices: list[Any], fields: Fields, fail: Callable[[str], CandorError]
) -> tuple[dict[str, Any], str]:
    """The multiple-choice fields of a QAItem, and the name of the answer field used."""
    options = [_text(c) for c in choices]
    if len(options) < 2 or len(options) > len(OPTION_LETTERS) or any(o is None for o in options):
        raise fail(f"options must be 2-{len(OPTION_LETTERS)} strings")
    name, answer = _first(row, fields.answers)
    if name is None:
        raise fail(f"missing answer field ({' or '.join(fields.answers)})")
    if answer is None or answer == "":
        judgeable_aliases([_text(answer)])  # no gold option: skipped like an open-QA item without aliases
    letters = OPTION_LETTERS[: len(options)]
    letter = answer.strip().upper() if isinstance(answer, str) else ""
    if len(letter) == 1 and letter in letters:
        index = letters.index(letter)
    elif isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(options):
        index = answer
    else:
        raise fail(f"answer must be an option index 0-{len(options) - 1} or a letter, got {answer!r}")
    _, context = _first(row, fields.context)
    parts = {
        "choices": tuple(options),
        "answer_index": index,
        "answers": judgeable_aliases([letters[index], options[index]]),
        "context": _text(context),
    }
    return parts, name


def parse_row(
    row: Mapping[str, Any],
    *,
    dataset: str,
    split: str,
    number: int,
    fields: Fields,
    fail: Callable[[str], CandorError],
) -> QAItem:
    """Turn one row into a QAItem; ``fail(message)`` builds the error to raise.

    A row with no non-blank gold alias raises :class:`UnjudgeableItem` (a
    :class:`CandorError`, without the line: the caller knows it), which the
    loaders count and skip unless strict.
    """
    row = dict(row)
    if fields.question not in row:
        raise fail(f"missing {fields.question!r}")
    question = _text(row[fields.question])
    if question is None or not question.strip():
        raise fail(f"empty or non-string {fields.question!r}")
    choices_name, choices = _first(row, fields.choices)
    if choices_name is not None:
        if not isinstance(choices, (list, tuple)):
            raise fail(f"{choices_name!r} must be a list")
        parts, answer_name = _choice(row, list(choices), fields, fail)
        used = {fields.question, choices_name, answer_name, *fields.context}
    else:
        name, value = _first(row, fields.answers)
        if name is None:
            raise fail(f"missing answer field ({' or '.join(fields.answers)})")
        parts = {"answers": _aliases(value, fail)}
        used = {fields.question, name}
    given_id = row.get(fields.id) if fields.id else None
    if fields.id:
        used.add(fields.id)
    item_id = _text(given_id) if given_id not in (None, "") else None
    return QAItem(
        id=item_id or f"{dataset}:{number}",
        dataset=dataset,
        split=split,
        question=question,
        meta={k: v for k, v in row.items() if k not in used},
        **parts,
    )


# ---------------------------------------------------------------- file formats


@FORMATS.register(".jsonl")
def read_jsonl(path: Path, fields: Fields) -> Iterator[tuple[int, Row]]:
    """One JSON object per line; blank lines are skipped."""
    yield from iter_json_lines(path)


@FORMATS.register(".json")
def read_json(path: Path, fields: Fields) -> Iterator[tuple[int, Row]]:
    """A JSON array of objects (numbered by position), or JSON lines."""
    with path.open(encoding="utf-8") as fh:
        head = fh.read(4096).lstrip()
    if not head.startswith("["):
        yield from read_jsonl(path, fields)
        return
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise at_line(path, exc.lineno, f"malformed JSON ({exc.msg})") from None
    for number, obj in enumerate(rows, start=1):
        if not isinstance(obj, dict):
            raise CandorError(f"{path}: entry {number}: expected a JSON object")
        yield number, obj


@FORMATS.register(".csv")
def read_csv(path: Path, fields: Fields) -> Iterator[tuple[int, Row]]:
    """A header row, then one question per row; aliases separated by ``|``."""
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        if fields.question not in header:
            raise at_line(path, 1, f"no {fields.question!r} column in the header {header}")
        for raw in reader:
            # Empty cells are absent values, not empty strings (an optional id, extra columns),
            # except an empty answer cell: that is an item without gold aliases, skipped as such.
            row: Row = {k: v for k, v in raw.items() if k is not None and v not in (None, "")}
            for name in fields.answers:
                if raw.get(name) is not None:
                    row[name] = [a.strip() for a in raw[name].split(CSV_ALIAS_SEPARATOR)]
            yield reader.line_num, row


# ------------------------------------------------------------------ public API


def names_from_path(path: Path) -> tuple[str, str]:
    """(dataset, split) from a path: ``nq/test.jsonl`` → (nq, test); ``trivia.csv`` → (trivia, test)."""
    stem = path.stem
    if stem.lower() in SPLIT_NAMES:
        return path.resolve().parent.name, stem.lower()
    return stem, "test"


def _parse_rows(
    rows: Iterator[tuple[int, Row]],
    *,
    source: str | Path,
    dataset: str,
    split: str,
    fields: Fields,
    limit: int | None,
    strict: bool,
) -> QAItems:
    """The one row-to-item path of every loader: parse, skip unjudgeable rows, refuse repeated ids.

    ``limit`` counts kept items, so ``--limit 10`` gives 10 questions even when some rows are skipped.
    """
    items = QAItems()
    skipped = SkippedItems(str(source), strict=strict)
    first_line: dict[str, int] = {}
    if limit == 0:
        return items
    for number, row in rows:

        def fail(message: str, number: int = number) -> CandorError:
            return at_line(source, number, message)

        try:
            item = parse_row(row, dataset=dataset, split=split, number=number, fields=fields, fail=fail)
        except UnjudgeableItem as exc:
            skipped.skip(number, exc)
            continue
        # Later stages merge by id, so a repeated id would silently mix two questions.
        if item.id in first_line:
            raise fail(f"duplicate id {item.id!r} (first on line {first_line[item.id]}); ids must be unique")
        first_line[item.id] = number
        items.append(item)
        if limit is not None and len(items) >= limit:
            break
    skipped.check_something_left(len(items))
    skipped.warn()
    items.skipped = skipped.count
    return items


def load_file(
    path: str | Path,
    *,
    dataset: str | None = None,
    split: str | None = None,
    fields: Fields = DEFAULT_FIELDS,
    limit: int | None = None,
    strict: bool = False,
) -> QAItems:
    """Load a QA file; the format comes from the suffix (see :data:`FORMATS`).

    Unjudgeable rows are skipped and counted in ``.skipped``; ``strict`` refuses them.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        known = ", ".join(FORMATS.names())
        raise CandorError(f"{path}: unknown QA file format {suffix or '(no suffix)'!r}; known: {known}")
    if not path.is_file():
        raise CandorError(f"{path}: no such file")
    default_dataset, default_split = names_from_path(path)
    rows = FORMATS.get(suffix)(path, fields)
    items = _parse_rows(
        rows,
        source=path,
        dataset=dataset or default_dataset,
        split=split or default_split,
        fields=fields,
        limit=limit,
        strict=strict,
    )
    log.info("loaded %d items from %s", len(items), path)
    return items


def _parse_hf_source(source: str) -> tuple[str, str | None]:
    """``id_or_dir[:split]`` → (target, split). A colon inside a path is kept."""
    target, sep, split = source.rpartition(":")
    if sep and target and split and "/" not in split and "\\" not in split:
        return target, split
    return source, None


def _open_hf(target: str) -> Any:
    import datasets  # heavy: imported only when a Hugging Face source is used

    path = Path(target)
    try:
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            return datasets.load_from_disk(str(path))
        builders = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
        if path.is_file() and path.suffix.lower() in builders:
            return datasets.load_dataset(builders[path.suffix.lower()], data_files=str(path))
        return datasets.load_dataset(target)
    except (OSError, ValueError) as exc:
        raise CandorError(f"{HF_PREFIX}{target}: cannot load the dataset ({exc})") from None


def _pick_split(data: Any, target: str, split: str | None) -> tuple[Any, str]:
    if not hasattr(data, "keys"):  # a single Dataset, not a DatasetDict
        return data, split or "test"
    available = sorted(data.keys())
    if split is None and len(available) == 1:
        split = available[0]
    if split not in data:
        wanted = f"split {split!r} not found" if split else "several splits; choose one"
        raise CandorError(f"{HF_PREFIX}{target}: {wanted} (available: {', '.join(available)})")
    return data[split], split


def load_hf(
    source: str,
    *,
    split: str | None = None,
    dataset: str | None = None,
    fields: Fields = DEFAULT_FIELDS,
    limit: int | None = None,
    strict: bool = False,
) -> QAItems:
    """Load ``<hub id or local dir or data file>[:split]`` with the ``datasets`` library.

    A directory written by ``save_to_disk`` is read with ``load_from_disk``;
    anything else goes through ``load_dataset``. With no split given, a
    dataset with a single split uses it.
    """
    source = source.removeprefix(HF_PREFIX)
    target, source_split = _parse_hf_source(source)
    data, split_name = _pick_split(_open_hf(target), target, split or source_split)
    path = Path(target.rstrip("/\\"))
    name = dataset or (names_from_path(path)[0] if path.is_file() else path.name) or target
    rows = ((number, dict(row)) for number, row in enumerate(data, start=1))
    items = _parse_rows(
        rows,
        source=f"{HF_PREFIX}{target}",
        dataset=name,
        split=split_name,
        fields=fields,
        limit=limit,
        strict=strict,
    )
    log.info("loaded %d items from %s%s (split %s)", len(items), HF_PREFIX, target, split_name)
    return items


def load_named(
    name: str,
    *,
    data_dir: str | Path | None = None,
    split: str | None = None,
    limit: int | None = None,
    strict: bool = False,
) -> QAItems:
    """Load a registered dataset (see :data:`candor.data.datasets.DATASETS`)."""
    spec = get_dataset(name)
    fields = Fields(id=spec.id_field)
    return load_file(
        spec.resolve(data_dir),
        dataset=spec.name,
        split=split or spec.split,
        fields=fields,
        limit=limit,
        strict=strict,
    )


def _looks_like_path(source: str) -> bool:
    return bool(Path(source).suffix) or "/" in source or "\\" in source or Path(source).exists()


def load_items(
    source: str,
    *,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    split: str | None = None,
    fields: Fields | None = None,
    strict: bool = False,
) -> QAItems:
    """Load QA items from a registered name, a file path or ``hf:<id or dir>[:split]``.

    ``split`` picks the split of a Hugging Face dataset, and otherwise sets
    the items' ``split`` label. ``data_dir`` is where named benchmark files
    live (see :func:`candor.data.datasets.resolve_data_dir`). ``fields``
    renames the columns of a file or Hugging Face dataset. Items without a
    non-blank gold alias are skipped (counted in ``.skipped``); ``strict``
    refuses them with an error naming the file and line.
    """
    if limit is not None and limit < 0:
        raise CandorError(f"limit must be >= 0, got {limit}")
    if source.startswith(HF_PREFIX):
        return load_hf(source, split=split, fields=fields or DEFAULT_FIELDS, limit=limit, strict=strict)
    if source in DATASETS:
        if fields is not None:
            raise CandorError(f"dataset {source!r} is registered; fields apply to files only")
        return load_named(source, data_dir=data_dir, split=split, limit=limit, strict=strict)
    if _looks_like_path(source):
        return load_file(source, split=split, fields=fields or DEFAULT_FIELDS, limit=limit, strict=strict)
    known = ", ".join(DATASETS.names())
    raise CandorError(f"unknown dataset {source!r}: not a file path; known names: {known}")
