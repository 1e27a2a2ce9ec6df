"""``candor serve --factuality-alpha``: the options used or refused before the model loads (the served answer
refined at the tuned threshold, with its guarantee, is tested in tests/test_serve_claims.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from typer.testing import CliRunner  # noqa: E402

from candor.cli import app  # noqa: E402
from candor.serve import HonestModel  # noqa: E402
from candor.serve import factuality as fa  # noqa: E402
from candor.serve.honest_folder import add_factuality, read_folder  # noqa: E402


def dev_guarantee(below: float, alpha: float) -> fa.FactualityGuarantee:
    """A guarantee tuned on 20 dev answers whose false claims all have confidence ``below``: its threshold
    is the next float above it."""
    rows = [
        {"answer": f"a{i}", "correct": label, "failure": None, "confidence": {"claim-prob": value}}
        for i in range(20)
        for label, value in ((0, below), (1, 1.0))
    ]
    return fa.tune(fa.labelled_claims(rows, "claim-prob"), "claim-prob", alpha)


@pytest.fixture
def tuned_folder(tiny_backend, tmp_path):
    folder = tmp_path / "tuned"
    HonestModel(tiny_backend, confidence="n-prob", template="fewshot").save_pretrained(folder)
    add_factuality(folder, dev_guarantee(0.5, 0.3))
    assert read_folder(folder).factuality
    return folder


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--claims", "claim-prob", "--refine", "remove", "--factuality-alpha", "0.3"], "pass --honest DIR"),
        (
            ["--claims", "claim-prob", "--refine", "remove", "--factuality-alpha", "0.3", "--claim-threshold", "0.2"],
            "give one of them",
        ),
        (
            ["--claims", "claim-prob", "--refine", "mark", "--factuality-alpha", "0.3", "--honest", "{}"],
            "--refine remove",
        ),
        (["--claims", "claim-prob", "--factuality-alpha", "0.3", "--honest", "{}"], "needs --claims METHOD --refine"),
        (
            ["--claims", "claim-prob", "--refine", "remove", "--factuality-alpha", "0.1", "--honest", "{}"],
            "no factuality guarantee for claim-prob at alpha=0.1 (tuned: claim-prob at alpha=0.3)",
        ),
        (
            ["--claims", "claim-perplexity", "--refine", "remove", "--factuality-alpha", "0.3", "--honest", "{}"],
            "no factuality guarantee for claim-perplexity at alpha=0.3",
        ),
    ],
)
def test_factuality_options_are_used_or_refused(tuned_folder, tiny_model_dir, args, says):
    args = [a.replace("{}", str(tuned_folder)) for a in args]
    result = CliRunner().invoke(app, ["serve", "--model", tiny_model_dir, "--port", "1", *args])
    assert result.exit_code == 2 and says in result.output, result.output
