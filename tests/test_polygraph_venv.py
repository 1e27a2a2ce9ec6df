"""Where the lm-polygraph agreement tests find lm-polygraph's venv: an environment variable, built by a make target.

A fixed machine path made the agreement tests skip on every other machine without saying how to run them.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from benchmarks.polygraph import ABSENT, DEFAULT_VENV, MAKE_TARGET, PYTHON_ENV, polygraph_python

ROOT = Path(__file__).resolve().parents[1]


def interpreter(folder: Path, imports: bool) -> Path:
    """An executable that answers the import probe with success (``imports``) or failure."""
    path = folder / "python"
    path.write_text(f"#!/bin/sh\nexit {0 if imports else 1}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_venv_python_comes_from_the_environment_variable(tmp_path, monkeypatch):
    found = interpreter(tmp_path, imports=True)
    monkeypatch.setenv(PYTHON_ENV, str(found))
    assert PYTHON_ENV == "CANDOR_POLYGRAPH_PYTHON" and polygraph_python() == found


def test_a_python_without_lm_polygraph_or_absent_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv(PYTHON_ENV, str(interpreter(tmp_path, imports=False)))
    assert polygraph_python() is None
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "missing" / "python"))
    assert polygraph_python() is None


def test_the_default_is_the_make_targets_folder_in_the_repository_and_the_skip_names_the_target():
    assert DEFAULT_VENV == ROOT / ".polygraph-venv" and not str(DEFAULT_VENV).startswith("/work/polygraph")
    assert MAKE_TARGET in ABSENT and PYTHON_ENV in ABSENT
    makefile = (ROOT / "Makefile").read_text()
    target = MAKE_TARGET.split()[1]
    assert re.search(rf"^{target}:", makefile, re.M), f"the Makefile has no {target} target"
    assert "POLYGRAPH_VENV ?= .polygraph-venv" in makefile and PYTHON_ENV in makefile
