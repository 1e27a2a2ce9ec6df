"""The paper's judge protocol in annotation: llm judges on a separate model, recorded in provenance."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from candor.annotation.builder import AnnotateConfig, annotate
from candor.annotation.judges import DEFAULT_CONSISTENCY_JUDGE, is_empty_answer, verdict_parsed
from candor.annotation.prompts import TEMPLATES
from candor.annotation.records import read_records
from candor.backends.base import SamplingParams
from candor.cli import app
from candor.data.items import QAItem

ITEMS = [
    QAItem("t:0", "toy", "test", "What is the capital of France?", ("Paris",)),
    QAItem("t:1", "toy", "test", "Who wrote Hamlet?", ("Shakespeare",)),
]


def test_llm_judges_on_a_judge_backend_record_model_and_parse_failures(tiny_backend, tiny_model, tokenizer, tmp_path):
    from candor.backends.hf import HFBackend

    judge = HFBackend(tiny_model, tokenizer, model_name="the-judge", batch_size=4)
    config = AnnotateConfig(k=2, params=SamplingParams(max_new_tokens=4), batch_size=2,
                            correctness_judge="llm", consistency_judge="llm")
    out = tmp_path / "r.jsonl"
    annotate(ITEMS, tiny_backend, out, TEMPLATES.get("fewshot"), config, judge_backend=judge, progress=False)
    records = read_records(out)
    assert len(records) == 2
    for rec in records:
        judges = rec.provenance["judges"]
        assert judges["correctness"]["model"] == "the-judge" and judges["correctness"]["style"] == "paper"
        assert judges["consistency"]["model"] == "the-judge"
        counts = rec.provenance["judge_parse"]
        answers = [rec.greedy.text, *(s.text for s in rec.samples)]
        pairs = [(rec.greedy.text, s.text) for s in rec.samples]
        # A pair with an empty answer (no letter or digit) is not equivalent and is not asked.
        expected_asked = (sum(bool(a.strip()) for a in answers)
                          + sum(not (is_empty_answer(a) or is_empty_answer(b)) for a, b in pairs))
        assert counts["asked"] == expected_asked
        # The tiny random judge states a verdict in none of these replies: every asked reply of both judges,
        # correctness and consistency, counts as unparsed (a count of one judge alone would be smaller).
        assert counts["unparsed"] == counts["asked"]
    # The tiny random judge rarely says "certain"/"uncertain": unparsed replies are counted, not hidden.
    total_asked = sum(r.provenance["judge_parse"]["asked"] for r in records)
    assert total_asked > 0
    assert not verdict_parsed("Paris")


def test_cli_judge_model_runs_the_llm_judge_on_another_model(tiny_model_dir, tmp_path: Path):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": it.question, "answer": list(it.answers)}) + "\n" for it in ITEMS))
    out = tmp_path / "out.jsonl"
    args = ["annotate", "--data", str(data), "--out", str(out), "--model", str(tiny_model_dir), "--k", "1",
            "--max-new-tokens", "4", "--template", "fewshot", "--judge", "llm", "--judge-model", str(tiny_model_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rec = read_records(out)[0]
    assert rec.provenance["correctness_judge"] == "llm"
    assert rec.provenance["judges"]["correctness"]["model"] == str(tiny_model_dir)
    assert rec.provenance["judges"]["consistency"]["name"] == DEFAULT_CONSISTENCY_JUDGE
    assert "judge_parse" in rec.provenance
