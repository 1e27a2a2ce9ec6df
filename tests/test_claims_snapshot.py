"""The claims benchmark's generations travel between machines as a committed gzip snapshot (claims_data)."""

from __future__ import annotations

import gzip

from benchmarks.claims_data import restore_snapshot, save_snapshot
from candor.annotation.records import Record, RecordAppender, read_records
from candor.backends.base import Completion
from candor.data.items import QAItem


def records(ids: list[str]) -> list[Record]:
    return [
        Record(
            item=QAItem(id=i, dataset="compound-nq", split="test", question=f"q {i}", answers=()),
            greedy=Completion(f"a {i}"),
            samples=[],
            provenance={},
        )
        for i in ids
    ]


def test_a_snapshot_restores_only_what_the_cache_lacks_and_is_byte_stable(tmp_path):
    cache, snapshot = tmp_path / "cache", tmp_path / "snapshot"
    cache.mkdir()
    with RecordAppender(cache / "compound.jsonl") as sink:
        sink.append(records(["c:0", "c:1", "c:2"]))
    (first,) = save_snapshot(snapshot, cache)
    once = first.read_bytes()
    assert save_snapshot(snapshot, cache)[0].read_bytes() == once  # no timestamp: the same lines, the same bytes
    assert gzip.decompress(once) == (cache / "compound.jsonl").read_bytes()
    elsewhere = tmp_path / "elsewhere"  # a machine that generated only the first one
    elsewhere.mkdir()
    with RecordAppender(elsewhere / "compound.jsonl") as sink:
        sink.append(records(["c:0"]))
    assert restore_snapshot(snapshot, elsewhere) == 2
    assert [r.id for r in read_records(elsewhere / "compound.jsonl")] == ["c:0", "c:1", "c:2"]
    assert restore_snapshot(snapshot, elsewhere) == 0  # nothing twice
    fresh = tmp_path / "fresh"
    assert restore_snapshot(snapshot, fresh) == 3 and not (fresh / "alone.jsonl").exists()
