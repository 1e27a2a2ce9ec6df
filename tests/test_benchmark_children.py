"""benchmarks.children: a benchmark script started again as a child finds the package from any folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.children import REPOSITORY, script_command, script_env

ROOT = Path(__file__).resolve().parents[1]


def test_the_command_runs_the_module_under_the_interpreter_given():
    assert script_command("benchmarks.x", "--child", "a") == [sys.executable, "-m", "benchmarks.x", "--child", "a"]
    assert script_command("benchmarks.x", python=Path("/venv/bin/python"))[:2] == ["/venv/bin/python", "-m"]


def test_the_environment_puts_the_given_paths_then_the_repository_first():
    env = script_env({"PYTHONPATH": "/old", "OTHER": "1"}, Path("/src"))
    assert REPOSITORY == ROOT
    assert env["PYTHONPATH"].split(os.pathsep) == ["/src", str(ROOT), "/old"] and env["OTHER"] == "1"
    assert script_env({})["PYTHONPATH"] == str(ROOT)


def test_a_child_started_elsewhere_imports_the_package(tmp_path):
    base = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": ""}
    command = script_command("benchmarks.startup", "--help")  # argparse only: a fast script's --help
    started = subprocess.run(
        command, cwd=tmp_path, env=script_env(base, ROOT / "src"), capture_output=True, text=True, timeout=300
    )
    assert started.returncode == 0 and started.stdout.startswith("usage:"), started.stderr
    # Without the repository on its path, a child in another folder cannot find the package.
    lost = subprocess.run(command, cwd=tmp_path, env=base, capture_output=True, text=True, timeout=300)
    assert lost.returncode != 0 and "No module named 'benchmarks'" in lost.stderr
