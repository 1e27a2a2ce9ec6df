"""QA data: items, loaders (JSONL/JSON/CSV/Hugging Face), named datasets, splits.

The usual entry point is :func:`load_items`::

    from candor.data import load_items
    items = load_items("starter")            # built-in, offline
    items = load_items("nq", data_dir=...)   # a named benchmark file
    items = load_items("my_questions.csv")   # a file, format by suffix
    items = load_items("hf:./saved_dataset:test")

What lives here: :mod:`~candor.data.items`, :mod:`~candor.data.loaders`, the named sets
(:mod:`~candor.data.datasets`, :mod:`~candor.data.starter`), :mod:`~candor.data.splits`,
:mod:`~candor.data.judgeable` and the mini protocol (:mod:`~candor.data.mini`).

May import: :mod:`candor.util`.
"""

from candor.data.datasets import (
    DATA_DIR_ENV,
    DATASETS,
    DatasetSpec,
    dataset_names,
    describe_datasets,
    get_dataset,
    resolve_data_dir,
)
from candor.data.items import OPTION_LETTERS, QAItem, QAItems
from candor.data.judgeable import SkippedItems, UnjudgeableItem, judgeable_aliases
from candor.data.loaders import (
    DEFAULT_FIELDS,
    FORMATS,
    Fields,
    load_file,
    load_hf,
    load_items,
    load_named,
    names_from_path,
    parse_row,
)
from candor.data.mini import IN_DOMAIN, OUT_OF_DOMAIN, MiniBench, honestybench_mini
from candor.data.splits import (
    dedupe_questions,
    hash_split,
    hash_unit,
    seeded_shuffle,
    split_items,
    with_split,
)
from candor.data.starter import count_by, load_starter, starter_path

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "DEFAULT_FIELDS",
    "FORMATS",
    "IN_DOMAIN",
    "OPTION_LETTERS",
    "OUT_OF_DOMAIN",
    "DatasetSpec",
    "Fields",
    "MiniBench",
    "QAItem",
    "QAItems",
    "SkippedItems",
    "UnjudgeableItem",
    "count_by",
    "dataset_names",
    "describe_datasets",
    "dedupe_questions",
    "get_dataset",
    "hash_split",
    "hash_unit",
    "honestybench_mini",
    "judgeable_aliases",
    "load_file",
    "load_hf",
    "load_items",
    "load_named",
    "load_starter",
    "names_from_path",
    "parse_row",
    "resolve_data_dir",
    "seeded_shuffle",
    "split_items",
    "starter_path",
    "with_split",
]
