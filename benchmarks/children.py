"""Benchmark scripts run again as child processes: ``python -m benchmarks.NAME`` from any interpreter.

A script that measures in fresh processes (its own or another venv's interpreter) starts itself
again in a hidden child mode. The child runs as a module of this package, so it needs the
repository root on its path whatever the working folder or a replaced ``PYTHONPATH``:
:func:`script_env` puts it there. Imports nothing from candor (the lm-polygraph venv runs children too).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def script_command(module: str, *args: str, python: str | os.PathLike[str] = sys.executable) -> list[str]:
    """The command that runs benchmark ``module`` (``benchmarks.NAME``) under ``python`` with ``args``."""
    return [str(python), "-m", module, *args]


def script_env(base: Mapping[str, str] | None = None, *first: Path) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``first`` and then the repository root at the
    front of ``PYTHONPATH``, so a child started by :func:`script_command` imports ``benchmarks`` from anywhere."""
    env = dict(os.environ if base is None else base)
    paths = [*(str(p) for p in first), str(REPOSITORY), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env
