"""The paper's judge protocol in annotation: llm judges on a separate model, recorded in provenance."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from candor.annotation.builder import AnnotateConfig, annotate
from candor.annotation.judges import (
    DEFAULT_CONSISTENCY_JUDGE,
    consistency_prompt,
    correctness_prompt,
    get_correctness_judge,
    verdict_parsed,
)
from candor.annotation.prompts import TEMPLATES, QATemplate
from candor.annotation.records import read_records
from candor.annotation.text_matching import is_empty_answer
from candor.backends.base import SamplingParams
from candor.backends.hf import HFBackend
from candor.cli import app
from candor.data.items import QAItem

ITEMS = [
    QAItem(id="t:0", dataset="toy", split="test", question="What is the capital of France?", answers=("Paris",)),
    QAItem(id="t:1", dataset="toy", split="test", question="Who wrote Hamlet?", answers=("Shakespeare",)),
]


def test_llm_judges_on_a_judge_backend_record_model_and_parse_failures(tiny_backend, tiny_model, tokenizer, tmp_path):
    from candor.backends.hf import HFBackend

    judge = HFBackend(tiny_model, tokenizer, model_name="the-judge", batch_size=4)
    config = AnnotateConfig(
        k=2, params=SamplingParams(max_new_tokens=4), batch_size=2, correctness_judge="llm", consistency_judge="llm"
    )
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
        expected_asked = sum(bool(a.strip()) for a in answers) + sum(
            not (is_empty_answer(a) or is_empty_answer(b)) for a, b in pairs
        )
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
    args = [
        "annotate",
        "--data",
        str(data),
        "--out",
        str(out),
        "--model",
        str(tiny_model_dir),
        "--k",
        "1",
        "--max-new-tokens",
        "4",
        "--template",
        "fewshot",
        "--judge",
        "llm",
        "--judge-model",
        str(tiny_model_dir),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rec = read_records(out)[0]
    assert rec.provenance["correctness_judge"] == "llm"
    assert rec.provenance["judges"]["correctness"]["model"] == str(tiny_model_dir)
    assert rec.provenance["judges"]["consistency"]["name"] == DEFAULT_CONSISTENCY_JUDGE
    assert "judge_parse" in rec.provenance


# The tiny random model repeats a prompt's last token, so a prompt ending in a cue fixes the greedy answer:
# "Paris Paris Paris" for "Paris", "! ! !" (an empty answer: no letter or digit) for "!". Records whose answers
# differ in emptiness are asked different numbers of judge questions.
CUES = {"t:0": "Paris", "t:1": "!", "t:2": "Mars"}
ECHO_CUE = QATemplate("echo-cue", lambda item, _: f"Question: {item.question}\nAnswer: {CUES[item.id]}", ("\n",))
THREE_ITEMS = [
    *ITEMS,
    QAItem(
        id="t:2", dataset="toy", split="test", question="Which planet is known as the Red Planet?", answers=("Mars",)
    ),
]


class PromptKeepingBackend(HFBackend):
    """The real tiny judge model, keeping every prompt it was given (what the judges asked, in order)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prompts: list[str] = []

    def generate(self, prompts, n, params, **kwargs):
        self.prompts += list(prompts)
        return super().generate(prompts, n, params, **kwargs)


def test_llm_judges_are_asked_about_each_answer_with_its_own_question(tiny_backend, tiny_model, tokenizer, tmp_path):
    judge_backend = PromptKeepingBackend(tiny_model, tokenizer, model_name="the-judge", batch_size=4)
    config = AnnotateConfig(
        k=2,
        params=SamplingParams(max_new_tokens=3, top_k=2),
        batch_size=3,
        correctness_judge="llm",
        consistency_judge="llm",
    )
    out = tmp_path / "r.jsonl"
    annotate(THREE_ITEMS, tiny_backend, out, ECHO_CUE, config, judge_backend=judge_backend, progress=False)
    records = read_records(out)
    assert [r.greedy.text for r in records] == ["Paris Paris Paris", "! ! !", "Mars Mars Mars"]
    # One batch of three records: every correctness question (each non-blank answer with its item's question
    # and aliases), then every consistency question (each sample beside its greedy answer, both non-empty).
    render = get_correctness_judge("llm", backend=judge_backend).render
    correctness = [
        render(correctness_prompt(answer, rec.item.answers, rec.item.question, "paper"))
        for rec in records
        for answer in [rec.greedy.text, *(s.text for s in rec.samples)]
        if answer.strip()
    ]
    consistency = [
        render(consistency_prompt(s.text, rec.greedy.text, rec.item.question, "paper"))
        for rec in records
        for s in rec.samples
        if not (is_empty_answer(s.text) or is_empty_answer(rec.greedy.text))
    ]
    assert judge_backend.prompts == correctness + consistency
    # Each record's parse counts cover its own answers: the middle record, whose greedy answer is empty, is
    # asked no consistency question, so its count differs from its neighbours' and a misplaced window shows.
    asked = [r.provenance["judge_parse"]["asked"] for r in records]
    expected = [
        sum(bool(a.strip()) for a in [r.greedy.text, *(s.text for s in r.samples)])
        + sum(not (is_empty_answer(s.text) or is_empty_answer(r.greedy.text)) for s in r.samples)
        for r in records
    ]
    assert asked == expected and asked[1] < min(asked[0], asked[2])
    assert [r.provenance["judge_parse"]["unparsed"] for r in records] == asked  # the tiny judge states no verdict
