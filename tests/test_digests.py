"""Content digests that key the score and diagnose caches."""

from __future__ import annotations

import hashlib

import torch

from candor.util.digests import canonical, module_digest, path_digest


def test_path_digest_of_a_file_is_its_sha256(tmp_path):
    f = tmp_path / "head.safetensors"
    f.write_bytes(b"abc")
    assert path_digest(f) == hashlib.sha256(b"abc" + b"\0").hexdigest()


def test_folder_digest_follows_names_and_contents_recursively(tmp_path):
    folder = tmp_path / "adapter"
    (folder / "sub").mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    (folder / "sub" / "adapter_model.safetensors").write_bytes(b"w1")
    first = path_digest(folder)
    assert path_digest(folder) == first
    (folder / "sub" / "adapter_model.safetensors").write_bytes(b"w2")
    second = path_digest(folder)
    assert second != first
    (folder / "sub" / "adapter_model.safetensors").rename(folder / "sub" / "other.safetensors")
    assert path_digest(folder) not in (first, second)


def test_module_digest_tells_weights_apart():
    torch.manual_seed(0)
    a = torch.nn.Linear(3, 2)
    b = torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    assert module_digest(a) == module_digest(b)
    with torch.no_grad():
        b.bias[0] += 1e-6
    assert module_digest(a) != module_digest(b)


def test_canonical_hashes_paths_and_sorts_keys(tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    (head / "w").write_bytes(b"1")
    one = canonical({"z": 1, "head": str(head)})
    assert list(one) == ["head", "z"] and one["head"] == {"path": str(head), "sha256": path_digest(head)}
    (head / "w").write_bytes(b"2")
    assert canonical({"head": str(head), "z": 1}) != one
    assert canonical({"judge": "lexical"}) == {"judge": "lexical"}  # not a path: kept as is


def test_strings_inside_a_record_are_text_not_paths(tmp_path):
    # An answer that names an existing folder ("/", ".") used to be hashed as that folder: the whole disk for "/".
    from candor.annotation.records import Record
    from candor.backends.base import Completion
    from candor.data.items import QAItem

    item = QAItem(id="q:1", dataset="toy", split="dev", question="Which folder?", answers=(str(tmp_path),))
    rec = Record(item=item, greedy=Completion("/"), samples=[Completion(".")], greedy_correct=0)
    out = canonical({"dev": [rec]})
    assert out["dev"][0]["greedy"]["text"] == "/" and out["dev"][0]["samples"][0]["text"] == "."
    assert out["dev"][0]["item"]["answers"] == [str(tmp_path)]
    assert canonical({"dev": str(tmp_path)})["dev"]["path"] == str(tmp_path)  # an option that is a path still is
