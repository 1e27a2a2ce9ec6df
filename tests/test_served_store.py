"""The store of served answers (issue 53, parts 5 and 7): the same tests on SQLite and on a real PostgreSQL.

PostgreSQL is started by the suite (tests/postgres.py) and the PostgreSQL cases skip, saying why,
without its binaries.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from served_log_fixture import IDS, copy_served_log

from candor.annotation.served_labels import read_served
from candor.annotation.served_store import (
    ENTRY_OVERHEAD,
    MIGRATIONS,
    PROBE_MARGIN_BYTES,
    PROBE_TABLE,
    Retention,
    ServedChoice,
    ServedStore,
    engine_url,
)
from candor.util.errors import CandorError


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'served.db'}"
    return request.getfixturevalue("postgres_url")


def record(question: str, answer: str = "Paris") -> dict:
    return {
        "item": {"id": f"q-{abs(hash(question))}", "dataset": "served", "question": question, "answers": []},
        "greedy": {"text": answer},
        "samples": [],
        "provenance": {"model_version": "v1"},
    }


def choices(n: int = 1, answered: bool = True, text: str = "Paris") -> list[ServedChoice]:
    return [
        ServedChoice(index=i, answered=answered, returned=text if answered else None, scored=i == 0) for i in range(n)
    ]


def test_records_choices_and_the_latest_label_round_trip(store_url: str) -> None:
    with ServedStore(store_url) as store:
        store.record(record("What is the capital of France?"), "chatcmpl-a", choices(2), "v1")
        store.record(record("Who wrote Hamlet?", "Marlowe"), "chatcmpl-b", choices(1, answered=False), "v2")
        assert store.find("chatcmpl-a", 1) is not None and store.find("chatcmpl-a", 1).scored is False
        assert store.find("chatcmpl-b", 0).answered is False and store.find("chatcmpl-b", 0).model_version == "v2"
        assert store.find("chatcmpl-a", 2) is None and store.find("chatcmpl-never", 0) is None
        store.add_label("chatcmpl-a", 0, True, "feedback", who="client")
        store.add_label("chatcmpl-a", 0, False, "human", who="ana")  # later: wins
        with pytest.raises(CandorError, match="'correct'"):
            store.add_label("chatcmpl-a", 0, "yes", "human")  # type: ignore[arg-type]
        log = store.served_log()
        by_key = {a.key: a for a in log.answers}
        assert list(by_key) == [("chatcmpl-a", 0), ("chatcmpl-a", 1), ("chatcmpl-b", 0)]
        first = by_key[("chatcmpl-a", 0)]
        assert (first.label, first.label_source, first.returned, first.scored) == (False, "human", "Paris", True)
        assert by_key[("chatcmpl-a", 1)].scored is False and by_key[("chatcmpl-a", 1)].label is None
        assert by_key[("chatcmpl-b", 0)].answered is False and by_key[("chatcmpl-b", 0)].returned is None
        assert first.record is by_key[("chatcmpl-a", 1)].record
        assert (store.count(), store.count(unlabelled=True), store.first_unlabelled()) == (2, 1, 1)
        assert store.question_at(0).key == ("chatcmpl-a", 0) and store.question_at(1).key == ("chatcmpl-b", 0)
        assert store.question_at(2) is None


def test_migrations_run_once_and_a_newer_schema_is_refused(store_url: str) -> None:
    ServedStore(store_url).close()
    with ServedStore(store_url) as again:  # a second replica opening the same store migrates nothing
        assert again.schema_version() == len(MIGRATIONS)
        again.record(record("q"), "chatcmpl-a", choices(), "v1")
        engine = sa.create_engine(engine_url(store_url))
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE schema_version SET version = :v"), {"v": len(MIGRATIONS) + 1})
        engine.dispose()
    with pytest.raises(CandorError, match="newer than this candor knows"):
        ServedStore(store_url)


def probe_payload(url: str) -> bytes:
    engine = sa.create_engine(engine_url(url))
    try:
        with engine.connect() as conn:
            return bytes(conn.execute(sa.text(f"SELECT payload FROM {PROBE_TABLE} WHERE id = 1")).scalar_one())
    finally:
        engine.dispose()


def test_the_write_probe_writes_fresh_bytes_as_many_as_the_largest_record_and_more(store_url: str) -> None:
    """The probe that tells a store takes writes again (after a full disk) writes what a record would: it changes its
    row (an update that changes nothing writes nothing in SQLite) by more bytes than the largest record written."""
    with ServedStore(store_url) as store:
        store.record(record("What is the capital of France?", "Paris " * 20_000), "chatcmpl-big", choices(), "v1")
        assert store.largest_record > 120_000
        first = store.write_probe()
        before = probe_payload(store_url)
        assert first == len(before) == store.largest_record + PROBE_MARGIN_BYTES
        store.write_probe()
        assert probe_payload(store_url) != before  # fresh bytes each time: a real write


def test_on_a_full_disk_the_write_probe_fails_as_records_do_and_passes_once_there_is_room() -> None:
    """SQLite on a full disk (a 4 MiB tmpfs filled to ENOSPC): records fail, and so must the write probe, or
    ``/ready`` says 200 while every answer is refused. It used to pass: a one-row no-op update writes nothing."""
    from benchmarks.faults import fill, mount_tmpfs

    try:
        disk = mount_tmpfs(4 << 20)
    except RuntimeError as exc:
        pytest.skip(f"{exc}: a full disk needs the right to mount a tmpfs (root or CAP_SYS_ADMIN)")
    try:
        with ServedStore(f"sqlite:///{disk / 'served.db'}") as store:
            for i in range(20):
                store.record(record(f"Question {i}?", "Paris " * 300), f"chatcmpl-{i}", choices(), "v1")
            filler = fill(disk)
            for i in range(5):
                with pytest.raises(sa.exc.OperationalError, match="full"):
                    store.record(record(f"Full {i}?", "Paris " * 300), f"chatcmpl-full-{i}", choices(), "v1")
                with pytest.raises(sa.exc.OperationalError, match="full"):
                    store.write_probe()
            filler.unlink()
            store.write_probe()
            store.record(record("Room again?", "Paris " * 300), "chatcmpl-again", choices(), "v1")
            assert store.count() == 21
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)
        disk.rmdir()


def test_retention_keeps_the_newest_rows_and_drops_old_ones(store_url: str) -> None:
    with ServedStore(store_url, Retention(max_rows=5)) as store:
        for i in range(12):
            store.record(record(f"question {i}"), f"chatcmpl-{i}", choices(2), "v1")
            store.add_label(f"chatcmpl-{i}", 0, True, "human")
        log = store.served_log()
        assert [a.record.item.question for a in log.answers[::2]] == [f"question {i}" for i in range(7, 12)]
        assert len(log.labelled()) == 5 and store.count() == 5
    with ServedStore(store_url, Retention(max_age_s=0.5)) as store:
        time.sleep(0.7)
        store.record(record("fresh"), "chatcmpl-fresh", choices(), "v1")
        assert [a.record.item.question for a in store.served_log().answers] == ["fresh"]
        assert store.served_log().labelled() == []  # the labels aged out with their answers


def test_the_remembered_index_stays_within_its_bytes_under_many_large_responses(store_url: str) -> None:
    """64-choice completions with long ids: the index holds the newest, evicts the oldest, never passes its bound."""
    limit = 20_000
    with ServedStore(store_url, Retention(remembered_bytes=limit)) as store:
        ids = [f"cmpl-{i:04d}-" + "x" * 200 for i in range(150)]
        for rid in ids:
            store.record(record(f"question {rid[:9]}"), rid, choices(64), "v1")
            assert store.remembered_bytes() <= limit
        engine = sa.create_engine(engine_url(store_url))
        with engine.connect() as conn:
            counted = conn.execute(sa.text("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM remembered")).one()
        engine.dispose()
        assert counted[0] == store.remembered_bytes() and limit - 2_000 < counted[0] <= limit
        kept = counted[1]
        assert 0 < kept < len(ids)
        assert all(store.find(rid, 63) is not None for rid in ids[-kept:])
        assert all(store.find(rid, 0) is None for rid in ids[: len(ids) - kept])
        assert store.count() == len(ids)  # the records stay (their retention is by rows and age)
    with pytest.raises(CandorError, match="at least"):
        Retention(remembered_bytes=ENTRY_OVERHEAD - 1)


def test_writers_in_threads_lose_nothing(store_url: str) -> None:
    with ServedStore(store_url, Retention(remembered_bytes=6_000)) as store:
        errors: list[BaseException] = []

        def serve(worker: int) -> None:
            try:
                for i in range(25):
                    rid = f"chatcmpl-{worker}-{i}"
                    store.record(record(f"q {worker} {i}"), rid, choices(2), "v1")
                    store.add_label(rid, i % 2, i % 3 == 0, "feedback")
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=serve, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        log = store.served_log()
        assert len(log.answers) == 200 and len(log.labelled()) == 100 and log.orphan_labels == 0
        engine = sa.create_engine(engine_url(store_url))
        with engine.connect() as conn:
            total = conn.execute(sa.text("SELECT COALESCE(SUM(size), 0) FROM remembered")).scalar_one()
        engine.dispose()
        assert total == store.remembered_bytes() <= 6_000


def test_the_audit_sample_is_seeded_uniform_and_answered_only(store_url: str) -> None:
    with ServedStore(store_url) as store:
        for i in range(40):
            store.record(record(f"q{i}"), f"chatcmpl-{i}", choices(1, answered=i % 4 != 0), "v1")
        sample = store.audit_sample(10, seed=3)
        assert sample == store.audit_sample(10, seed=3) != store.audit_sample(10, seed=4)
        assert len(set(sample)) == 10 and all(int(rid.split("-")[1]) % 4 for rid, _ in sample)
        assert len(store.audit_sample(100, seed=0)) == 30  # every answered choice, no more


def test_a_served_log_file_reads_into_a_store_and_labels_go_back_to_the_file(tmp_path: Path) -> None:
    log = copy_served_log(tmp_path)
    store = ServedStore.from_jsonl(log)
    assert [a.key for a in store.served_log().answers] == [a.key for a in read_served(log).answers]
    answer = store.answer(IDS[3], 1)
    assert (answer.answered, answer.scored) == (True, True) and answer.returned
    store.add_label(IDS[3], 1, False, "human")
    assert json.loads(log.read_text().splitlines()[-1])["label"]["id"] == IDS[3]
    assert read_served(log).labelled()[0].key == (IDS[3], 1)


def test_a_store_url_that_is_no_database_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CandorError, match="names a file"):
        ServedStore("sqlite:///")


def test_a_store_that_cannot_be_reached_is_one_line_without_the_password(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    from postgres import free_port

    url = f"postgresql://candor:secret@127.0.0.1:{free_port()}/served"
    with pytest.raises(CandorError, match="cannot open the store") as caught:
        ServedStore(url)
    assert "secret" not in str(caught.value)
