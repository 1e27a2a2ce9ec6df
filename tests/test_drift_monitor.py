"""The drift alarm holds its level when looked at after every label (issue 53, defect 6), and what it counts.

The simulation (benchmarks/drift.py's ``simulate``): 2,000 seeded runs of 5,000 i.i.d. audit labels whose
accuracy equals the promise, a look after every label. The betting alarm (what ``candor serve`` now does)
fires in at most δ of them, up to a binomial margin; the former rule, a fixed-level Clopper–Pearson bound
computed afresh at every look, fires in far more. On a stream 10 points below the promise, the median
labels to alarm is reported. The serving monitor (:class:`candor.serve.audit_monitor.AuditMonitor`) is
checked to fire at the very label the vectorized rule does, so the simulation is of the monitor's statistic.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import beta, binom

from benchmarks.drift import betting_alarms, delay, false_alarms, fixed_level_alarms, simulate
from candor.serve.audit_monitor import AuditLabel, AuditMonitor

PROMISE, DELTA = 0.8, 0.05


def binomial_ceiling(runs: int, rate: float, miss: float = 1e-3) -> float:
    """The largest false-alarm rate a rule at level ``rate`` shows in ``runs`` runs, but with probability ``miss``."""
    return float(binom.ppf(1 - miss, runs, rate)) / runs


def check_level(runs: int, labels: int) -> None:
    at_promise = simulate(PROMISE, PROMISE, runs=runs, labels=labels, delta=DELTA, seed=0)
    betting, fixed = false_alarms(at_promise["betting"]), false_alarms(at_promise["fixed-level"])
    print(f"\nfalse alarms in {runs} runs of {labels} labels: betting {betting}, fixed-level {fixed}")
    assert betting["rate"] <= binomial_ceiling(runs, DELTA)
    assert fixed["ci95"][0] > DELTA  # looked at after every label, the fixed-level bound is not at its level
    dropped = simulate(PROMISE - 0.1, PROMISE, runs=runs, labels=labels, delta=DELTA, seed=1)
    found = delay(dropped["betting"])
    print(f"labels to alarm at {PROMISE - 0.1:.1f} (promise {PROMISE}): {found}")
    assert found["median"] is not None and found["never"] < runs // 2


def test_the_alarm_fires_in_at_most_delta_of_2000_runs_of_5000_labels_looking_after_every_label():
    check_level(runs=2000, labels=5000)  # about 3 s: numpy over all runs at once


def test_the_fixed_level_rule_is_the_clopper_pearson_bound_at_every_look():
    x = (np.random.default_rng(3).random((40, 400)) < 0.74).astype(float)
    first = fixed_level_alarms(x, PROMISE, DELTA)
    for row, alarm in zip(x, first, strict=True):
        want = 0
        for n in range(30, len(row) + 1):
            k = int(row[:n].sum())
            upper = 1.0 if k == n else float(beta.ppf(1 - DELTA, k + 1, n - k))
            if upper < PROMISE:
                want = n
                break
        assert alarm == want
    assert (first > 0).sum() > 10  # the comparison saw alarms


def stream(accuracy: float, n: int, seed: int) -> list[bool]:
    return list(np.random.default_rng(seed).random(n) < accuracy)


def drift_looks(monitor: AuditMonitor, version: str, labels: list[bool]) -> list[bool]:
    """The alarm after every label (a scrape between any two labels)."""
    looks = []
    for i, correct in enumerate(labels):
        monitor.observe(version, f"r{i}", correct)
        looks.append(monitor.report(version).drift)
    return looks


def test_the_monitor_fires_at_the_label_the_simulated_rule_does():
    for seed in range(4):
        labels = stream(0.65, 600, seed)
        monitor = AuditMonitor()
        monitor.promise("v1", PROMISE, DELTA)
        looks = drift_looks(monitor, "v1", labels)
        first = betting_alarms(np.array([labels], dtype=float), PROMISE, DELTA)[0]
        assert first > 0 and looks.index(True) + 1 == first
        assert all(looks[first - 1 :])  # once on, it stays on


def test_a_stream_at_the_promise_that_trips_the_fixed_level_bound_does_not_trip_the_monitor():
    """On a stream whose accuracy is the promise, the former rule alarmed at some look; the monitor never does."""
    runs = np.random.default_rng(11).random((200, 3000)) < PROMISE
    tripped = fixed_level_alarms(runs.astype(float), PROMISE, DELTA)
    quiet = betting_alarms(runs.astype(float), PROMISE, DELTA)
    seed = int(np.flatnonzero((tripped > 0) & (quiet == 0))[0])  # a stream the former rule alarmed on
    monitor = AuditMonitor()
    monitor.promise("v1", PROMISE, DELTA)
    assert not any(drift_looks(monitor, "v1", list(runs[seed])))
    report = monitor.report("v1")
    assert report.lower < PROMISE < report.upper and report.unconfirmed


def test_one_label_per_response_counts_the_first():
    monitor = AuditMonitor()
    monitor.promise("v1", PROMISE, DELTA)
    assert monitor.observe("v1", "chatcmpl-a", False)
    assert not monitor.observe("v1", "chatcmpl-a", True)  # another choice, or a correction: not counted
    assert monitor.observe("v1", "chatcmpl-b", True)
    report = monitor.report("v1")
    assert report.labelled == 2 and report.accuracy == 0.5


def test_versions_are_audited_apart_against_their_own_promises():
    monitor = AuditMonitor()
    monitor.promise("v1", 0.9, DELTA)
    monitor.promise("v2", 0.5, 0.1)
    for i, correct in enumerate(stream(0.7, 400, 5)):
        monitor.observe("v1", f"a{i}", correct)
    assert monitor.report("v2") is None  # no label of v2 yet
    monitor.observe("v2", "a0", True)  # a response id of v1's: another version's, counted there
    v1, v2 = monitor.report("v1"), monitor.report("v2")
    assert (v1.labelled, v1.promised, v1.delta) == (400, 0.9, DELTA) and v1.drift
    assert (v2.labelled, v2.promised, v2.delta) == (1, 0.5, 0.1) and not v2.drift


def test_a_replay_rebuilds_the_state_after_a_restart_and_a_late_promise_counts_earlier_labels():
    labels = [AuditLabel("v1", f"r{i}", c) for i, c in enumerate(stream(0.7, 500, 6))]
    live = AuditMonitor()
    live.promise("v1", PROMISE, DELTA)
    for label in labels:
        live.observe(*label)
    restarted = AuditMonitor()
    assert restarted.replay([*labels, labels[0]]) == len(labels)  # a repeated response counts once
    restarted.promise("v1", PROMISE, DELTA)  # the model is loaded after the store was read
    assert restarted.report("v1") == live.report("v1")
    assert live.report("v1").drift


def test_the_monitor_keeps_a_bounded_number_of_labels_and_versions():
    monitor = AuditMonitor(labels_per_version=3, versions=2)
    assert [monitor.observe("v1", f"r{i}", True) for i in range(5)] == [True, True, True, False, False]
    monitor.observe("v2", "r0", True)
    monitor.observe("v3", "r0", True)
    assert monitor.report("v1") is None and monitor.report("v3").labelled == 1
    with pytest.raises(ValueError, match="promised"):
        monitor.promise("v1", 1.2)
