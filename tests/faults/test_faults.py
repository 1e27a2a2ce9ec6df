"""Issue 64, part 10: the fault-injection suite, in CI. Each fault of :mod:`benchmarks.faults` is injected into a
running server under load (the tiny test model, a real PostgreSQL or SQLite, real HTTP), at a small scale and
bounded in time, and its row must hold what the issue's acceptance asks: nothing acknowledged lost, ``/health``
under 1 s, ``/ready`` telling the truth once the fault is noticed, recovery with no operator.

The suite takes about 2 minutes in CI (each fault: 1.5 s before, 3 s of fault, 1.5 s after, plus its servers'
start); the replica killed with -9 starts three ``candor serve`` processes and is marked slow (``make test-slow``).
SQLite on a full disk needs the right to mount a tmpfs, and skips saying so without it.
The benchmark (``python -m benchmarks.faults``) runs the same functions at full scale with
the embedded model and writes benchmarks/results/faults.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from benchmarks import faults  # noqa: E402
from benchmarks.servers import PostgresUnavailable  # noqa: E402

SCALE = faults.Scale(
    phase_s=1.5,
    fault_s=3.0,
    store_timeout_s=2.0,
    slow_headers=300,
    header_timeout_s=2.0,
    flood_labels=200,
    pg_delay_s=0.02,
    tmpfs_bytes=4 << 20,
)
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def make(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend
    from candor.serve import HonestModel
    from candor.serve.answering import Decoding

    backend = HFBackend(tiny_model, tokenizer, batch_size=8)
    return lambda: HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=2))


def holds(row: dict) -> None:
    """The issue's acceptance, for one row (a failure prints the whole row)."""
    failed = [
        what
        for what, ok in [
            ("an acknowledged answer or label was lost", row["lost_answers"] == 0 and row["lost_labels"] == 0),
            ("no answer was acknowledged", row["acknowledged_answers"] > 0),
            ("/health took 1 s or more", row["health_max_s"] < 1.0),
            ("/ready did not tell the truth once the fault was noticed", row["ready_truthful"]),
            ("no recovery without an operator", row["recovery_s"] is not None and not row["operator_needed"]),
        ]
        if not ok
    ]
    if failed:
        pytest.fail("; ".join(failed) + "\n" + json.dumps(row, indent=1, default=str), pytrace=False)


def run(fault, *args) -> dict:
    try:
        return fault(*args)
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))


def test_postgres_stopped(make):
    row = run(faults.pg_stopped, make, SCALE)
    holds(row)
    assert set(row["client_sees"]) <= {"200", "503 store_unavailable"}, row  # never a 500
    assert "503 store_unavailable" in row["client_sees"]


def test_postgres_hung(make):
    row = run(faults.pg_hung, make, SCALE)
    holds(row)
    assert set(row["client_sees"]) <= {"200", "503 store_unavailable"}, row


def test_postgres_slow(make):
    row = run(faults.pg_slow, make, SCALE)
    holds(row)
    assert set(row["client_sees"]) == {"200"}, row  # slower, still answered


def test_sqlite_on_a_full_disk(make):
    try:
        row = faults.sqlite_full(make, SCALE)
    except RuntimeError as exc:
        if "cannot mount" in str(exc):
            pytest.skip(f"{exc}: the full-disk fault needs the right to mount a tmpfs (root or CAP_SYS_ADMIN)")
        raise
    assert set(row["client_sees"]) <= {"200", "503 store_unavailable"}, row  # never a 500
    # holds(): /ready 503 from the first failed write until the disk is freed. The write probe that clears the outage
    # writes as much as a record; it was a one-row no-op update, which SQLite does not write, and /ready flapped to 200.
    holds(row)


@pytest.mark.slow  # two `candor serve` processes, one started again: about a minute alone, minutes on a busy machine
def test_a_replica_killed_with_minus_9(tiny_model_dir, tmp_path, make):
    from candor.backends import load_backend
    from candor.serve import HonestModel
    from candor.serve.answering import Decoding

    folder = tmp_path / "honest"
    model = HonestModel(load_backend(tiny_model_dir, "hf"), confidence="n-prob", decoding=Decoding(max_new_tokens=2))
    model.save_pretrained(folder)
    row = run(faults.replica_killed, ["--honest", str(folder)], SCALE)
    holds(row)
    assert row["ready_during"]["survivor"] == {"200": sum(row["ready_during"]["survivor"].values())}, row
    assert set(row["ready_during"]["killed"]) == {"refused"}, row  # a load balancer sees it gone


def test_slow_header_connections(make):
    row = faults.slow_headers(make, SCALE)
    holds(row)
    assert set(row["client_sees"]) == {"200"}, row
    assert row["slow_connections_shed_after_s"] < SCALE.header_timeout_s + 5, row


def test_a_flood_of_labels(make):
    row = faults.label_flood(make, SCALE)
    holds(row)
    assert row["flood_outcomes"] == {"200": SCALE.flood_labels}, row  # a repeat replaces the label
    assert row["user_labels_stored"] <= 3, row  # one per choice and key, however many were sent


def test_a_symlink_or_fifo_in_the_root(make, tmp_path):
    def save(folder: Path, version: str) -> None:
        model = make()
        model.version = version
        model.save_pretrained(folder)

    row = faults.root_symlink_fifo(make, SCALE, save)
    holds(row)
    reloads = row["reloads"]
    assert reloads["link"]["outcome"] == reloads["pipe"]["outcome"] == "400 reload_failed", row
    assert not reloads["link"]["names_outside"] and not reloads["pipe"]["names_outside"], row
    assert reloads["pipe"]["seconds"] < 10, row  # refused, not waited on
    assert row["model_kept"] and reloads["next"] == {"outcome": "200", "version": "v2"}, row


def test_the_stored_results_hold_the_acceptance_in_every_row():
    stored = json.loads(faults.RESULTS.read_text())
    assert [r["key"] for r in stored["faults"]] == list(faults.FAULTS)
    measured = [row for row in stored["faults"] if "not_measured" not in row]
    assert all(row["not_measured"].startswith("not measured") for row in stored["faults"] if row not in measured)
    for row in measured:
        holds(row)
    for row in measured:  # every row: nothing acknowledged lost, /health under 1 s, recovered by itself
        assert row["lost_answers"] == row["lost_labels"] == 0 and row["health_max_s"] < 1.0, row
        assert row["recovery_s"] is not None and not row["operator_needed"], row
