"""docs/python-api.md's Python example runs as written (on the embedded default), and the README stands alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PYTHON_API = DOCS / "python-api.md"  # where the README's "Python API" section moved


def python_example() -> str:
    section = PYTHON_API.read_text().split("# Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/python-api.md has no python block"
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
    exec(compile(code, str(PYTHON_API), "exec"), {})
    out = capsys.readouterr().out
    assert "n-prob" in out and "consis-sem" in out
    records = (tmp_path / "runs" / "starter.jsonl").read_text().splitlines()
    assert len(records) == 8


def user_docs() -> str:
    """The README and every docs page: what a user outside the project reads."""
    return "\n".join(path.read_text() for path in [README, *sorted(DOCS.glob("**/*.md"))])


def test_readme_stands_alone_and_no_install_line_can_fetch_someone_elses_package():
    import tomllib

    text = user_docs()
    # "candor" on PyPI is an unrelated project: the distribution has its own name, the import name stays.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
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


def test_the_docs_name_every_dataset_source_the_download_uses():
    from candor.data.download import SOURCES

    text = (DOCS / "annotate.md").read_text()  # "Datasets: where they come from"
    for name in SOURCES.names():
        source = SOURCES.get(name)
        repo = source.base_url.split("githubusercontent.com/", 1)[1].split("/")[:2]
        assert "/".join(repo) in text, name
        assert source.env in text, name
    assert "candor datasets --download" in text and "huggingface.co/datasets/Shiyunee/HonestyBench" in text
