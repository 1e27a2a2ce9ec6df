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
