import json

import pytest

from candor.annotation.contamination import (
    MANIFEST_NAME,
    find_overlap,
    fingerprints,
    question_fingerprint,
    read_manifest,
    write_manifest,
)
from candor.util.errors import CandorError


def test_fingerprint_ignores_case_punctuation_and_spacing():
    assert question_fingerprint("Who wrote Hamlet?") == question_fingerprint("  who wrote   hamlet ")
    assert question_fingerprint("Who wrote Hamlet?") != question_fingerprint("Who wrote Macbeth?")


def test_overlap_counts_and_names_first_example():
    seen = fingerprints(["Who wrote Hamlet?", "Capital of France?"])
    overlap = find_overlap(["capital of france", "Who painted the Mona Lisa?", "who wrote hamlet"], seen)
    assert (overlap.count, overlap.total, overlap.example) == (2, 3, "capital of france")
    assert bool(overlap)
    assert not find_overlap(["Who painted the Mona Lisa?"], seen)


def test_manifest_round_trip_holds_no_question_text(tmp_path):
    path = write_manifest(tmp_path, ["Who wrote Hamlet?", "who wrote hamlet", "Capital of France?"], ["pool.jsonl"])
    text = path.read_text()
    assert "Hamlet" not in text
    assert json.loads(text)["count"] == 2
    assert read_manifest(tmp_path) == fingerprints(["Who wrote Hamlet?", "Capital of France?"])


def test_missing_and_broken_manifest(tmp_path):
    assert read_manifest(tmp_path) is None
    (tmp_path / MANIFEST_NAME).write_text("{}")
    with pytest.raises(CandorError, match=MANIFEST_NAME):
        read_manifest(tmp_path)
