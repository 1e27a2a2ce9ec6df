import json

import pytest

from candor.files import atomic_target, atomic_write_json, atomic_write_text


def test_atomic_write_replaces_whole_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "a.json"
    atomic_write_json(target, {"x": 1})
    atomic_write_text(target, "second\n")
    assert target.read_text() == "second\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "a.json"
    atomic_write_json(target, {"old": True})
    with pytest.raises(RuntimeError), atomic_target(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_item_seed_is_the_annotation_rule_and_labels_separate_streams():
    import hashlib

    from candor.seeds import item_rng, item_seed

    # The annotation's per-item seed: SHA-256 of "seed:id", first 4 bytes little-endian, 31 bits (pinned).
    digest = hashlib.sha256(b"0:nq:12").digest()
    assert item_seed(0, "nq:12") == int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
    assert item_seed("self-consistency", 0, "nq:12") != item_seed(0, "nq:12")
    assert item_rng(3, 1).random() == item_rng(3, 1).random()
    assert item_rng(3, 1).random() != item_rng(3, 2).random()
