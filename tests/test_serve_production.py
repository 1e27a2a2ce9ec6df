"""The production phase's checks (benchmarks/serve_production.py) on hand-made inputs: the option check, the
label reconciliation, the audit gauges read from /metrics text (the full load runs in the benchmark only)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from benchmarks.serve_production import (
    PostedLabel,
    ServedChoice,
    StoredLabel,
    audit_gauges,
    expected_audited,
    folder_version,
    memory_report,
    option_violations,
    options_digest,
    reconcile_labels,
)
from benchmarks.servers import resident_parts_mib
from candor.serve.deployment import Deployment

DEPLOYMENT = Deployment(threshold=0.3, max_new_tokens=16)
DIGEST = DEPLOYMENT.digest


def choice(version: str, threshold: float | None = 0.3, tokens: int | None = 4, rid: str = "r1") -> ServedChoice:
    return ServedChoice(
        response_id=rid, index=0, model_version=version, threshold=threshold, abstained=False, completion_tokens=tokens
    )


def test_the_version_splits_into_the_folder_and_the_options_digest():
    assert options_digest(f"20260601T120000Z-3f9a2b+opts.{DIGEST}") == DIGEST
    assert folder_version(f"20260601T120000Z-3f9a2b+opts.{DIGEST}") == "20260601T120000Z-3f9a2b"
    assert options_digest("v1") is None and folder_version("v1") == "v1"
    assert options_digest("+opts.abc") is None  # no folder part: not a deployment's version


def test_choices_from_another_generation_or_with_other_options_are_counted_once_each():
    versions = ["v1", "v2"]
    good = [
        choice(f"v1+opts.{DIGEST}"),
        choice(f"v2+opts.{DIGEST}", tokens=None),
        choice(f"v2+opts.{DIGEST}", tokens=16),
    ]
    bad = [
        choice("v2+opts.00000000"),  # another deployment's options
        choice("v2"),  # no options at all: the folder's own
        choice(f"v9+opts.{DIGEST}"),  # a folder version never saved
        choice(f"v1+opts.{DIGEST}", threshold=0.5),  # the folder's threshold, not the deployment's
        choice(f"v1+opts.{DIGEST}", tokens=17),  # longer than the deployment's cap
        choice("v2+opts.00000000", threshold=0.5),  # two reasons, one choice
    ]
    report = option_violations(good + bad, DEPLOYMENT, versions)
    assert report["checked"] == 9 and report["violations"] == 6
    assert report["by_reason"] == {"digest": 3, "folder_version": 1, "threshold": 2, "max_new_tokens": 1}
    assert option_violations(good, DEPLOYMENT, versions)["violations"] == 0


def posted(rid: str, index: int, correct: bool, source: str, version: str = "v1") -> PostedLabel:
    return PostedLabel(response_id=rid, index=index, correct=correct, label_source=source, model_version=version)


def stored(rid: str, index: int, correct: bool, source: str, version: str = "v1") -> StoredLabel:
    return StoredLabel(response_id=rid, index=index, correct=correct, label_source=source, model_version=version)


def test_every_accepted_label_is_found_in_the_store_as_posted():
    sent = [posted("a", 0, True, "user"), posted("a", 1, False, "audit"), posted("b", 0, True, "audit", "v2")]
    same = [stored("a", 1, False, "audit"), stored("b", 0, True, "audit", "v2"), stored("a", 0, True, "user")]
    clean = reconcile_labels(sent, same)
    assert (clean["lost"], clean["foreign"], clean["version_mismatches"]) == (0, 0, 0) and clean["stored"] == 3


def test_lost_misplaced_relabelled_and_foreign_labels_are_counted():
    sent = [posted("a", 0, True, "user"), posted("a", 1, False, "audit"), posted("b", 0, True, "audit", "v2")]
    got = [
        stored("a", 0, True, "user"),
        stored("a", 0, False, "audit"),  # a's index-1 label attached to index 0: lost and foreign
        stored("b", 0, True, "audit", "v1"),  # on a choice another version served
        stored("c", 0, True, "audit"),  # a label nobody's 200 posted (a forged one the service took)
    ]
    report = reconcile_labels(sent, got)
    assert report["lost"] == 1 and report["foreign"] == 2 and report["version_mismatches"] == 1
    assert len(report["examples"]) == 4
    wrong_source = reconcile_labels([posted("a", 0, True, "user")], [stored("a", 0, True, "audit")])
    assert wrong_source["lost"] == 1 and wrong_source["foreign"] == 1
    duplicate = reconcile_labels([posted("a", 0, True, "audit")] * 2, [stored("a", 0, True, "audit")])
    assert duplicate["lost"] == 1  # two posts, one kept
    # End-user labels are one per choice and key: a repeat replaces the earlier one, so one of them is kept.
    repeated = [posted("a", 0, True, "user"), posted("a", 0, False, "user")]
    kept = reconcile_labels(repeated, [stored("a", 0, False, "user")])
    assert (kept["lost"], kept["foreign"]) == (0, 0)
    both = reconcile_labels(repeated, [stored("a", 0, True, "user"), stored("a", 0, False, "user")])
    assert (both["lost"], both["foreign"]) == (0, 1)  # two kept: one too many
    assert reconcile_labels(repeated, [stored("a", 1, True, "user")])["lost"] == 1


METRICS = """# HELP candor_feedback_accuracy Accuracy of answered questions in the audit.
# TYPE candor_feedback_accuracy gauge
candor_feedback_accuracy 0.625
candor_feedback_accuracy_lower 0.21
candor_feedback_accuracy_upper 0.93
candor_feedback_audited 8.0
candor_promised_accuracy NaN
candor_calibration_unconfirmed 0.0
candor_calibration_drift 0.0
candor_model_info{version="v2+opts.1c2d3e4f"} 1.0
candor_reloads_total{outcome="ok"} 2.0
"""


def test_the_audit_gauges_are_read_from_metrics_with_nan_as_none():
    gauges = audit_gauges(METRICS)
    assert gauges["candor_feedback_accuracy"] == 0.625 and gauges["candor_feedback_audited"] == 8.0
    assert gauges["candor_promised_accuracy"] is None  # NaN: nothing promised
    assert gauges == audit_gauges(METRICS.replace("promised_accuracy NaN", "promised_accuracy nan"))
    assert gauges != audit_gauges(METRICS.replace("audited 8.0", "audited 7.0"))
    missing = audit_gauges("candor_feedback_audited 1.0\n")
    assert missing["candor_feedback_accuracy"] is None and not math.isnan(missing["candor_feedback_audited"])


def test_the_audit_counts_responses_of_the_final_version_with_an_audit_label_on_an_answered_choice():
    labels = [
        posted("a", 0, True, "audit", "v2"),
        posted("a", 1, False, "audit", "v2"),  # the same response: counted once
        posted("b", 0, True, "user", "v2"),  # not an audit label
        posted("c", 0, True, "audit", "v1"),  # another version
        posted("d", 0, True, "audit", "v2"),  # abstained: not audited
        posted("e", 1, True, "audit", "v2"),
    ]
    answered = {("a", 0), ("a", 1), ("b", 0), ("c", 0), ("e", 1)}
    assert expected_audited(labels, answered, "v2") == 2


def test_memory_is_reported_whole_and_by_its_anonymous_part():
    before = [{"rss": 1000.0, "anon": 400.0, "file": 600.0}, {"rss": 1800.0, "anon": 420.0, "file": 1380.0}]
    after = [{"rss": 1250.0, "anon": 420.0, "file": 830.0}, {"rss": 1500.0, "anon": 441.0, "file": 1059.0}]
    report = memory_report(before, after)
    assert report["ratio"] == [1.25, 0.833] and report["anon_ratio"] == [1.05, 1.05]
    assert report["file_after"] == [830.0, 1059.0]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux /proc")
def test_this_process_resident_memory_has_its_parts():
    parts = resident_parts_mib(os.getpid())
    assert parts["anon"] > 0 and parts["rss"] >= parts["anon"] and "file" in parts
