import json

import pytest

from candor.util.files import atomic_target, atomic_write_json, atomic_write_text


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


def test_keyed_cache_returns_only_an_entry_written_under_the_same_key(tmp_path):
    from candor.util.files import read_keyed_json, write_keyed_json

    path = tmp_path / "c" / "stage.json"
    assert read_keyed_json(path, "k1") is None
    write_keyed_json(path, "k1", {"result": [1, 2]})
    assert read_keyed_json(path, "k1") == {"key": "k1", "result": [1, 2]}
    assert read_keyed_json(path, "k2") is None
    path.write_text("{half")
    assert read_keyed_json(path, "k1") is None
    assert read_keyed_json(None, "k1") is None


def test_a_cache_entry_reads_back_under_any_key_and_an_unreadable_one_is_none(tmp_path):
    from candor.util.files import read_cache_entry, write_keyed_json

    path = tmp_path / "runs" / "run.json"
    assert read_cache_entry(path) is None and read_cache_entry(None) is None
    write_keyed_json(path, "k1", {"ids": ["a"]})
    assert read_cache_entry(path) == {"key": "k1", "ids": ["a"]}
    for text in ('{"key": "k1", "ids"', "[1, 2]"):
        path.write_text(text)
        assert read_cache_entry(path) is None
    path.write_bytes(b"\xff\xfe")
    assert read_cache_entry(path) is None


def test_atomic_folder_swaps_in_whole_or_keeps_the_old_one(tmp_path):
    from candor.util.files import atomic_folder

    target = tmp_path / "model"
    with atomic_folder(target) as tmp:
        (tmp / "a.txt").write_text("1")
    with pytest.raises(RuntimeError), atomic_folder(target) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("killed")
    assert (target / "a.txt").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
