"""The fleet's dispatch policy (:mod:`candor.annotation.fleet`), on in-process handles.

The handles here are plain callables standing in for servers so that each
policy (availability, failover, probe back in, bounded tries, refusals) is
driven exactly; the same fleet on real ``transformers serve`` servers, one of
them killed mid-run, is tested in ``tests/test_annotate_ray.py``.
"""

from __future__ import annotations

import threading
import time

import pytest

from candor.annotation.fleet import Fleet, JobFailed, RetryPolicy, is_server_fault
from candor.backends.openai import ServerAnswered
from candor.util.errors import CandorError, UpstreamError

FAST = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05, probes=3)


class Handle:
    """A stand-in server: answers ``x * 10``, or fails while ``down``; counts what it answered."""

    def __init__(self, name: str) -> None:
        self.name, self.down, self.answered, self.lock = name, False, [], threading.Lock()

    def __call__(self, x: int) -> int:
        if self.down:
            raise UpstreamError(f"cannot reach {self.name}")
        with self.lock:
            self.answered.append(x)
        return x * 10


def probe(handle: Handle) -> None:
    if handle.down:
        raise UpstreamError(f"{handle.name} still down")


def jobs(n: int) -> list[tuple[str, object]]:
    return [(f"q{i}", lambda h, i=i: h(i)) for i in range(n)]


def test_work_goes_to_the_server_that_is_free():
    """A server stuck on one job takes no more; the free one does all the rest (no fixed split)."""
    stuck, free = Handle("stuck"), Handle("free")
    release = threading.Event()

    def slow(h: Handle, i: int) -> int:
        if h is stuck:
            release.wait(10)
        return h(i)

    fleet = Fleet([("stuck", stuck), ("free", free)], slots=1, probe=probe, policy=FAST)
    futures = [fleet.submit(f"q{i}", lambda h, i=i: slow(h, i)) for i in range(12)]
    deadline = time.monotonic() + 10
    while len(free.answered) < 11 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(free.answered) >= 11  # the free server did not wait for the stuck one's share
    release.set()
    assert sorted(f.result(10) for f in futures) == [i * 10 for i in range(12)]
    assert len(stuck.answered) <= 1 and len(stuck.answered) + len(free.answered) == 12
    fleet.close()


def test_a_failed_server_is_taken_out_and_its_jobs_go_to_the_others():
    dead, live = Handle("dead"), Handle("live")
    dead.down = True
    tried = threading.Event()

    def job(h: Handle, i: int) -> int:
        if h is dead:
            tried.set()
        else:
            tried.wait(5)  # the live one holds on until the dead one has had a job
        return h(i)

    fleet = Fleet([("dead", dead), ("live", live)], slots=2, probe=probe, policy=FAST)
    results = fleet.run([(f"q{i}", lambda h, i=i: job(h, i)) for i in range(20)])
    assert results == [i * 10 for i in range(20)]
    assert sorted(live.answered) == list(range(20))  # each job answered once
    state = {s["server"]: s for s in fleet.report()}
    assert not state["dead"]["up"] and state["dead"]["last_error"]
    fleet.close()


def test_a_server_that_answers_again_is_probed_back_in():
    flaky, steady = Handle("flaky"), Handle("steady")
    flaky.down = True
    tried = threading.Event()

    def job(h: Handle, i: int) -> int:
        if h is flaky:
            tried.set()
        else:
            tried.wait(5)
        return h(i)

    fleet = Fleet([("flaky", flaky), ("steady", steady)], slots=1, probe=probe, policy=RetryPolicy(backoff=0.05))
    assert fleet.run([(f"q{i}", lambda h, i=i: job(h, i)) for i in range(4)]) == [0, 10, 20, 30]
    assert not fleet.report()[0]["up"]  # taken out by its failure
    flaky.down = False
    deadline = time.monotonic() + 5
    while not fleet.report()[0]["up"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fleet.report()[0]["up"], "the probe never put it back"
    busy = [(f"q{i}", lambda h, i=i: time.sleep(0.02) or h(i)) for i in range(40)]  # long enough to share
    assert fleet.run(busy) == [i * 10 for i in range(40)]
    assert flaky.answered, "back in the fleet, it takes work again"
    fleet.close()


def test_when_every_server_is_gone_the_jobs_fail_naming_themselves():
    a, b = Handle("a"), Handle("b")
    a.down = b.down = True
    fleet = Fleet([("http://a", a), ("http://b", b)], slots=2, probe=probe, policy=FAST)
    start = time.monotonic()
    results = fleet.run(jobs(5))
    assert time.monotonic() - start < 10  # bounded: probes and tries are counted
    assert all(isinstance(r, JobFailed) and r.retryable for r in results)
    assert [str(r).split(":")[0] for r in results] == [f"q{i}" for i in range(5)]
    assert "cannot reach" in str(results[0]) or "still down" in str(results[0])
    late = fleet.submit("q9", lambda h: h(9))  # the fleet is gone: a new job fails at once
    with pytest.raises(JobFailed, match="no server of the fleet answers"):
        late.result(5)
    fleet.close()


def test_a_refused_request_is_not_retried():
    """A 400 (the request's own fault) ends its job at the first try; the server stays in."""
    calls = []

    def refused(h: Handle) -> int:
        calls.append(h.name)
        raise ServerAnswered("the server at x answered 400: bad top_k", 400)

    one, two = Handle("one"), Handle("two")
    fleet = Fleet([("one", one), ("two", two)], slots=1, probe=probe, policy=FAST)
    (result,) = fleet.run([("q0", refused)])
    assert isinstance(result, JobFailed) and not result.retryable and "400" in str(result)
    assert len(calls) == 1 and all(s["up"] for s in fleet.report())
    fleet.close()


def test_what_counts_as_a_server_fault():
    assert is_server_fault(UpstreamError("cannot reach"))
    assert is_server_fault(ServerAnswered("503", 503)) and is_server_fault(ServerAnswered("429", 429))
    assert not is_server_fault(ServerAnswered("400", 400)) and not is_server_fault(CandorError("bad option"))
    assert not is_server_fault(ValueError("a bug"))


def test_bad_settings_are_refused():
    with pytest.raises(CandorError, match="at least one"):
        RetryPolicy(attempts=0)
    with pytest.raises(CandorError, match="backoff"):
        RetryPolicy(backoff=2.0, max_backoff=1.0)
    with pytest.raises(CandorError, match="slot"):
        Fleet([("a", Handle("a"))], slots=0, probe=probe)
    assert [RetryPolicy().delay(n) for n in (1, 2, 3, 6, 9)] == [1.0, 2.0, 4.0, 30.0, 30.0]
