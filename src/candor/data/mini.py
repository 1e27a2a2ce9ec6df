"""HonestyBench-mini: the CPU-scale benchmark protocol (docs/methods.md "HonestyBench-mini").

- In-domain (NQ, HotpotQA, 2Wiki, ParaRel): each file is split by a hash of
  the question into train (80%) and test (20%). The test set is drawn from the
  test part, the training pool from the train part, and a dev slice (for early
  stopping and model selection) from the pool.
- Out-of-domain (SQuAD, MuSiQue): whole files, evaluation only.

Repeated question texts are dropped first, so no question text is in two
splits. Every draw is a seeded shuffle, so the same arguments give the same
benchmark on every machine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from candor.data.items import QAItem
from candor.data.loaders import load_named
from candor.data.splits import dedupe_questions, seeded_shuffle, split_items, with_split
from candor.util.errors import CandorError

log = logging.getLogger(__name__)

IN_DOMAIN = ("nq", "hq", "2wikimultihopqa", "pararel")
OUT_OF_DOMAIN = ("squad", "musique")


@dataclass
class MiniBench:
    """HonestyBench-mini, each field a dict dataset → items.

    ``train`` and ``dev`` come from the in-domain training parts; ``test_id``
    is the in-domain test set and ``test_ood`` the out-of-domain one.
    """

    train: dict[str, list[QAItem]] = field(default_factory=dict)
    dev: dict[str, list[QAItem]] = field(default_factory=dict)
    test_id: dict[str, list[QAItem]] = field(default_factory=dict)
    test_ood: dict[str, list[QAItem]] = field(default_factory=dict)

    def all_items(self) -> list[QAItem]:
        """Every item once: train, dev, in-domain test, then OOD test."""
        parts = (self.train, self.dev, self.test_id, self.test_ood)
        return [item for part in parts for items in part.values() for item in items]

    def sizes(self) -> dict[str, dict[str, int]]:
        """Item counts per part and dataset, for logs and reports."""
        parts = {"train": self.train, "dev": self.dev, "test_id": self.test_id, "test_ood": self.test_ood}
        return {name: {ds: len(items) for ds, items in part.items()} for name, part in parts.items()}


def _check(test_size: int, train_pool: int, dev_fraction: float) -> None:
    if test_size < 0 or train_pool < 0:
        raise CandorError(f"test_size and train_pool must be >= 0, got {test_size} and {train_pool}")
    if not 0.0 <= dev_fraction < 1.0:
        raise CandorError(f"dev_fraction must be in [0, 1), got {dev_fraction}")


def _take(items: list[QAItem], n: int, seed: str, what: str) -> list[QAItem]:
    if len(items) < n:
        log.warning("%s: only %d items, wanted %d", what, len(items), n)
    return seeded_shuffle(items, seed)[:n]


def honestybench_mini(
    data_dir: str | Path | None = None,
    test_size: int = 200,
    train_pool: int = 500,
    dev_fraction: float = 0.1,
    seed: int = 0,
) -> MiniBench:
    """Build HonestyBench-mini from the benchmark files under ``data_dir``.

    Larger ``test_size`` and ``train_pool`` give the bigger GPU presets; a
    size above what a file holds takes all of it.
    """
    _check(test_size, train_pool, dev_fraction)
    bench = MiniBench()
    for name in IN_DOMAIN:
        train_part, test_part = split_items(dedupe_questions(load_named(name, data_dir=data_dir)))
        bench.test_id[name] = _take(test_part, test_size, f"{seed}:{name}:test", f"{name} test")
        pool = _take(train_part, train_pool, f"{seed}:{name}:pool", f"{name} train pool")
        # The pool order is already a seeded shuffle, so its head is a seeded dev slice.
        n_dev = round(dev_fraction * len(pool))
        bench.dev[name] = with_split(pool[:n_dev], "dev")
        bench.train[name] = pool[n_dev:]
    for name in OUT_OF_DOMAIN:
        whole = dedupe_questions(load_named(name, data_dir=data_dir))
        bench.test_ood[name] = with_split(_take(whole, test_size, f"{seed}:{name}:test", name), "test")
    log.info("HonestyBench-mini sizes: %s", bench.sizes())
    return bench
