"""lm-polygraph's own virtual environment: where it is, making it, and running the claim comparison in it.

lm-polygraph is heavy (spacy, sentence-transformers, ...), so it lives in its own venv:
``python -m venv``, then ``torch==2.13.0`` (the CPU wheel candor uses, so pip does not pull a CUDA
build), then ``lm-polygraph==0.7.0``. ``make polygraph-venv`` builds it (in ``.polygraph-venv`` of
the repository, or ``POLYGRAPH_VENV=DIR``) and prints the line that points candor at it: the
environment variable ``CANDOR_POLYGRAPH_PYTHON`` (:data:`PYTHON_ENV`) names the venv's python;
unset, the make target's default folder is looked in. The benchmarks run their
lm-polygraph side there as a child (``python -m benchmarks.NAME``, see :mod:`benchmarks.children`),
which imports nothing from candor. Imports nothing from candor itself either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.children import script_command, script_env

DEFAULT_VENV = Path(__file__).resolve().parents[1] / ".polygraph-venv"  # where `make polygraph-venv` builds it
PYTHON_ENV = "CANDOR_POLYGRAPH_PYTHON"  # the venv's python, e.g. /path/to/.polygraph-venv/bin/python
MAKE_TARGET = "make polygraph-venv"
ABSENT = f"lm-polygraph venv absent: build it with `{MAKE_TARGET}` and set {PYTHON_ENV} to its python"
PINS = ("torch==2.13.0", "lm-polygraph==0.7.0")  # in this order: torch first keeps the CPU build
CLAIMS_SCRIPT = "benchmarks.polygraph_claims"  # reads a JSON job on stdin, writes lm-polygraph's values


def polygraph_python(venv: Path | None = None) -> Path | None:
    """The venv's python when lm-polygraph imports there, else None (callers skip with :data:`ABSENT`).

    ``venv`` given: that folder's python. Else :data:`PYTHON_ENV` when set, else the make target's folder.
    """
    if venv is not None:
        python = venv / "bin" / "python"
    elif os.environ.get(PYTHON_ENV):
        python = Path(os.environ[PYTHON_ENV])
    else:
        python = DEFAULT_VENV / "bin" / "python"
    if not python.exists():
        return None
    probe = subprocess.run([str(python), "-c", "import lm_polygraph.estimators"], capture_output=True)
    return python if probe.returncode == 0 else None


def ensure_venv(venv: Path = DEFAULT_VENV) -> Path:
    """The venv's python, creating the venv (torch first, then lm-polygraph; several minutes) when needed."""
    python = polygraph_python(venv)
    if python is not None:
        return python
    print(f"creating {venv} (torch, then lm-polygraph; several minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    for pin in PINS:
        subprocess.run([str(python), "-m", "pip", "install", "-q", pin], check=True)
    return python


def run_polygraph(python: Path, job: dict[str, Any], timeout: float = 900) -> dict[str, list[list[float]]]:
    """lm-polygraph's claim estimators on ``job`` (``polygraph_claims.py`` under ``python``), by estimator name."""
    done = subprocess.run(
        script_command(CLAIMS_SCRIPT, python=python),
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=script_env(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"lm-polygraph child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)
