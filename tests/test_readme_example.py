"""The README's Python example runs as written (on the embedded default model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_example() -> str:
    section = README.read_text().split("### Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's Python API section has no python block"
    return match.group(1)


def test_front_door_names_are_exported():
    import candor

    for name in ("load_model", "annotate", "score", "evaluate"):
        assert callable(getattr(candor, name))
    with pytest.raises(AttributeError):
        candor.no_such_name  # noqa: B018


@pytest.mark.integration
def test_readme_python_example_runs(smollm_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = python_example()
    assert len(code.strip().splitlines()) == 3
    exec(compile(code, str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "n-prob" in out and "consis-sem" in out
    records = (tmp_path / "runs" / "starter.jsonl").read_text().splitlines()
    assert len(records) == 8


def test_readme_stands_alone_and_no_install_line_can_fetch_someone_elses_package():
    import tomllib

    text = README.read_text()
    # "candor" on PyPI is an unrelated project: the distribution has its own name, the import name stays.
    pyproject = tomllib.loads((README.parent / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "candor-honesty"
    assert pyproject["project"]["scripts"]["candor"].startswith("candor.")
    installs = re.findall(r"pip install[^`\n]*", text)
    assert installs
    for line in installs:
        assert not re.search(r"pip install\s+(-U\s+)?['\"]?candor\b", line), line  # PyPI's candor, not ours
    for extra in ("serve", "vllm", "openai"):
        assert f"pip install -e '.[{extra}]'" in text
    # Nothing a user outside the project lacks: the design notes, the shared data, this machine.
    for needle in ("../shared", "DESIGN.md", "§", "/work/", "local cache", "this project's"):
        assert needle not in text, needle


def test_readme_names_every_dataset_source_the_download_uses():
    from candor.data.download import SOURCES

    text = README.read_text()
    for name in SOURCES.names():
        source = SOURCES.get(name)
        repo = source.base_url.split("githubusercontent.com/", 1)[1].split("/")[:2]
        assert "/".join(repo) in text, name
        assert source.env in text, name
    assert "candor datasets --download" in text and "huggingface.co/datasets/Shiyunee/HonestyBench" in text
