"""The console script turns usage errors into one line and exit 2 (docs/architecture.md "Conventions")."""

from __future__ import annotations

import pytest

from candor.cli import run


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["eval", "--no-such-option"], "No such option"),
        (["annotate", "--data", "starter", "--out", "x.jsonl", "--k", "many"], "'--k'"),
        (["score"], "candor score needs --records and --out (only `-e list` runs without them)"),
        (["score", "-r", "x.jsonl"], "candor score needs --out"),
        (["no-such-command"], "No such command"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and needle in err


def test_success_and_help_exit_0(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["datasets"])
    assert exit_info.value.code == 0
    with pytest.raises(SystemExit) as exit_info:
        run(["--help"])
    assert exit_info.value.code == 0
    assert "annotate" in capsys.readouterr().out


def test_candor_errors_keep_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["eval", "--confidences", str(tmp_path / "missing.jsonl"), "--out-dir", str(tmp_path / "r")])
    assert exit_info.value.code == 2
    assert "no such file" in capsys.readouterr().err


def test_score_list_needs_no_records_or_out(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # the table's rows whole, one per line
    with pytest.raises(SystemExit) as exit_info:
        run(["score", "-e", "list"])
    assert exit_info.value.code == 0
    names = capsys.readouterr().out.replace("│", " ").split()
    assert {"n-prob", "semantic-entropy", "consis-sem"} <= set(names)


def test_elical_without_a_head_names_the_command_line_option():
    from candor.estimators import get_estimator
    from candor.util.errors import CandorError

    with pytest.raises(CandorError, match="on the command line -O elical.head=<folder>"):
        _ = get_estimator("elical").head
