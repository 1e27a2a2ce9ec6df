"""The README's commands and docs/python-api.md's Python example run as written (on the embedded default).

Every command block of the README is a ```bash block, and each is either run here as a user would
paste it (in a fresh folder, ``candor`` on PATH) or, for the two setup commands, checked against
the Makefile instead (``make test`` is this suite; ``make demo`` sets up what the suite runs in).
Output shown in the README, not meant to run, goes in a ```text block.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from helpers import free_port, stop_group, wait_healthy

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


def readme_blocks() -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block of the README, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), re.S | re.M)


def commands(block: str) -> list[str]:
    """A bash block's commands as pasted: continuation lines joined, comments dropped."""
    lines = block.replace("\\\n", " ").splitlines()
    return [line.split("  #", 1)[0].strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_every_readme_block_is_a_command_block_or_shown_text():
    languages = [language for language, _ in readme_blocks()]
    assert set(languages) <= {"bash", "text"}, languages
    setup, *tour = [commands(body) for language, body in readme_blocks() if language == "bash"]
    assert setup == ["make demo", "make test"]
    assert tour and all(line.startswith(("candor ", "curl ")) for block in tour for line in block), tour


def test_the_two_setup_commands_do_what_the_readme_says():
    """``make demo`` sets up and runs the demo, ``make test`` runs this suite: read from the Makefile."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: setup\n\t\$\(BIN\)/candor demo$", makefile, re.M)
    assert re.search(r"^test: setup\b.*\n\t\$\(BIN\)/python -m pytest -q$", makefile, re.M)


def candor_on_path(folder: Path) -> str:
    """A PATH whose ``candor`` runs this checkout with this interpreter."""
    folder.mkdir()
    script = folder / "candor"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m candor.cli "$@"\n')
    script.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def start_server(line: str, log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """A README line ending in ``&``: the server, in its own process group."""
    with log.open("w") as sink:
        return subprocess.Popen(
            ["bash", "-c", "exec " + line.removesuffix("&")],
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.mark.server
@pytest.mark.integration
@pytest.mark.slow  # over a minute on 2 shared cores (make test-slow)
def test_every_readme_command_runs_as_written(smollm_dir, tmp_path):
    """The tour, line by line in bash in a fresh folder; a line ending in ``&`` is a server, started and
    waited for (``/ready``, then ``/health``), asked once more with the official client, and stopped.
    Only the port is made a free one."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    port = str(free_port())
    env = {
        **os.environ,
        "PATH": candor_on_path(tmp_path / "bin"),
        "PYTHONPATH": str(ROOT / "src"),
        "HF_HUB_OFFLINE": "1",
    }
    _, *tour = [commands(body) for language, body in readme_blocks() if language == "bash"]
    servers: list[subprocess.Popen] = []
    printed: dict[str, str] = {}  # each command's first word after the program, e.g. "ask", and its stdout
    try:
        for line in (re.sub(r"\b8000\b", port, line) for block in tour for line in block):
            if line.endswith("&"):
                log = tmp_path / f"server{len(servers)}.log"
                servers.append(start_server(line, log, env, tmp_path))
                wait_healthy(f"http://127.0.0.1:{port}/ready", servers[-1], log=log)
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as health:
                    assert health.status == 200
                continue
            run = subprocess.run(
                ["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
            )
            assert run.returncode == 0, f"{line}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
            printed[line.split()[0] if line.startswith("curl") else line.split()[1]] = run.stdout
        assert len((tmp_path / "runs" / "starter.jsonl").read_text().splitlines()) == 20
        assert (tmp_path / "runs" / "starter.conf.jsonl").is_file()
        assert (tmp_path / "runs" / "report" / "report.html").is_file()
        assert "confidence" in printed["ask"]
        confidence = json.loads(printed["curl"])["choices"][0]["confidence"]
        assert 0.0 <= confidence["value"] <= 1.0 and confidence["threshold"] == 0.3
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        question = [{"role": "user", "content": "Who wrote Hamlet?"}]
        choice = client.chat.completions.create(model="candor", messages=question).choices[0]
        abstained = choice.model_extra["confidence"]["abstained"]
        assert choice.finish_reason in ("stop", "length")
        assert not abstained or choice.message.content == "I don't know."  # --abstain-as text, the default
    finally:
        for server in servers:
            stop_group(server, grace=60)
    assert servers and [server.returncode for server in servers] == [0] * len(servers)  # SIGTERM drains, exits 0


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
