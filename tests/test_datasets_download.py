"""`candor datasets --download`: the named datasets fetched from mirrors laid out like their public sources."""

from __future__ import annotations

import functools
import json
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from candor.cli import app
from candor.data import load_items, resolve_data_dir
from candor.data.download import SOURCES, download_datasets, downloadable
from candor.util.errors import CandorError

# The documented formats: HonestyBench's raw QA lines, and LogiQA 2.0's test.txt (one JSON object per line).
QA_FILES = [
    "nq/test.jsonl",
    "hq/dev.jsonl",
    "2wikimultihopqa/dev.jsonl",
    "pararel_patterns/test.jsonl",
    "squad/dev.jsonl",
    "musique/dev.jsonl",
    "musique/train.jsonl",
]
LOGIQA = [
    {
        "id": 7,
        "answer": 2,
        "text": "Every A is B.",
        "question": "Which follows?",
        "options": ["w", "x", "y", "z"],
        "type": {"Categorical Reasoning": True},
    }
]


@pytest.fixture()
def mirror(tmp_path) -> Path:
    """A copy of the EliCal repository's data/ folder and of LogiQA 2.0's data folder, file by file."""
    root = tmp_path / "mirror"
    for rel in QA_FILES:
        path = root / "elical" / "data" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"question": f"{rel}?", "answer": ["x", "y"]}) + "\n")
    logiqa = root / "logiqa2" / "logiqa" / "DATA" / "LOGIQA" / "test.txt"
    logiqa.parent.mkdir(parents=True)
    logiqa.write_text("".join(json.dumps(row) + "\n" for row in LOGIQA))
    return root


@pytest.fixture()
def http_mirror(mirror, monkeypatch):
    """The mirror behind a real HTTP server on 127.0.0.1, the sources pointed at it through their variables."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(mirror))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("CANDOR_ELICAL_QA_URL", f"{base}/elical/data")
    monkeypatch.setenv("CANDOR_LOGIQA2_URL", f"{base}/logiqa2/logiqa/DATA/LOGIQA")
    yield base
    server.shutdown()
    server.server_close()


def test_every_named_dataset_but_the_builtin_one_has_a_source():
    assert set(downloadable()) == {
        "nq",
        "hq",
        "2wikimultihopqa",
        "pararel",
        "squad",
        "musique",
        "musique-train",
        "logiqa",
    }
    assert SOURCES.get("elical-qa").base_url.startswith("https://raw.githubusercontent.com/")
    assert set(SOURCES.get("elical-qa").files) == set(QA_FILES)


def test_download_from_file_urls_gives_loadable_datasets(mirror, tmp_path):
    data = tmp_path / "data"
    sources = {
        "elical-qa": (mirror / "elical" / "data").as_uri(),
        "logiqa2": (mirror / "logiqa2" / "logiqa" / "DATA" / "LOGIQA").as_uri(),
    }
    fetched = download_datasets(data_dir=data, sources=sources)
    assert {f.name for f in fetched} == set(downloadable()) and not any(f.already_there for f in fetched)
    assert load_items("squad", data_dir=data)[0].answers == ("x", "y")
    (item,) = load_items("logiqa", data_dir=data)
    assert (data / "logiqa2" / "test.jsonl").is_file() and item.answers[0] == "C"  # the letter, then the option


def test_cli_download_over_http_then_list(http_mirror, tmp_path):
    data = tmp_path / "data"
    runner = CliRunner()
    first = runner.invoke(app, ["datasets", "--download", "nq", "logiqa", "--data-dir", str(data)])
    assert first.exit_code == 0, first.output
    assert f"nq: fetched: {data / 'nq' / 'test.jsonl'}" in first.output
    again = runner.invoke(app, ["datasets", "--download", "nq", "--data-dir", str(data)])
    assert "nq: already there" in again.output
    listed = {
        line.split(" ", 1)[0]: line
        for line in runner.invoke(app, ["datasets", "--data-dir", str(data)]).output.splitlines()
    }
    assert listed["nq"].endswith(str(data / "nq" / "test.jsonl"))
    # What is missing says how to get it.
    assert listed["squad"].endswith(f"get it with `candor datasets --download squad --data-dir {data}`")
    assert "huggingface.co/datasets/Shiyunee/HonestyBench" in listed["Also:"]


def test_a_fetched_file_that_is_not_the_dataset_is_not_kept(mirror, http_mirror, tmp_path):
    (mirror / "elical" / "data" / "hq" / "dev.jsonl").write_text("<html>moved</html>\n")
    data = tmp_path / "data"
    result = CliRunner().invoke(app, ["datasets", "--download", "hq", "--data-dir", str(data)])
    assert result.exit_code == 2 and "is not the dataset" in result.output
    assert not (data / "hq" / "dev.jsonl").exists()
    (mirror / "elical" / "data" / "squad" / "dev.jsonl").unlink()
    with pytest.raises(CandorError, match=r"could not fetch http://.*/squad/dev\.jsonl .*set CANDOR_ELICAL_QA_URL"):
        download_datasets(["squad"], data)
    with pytest.raises(CandorError, match="built in"):
        download_datasets(["starter"], data)


def test_default_data_dir_is_candors_own_folder(http_mirror, tmp_path, monkeypatch):
    monkeypatch.delenv("CANDOR_DATA_DIR", raising=False)
    monkeypatch.setenv("CANDOR_CACHE", str(tmp_path / "cache"))
    with pytest.raises(CandorError, match="run `candor datasets --download`"):
        resolve_data_dir()
    result = CliRunner().invoke(app, ["datasets", "--download", "musique"])
    assert result.exit_code == 0, result.output
    assert resolve_data_dir() == tmp_path / "cache" / "data"
    assert load_items("musique")[0].question == "musique/dev.jsonl?"


def test_names_without_download_are_refused():
    result = CliRunner().invoke(app, ["datasets", "nq"])
    assert result.exit_code == 2 and "are for --download" in result.output
