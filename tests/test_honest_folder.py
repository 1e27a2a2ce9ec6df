"""``honest.json``'s one reader: what ``save_pretrained`` writes reads back; a bad file gets one error naming it."""

from __future__ import annotations

import json

import pytest

from candor.serve import Decoding, HonestModel, Threshold
from candor.serve.honest_folder import CONFIG_FILE, read_config, read_folder
from candor.util.errors import CandorError

GOOD = {"generator": {"model": "x"}, "confidence": {"kind": "estimator", "name": "n-prob"}}


def write(folder, text: str):
    folder.mkdir(exist_ok=True)
    path = folder / CONFIG_FILE
    path.write_text(text)
    return path


def test_a_saved_model_reads_back(tiny_backend, tmp_path):
    model = HonestModel(tiny_backend, "n-prob", threshold=Threshold(0.3), decoding=Decoding(max_new_tokens=3))
    folder = model.save_pretrained(tmp_path / "honest")
    config = read_config(folder)
    assert config["generator"]["model"] == tiny_backend.model_name
    assert config["confidence"] == {"kind": "estimator", "name": "n-prob", "samples": 0, "options": {}}
    assert config["threshold"]["value"] == 0.3 and config["version"] == model.version
    saved = read_folder(folder)
    assert (saved.generator, saved.confidence, saved.version) == (
        config["generator"],
        config["confidence"],
        model.version,
    )
    assert saved.threshold == Threshold(0.3) and saved.decoding == Decoding(max_new_tokens=3)


def test_a_missing_file_names_it(tmp_path):
    with pytest.raises(CandorError) as caught:
        read_config(tmp_path)
    assert str(caught.value) == f"{tmp_path / CONFIG_FILE}: no such file ({tmp_path} is not a saved honest model)"


def test_malformed_json_names_the_file_line_and_column(tmp_path):
    path = write(tmp_path, '{\n  "generator": {"model": "x"}\n  "confidence": {}\n}\n')
    with pytest.raises(CandorError) as caught:
        read_config(tmp_path)
    assert str(caught.value) == f"{path}:3: malformed JSON (Expecting ',' delimiter at column 3)"


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"generator": {"model": "x"}}, "missing the field 'confidence'"),
        ({"confidence": GOOD["confidence"]}, "missing the field 'generator'"),
        ({**GOOD, "generator": {"backend": "hf"}}, "missing the field 'generator.model'"),
        ({**GOOD, "confidence": "n-prob"}, "the field 'confidence' is not an object"),
        ([GOOD], "not an honest-model config (a JSON list, not an object)"),
    ],
)
def test_a_missing_field_is_named(tmp_path, config, says):
    path = write(tmp_path, json.dumps(config))
    with pytest.raises(CandorError) as caught:
        read_config(tmp_path)
    assert str(caught.value) == f"{path}: {says}"


def test_read_folder_gives_the_readers_error(tmp_path):
    path = write(tmp_path, json.dumps({"generator": {"model": "x"}}))
    with pytest.raises(CandorError) as caught:
        read_folder(tmp_path)
    assert str(caught.value) == f"{path}: missing the field 'confidence'"
    write(tmp_path, json.dumps(GOOD))
    assert read_folder(tmp_path).version.startswith("sha-")  # saved before versions existed: named by its digest
