"""`candor adapt`: a served honest model recalibrated on its labelled traffic (issue 43, items 3 and 5).

A tiny random Llama serves two kinds of questions; the labels say one kind is answered right and the
other wrong. Adapting must learn that from the labels (held-out AUROC), regenerate the samples the
head-served log lacks, hold the threshold's labels out of both stages, bump the version, and refuse
too few labels with the number it needs.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from candor.annotation.records import Record
from candor.annotation.served_labels import append_label
from candor.annotation.text_matching import normalize
from candor.backends.base import Completion
from candor.backends.hf import HFBackend
from candor.cli.commands import run
from candor.serve import Decoding, HonestModel
from candor.serve import thresholds as th
from candor.serve.adaptation import AdaptSettings, Lineage, NotEnoughLabels, labels_needed, split_labels
from candor.serve.confidence_sources import HeadSource, served_item
from candor.train.common import load_causal_lm
from candor.train.elical import ConfidenceHead, HeadConfig
from candor.util.errors import CandorError

RIGHT = [f"What is the capital of country number {i}?" for i in range(30)]
WRONG = [f"How many legs does the animal in picture {i} have, counting twice?" for i in range(30)]


PESSIMIST = "judge:pessimist"  # a judge that calls every answer wrong, labelling after the person did


@pytest.fixture(scope="module")
def deployment(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """A saved honest model with a head, and its served log: 60 questions, 40 of them labelled by a person (and
    later, all wrong, by a judge)."""
    root = tmp_path_factory.mktemp("deployment")
    lm, tokenizer = load_causal_lm(tiny_model_dir, device="cpu")
    head = ConfidenceHead.create(lm, tokenizer, HeadConfig(backbone=tiny_model_dir, template="fewshot"), seed=3)
    backend = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    honest = HonestModel(
        backend, HeadSource(head), threshold=0.5, template="fewshot", decoding=Decoding(max_new_tokens=3)
    ).save_pretrained(root / "honest")
    return honest, served_log(root / "served.jsonl")


def served_log(log: Path, history: tuple[tuple[str, str], ...] = ()) -> Path:
    """60 questions served after ``history``, 40 of them labelled by a person (and later, all wrong, by a judge)."""
    with log.open("w") as fh:  # what --log-records writes for a head source: the answer, no samples
        for i, question in enumerate(q for pair in zip(RIGHT, WRONG, strict=True) for q in pair):
            served = {"id": f"chatcmpl-{i}", "indexes": [0], "returned": ["x"]}
            record = Record(
                item=served_item(question, history), greedy=Completion("x"), samples=[], provenance={"served": served}
            )
            fh.write(json.dumps(record.to_dict()) + "\n")
    for i in range(40):
        append_label(log, f"chatcmpl-{i}", 0, i % 2 == 0, "human")
    for i in range(40):
        append_label(log, f"chatcmpl-{i}", 0, False, PESSIMIST)
    return log


def test_labels_needed_is_the_held_out_evidence_plus_stage_two() -> None:
    # The held-out threshold runs three fixed sequences at δ/3 each (thresholds.SPLIT_STARTS), so zero errors certify
    # alpha=0.1 from ceil(ln(0.1/3) / ln 0.9) = 33 answered held out: 65 labels (33 held out, 32 for stage 2)
    assert th.min_evidence(0.1, 0.1) == 22 and th.min_evidence(0.1, 0.1 / 3) == 33
    assert labels_needed(0.1, 0.1, 0.5) == 65
    # alpha=0.5: 5 held out suffice, so stage 2's minimum of 10 decides: 20 (10 + 10)
    assert labels_needed(0.5, 0.1, 0.5) == 20
    assert labels_needed(0.05, 0.1, 0.5) == 2 * math.ceil(math.log(0.1 / 3) / math.log(0.95)) - 1


def test_the_split_is_seeded_and_disjoint() -> None:
    records = [Record(item=served_item(q), greedy=Completion("x"), samples=[], greedy_correct=1) for q in RIGHT]
    stage2, held = split_labels(records, AdaptSettings(alpha=0.5))
    again = split_labels(records, AdaptSettings(alpha=0.5))
    assert (len(stage2), len(held)) == (15, 15)
    assert [r.id for r in stage2] == [r.id for r in again[0]]
    assert not {r.id for r in stage2} & {r.id for r in held}


def test_a_question_served_several_times_lands_on_one_side() -> None:
    """Issue 53, defect 5: the split is by question text (normalized), not by record.

    Fails on the old code, which split the records: a repeated question landed on both sides, so the
    threshold was certified on questions stage 2 trained on.
    """
    spellings = ("{}", "  {} ", "{}?!", "{}".upper())
    records = [
        Record(item=served_item(form.format(f"Who founded city number {i}")), greedy=Completion("x"), samples=[])
        for i in range(12)
        for form in spellings[: 1 + i % 4]  # 1 to 4 servings of each question, spelled differently
    ]
    records = [replace(r, greedy_correct=1) for r in records]
    for seed in range(5):
        stage2, held = split_labels(records, AdaptSettings(alpha=0.5, seed=seed))
        assert len(stage2) + len(held) == len(records) == 30
        assert not {normalize(r.item.question) for r in stage2} & {normalize(r.item.question) for r in held}
        assert len(held) >= 15 and len(stage2) >= 10


def test_repeats_that_leave_stage_two_too_few_labels_are_refused() -> None:
    records = [
        replace(Record(item=served_item("Is it raining?"), greedy=Completion("x"), samples=[]), greedy_correct=1)
        for _ in range(30)
    ]
    with pytest.raises(NotEnoughLabels, match="on 1 distinct questions: .* 0 are left for stage 2"):
        split_labels(records, AdaptSettings(alpha=0.5))


@pytest.fixture(scope="module")
def adapted(deployment, tmp_path_factory) -> tuple[Path, str]:
    """`candor adapt` run once on the deployment, with --export seq-cls; its folder and what it printed."""
    honest, log = deployment
    out = tmp_path_factory.mktemp("adapt") / "adapted"
    with pytest.raises(SystemExit) as done:
        run(
            [
                "adapt",
                str(log),
                "--honest",
                str(honest),
                "-o",
                str(out),
                "--alpha",
                "0.5",
                "--k",
                "3",
                "--export",
                "seq-cls",
            ]
        )
    assert done.value.code == 0
    return out, out.with_name("adapted-cls")


def test_adapt_learns_the_labels_and_writes_a_new_version(deployment, adapted) -> None:
    out, exported = adapted
    summary = json.loads((out / "adapt.json").read_text())
    counts = summary["counts"]
    assert counts["served_questions"] == 60 and counts["labelled_answers"] == 40 and counts["labels_used"] == 40
    # the person's labels: the judge's later ones are from a source not trusted by default, and hide nothing
    assert summary["labels"]["by_source"] == {"human": {"used": 40}, PESSIMIST: {"untrusted_source": 40}}
    assert summary["settings"]["label_sources"] == ["human", "audit"]
    assert summary["guarantee_exercised"] is (counts["held_out_answered"] > 0)
    assert (counts["stage2_labels"], counts["held_out_labels"]) == (20, 20)
    # stage 1 reads every served question but the 20 held out, each resampled (the log had no samples)
    assert counts["stage1_questions"] == counts["samples_regenerated_for"] == 40
    assert summary["held_out"]["auroc"] >= 0.9  # the two kinds of question, told apart from 20 labels
    version = json.loads((out / "honest.json").read_text())["version"]
    assert isinstance(version, str) and version and summary["version"] == version and summary["generation"] == 1
    assert summary["adapted_from"] == Lineage.of(deployment[0]).version != version
    model = HonestModel.from_pretrained(out)
    assert model.threshold.to_dict() == summary["threshold"] and model.threshold.rule == "risk"
    assert isinstance(model.source, HeadSource)
    right, wrong = model.source.score_questions(RIGHT[-5:]), model.source.score_questions(WRONG[-5:])
    assert np.mean(right) > np.mean(wrong)
    assert (exported / "candor_export.json").exists()


def test_adapt_prints_the_guarantee_and_the_engine_commands(deployment, tmp_path, capsys) -> None:
    honest, log = deployment
    with pytest.raises(SystemExit) as done:
        run(
            [
                "adapt",
                str(log),
                "--honest",
                str(honest),
                "-o",
                str(tmp_path / "a"),
                "--alpha",
                "0.5",
                "--k",
                "2",
                "--export",
                "seq-cls",
                "--export-dir",
                str(tmp_path / "cls"),
            ]
        )
    printed = capsys.readouterr().out
    assert done.value.code == 0
    assert f"version {json.loads((tmp_path / 'a' / 'honest.json').read_text())['version']};" in printed
    assert "with probability at least 0.9" in printed or "abstains on everything" in printed
    assert f"vllm serve {tmp_path / 'cls'}" in printed and "--confidence-url" in printed and "--threshold" in printed


def test_adapting_again_bumps_the_version(deployment, adapted, tmp_path) -> None:
    _, log = deployment
    with pytest.raises(SystemExit) as done:
        run(["adapt", str(log), "--honest", str(adapted[0]), "-o", str(tmp_path / "v2"), "--alpha", "0.5", "--k", "2"])
    assert done.value.code == 0
    first, second = (json.loads((folder / "adapt.json").read_text()) for folder in (adapted[0], tmp_path / "v2"))
    assert (second["generation"], second["adapted_from"]) == (2, first["version"])
    assert json.loads((tmp_path / "v2" / "honest.json").read_text())["version"] == second["version"] != first["version"]


def test_too_few_labels_is_refused_with_the_number_needed(deployment, tmp_path, capsys) -> None:
    honest, log = deployment
    with pytest.raises(SystemExit) as done:
        run(["adapt", str(log), "--honest", str(honest), "-o", str(tmp_path / "x"), "--alpha", "0.1"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "40 labelled answers" in err and "needs at least 65 (25 more)" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--export", "onnx"], "unknown format"),
        (["--export-dir", "d"], "needs --export seq-cls"),
        (["--alpha", "1.5"], "alpha must be in (0, 1)"),
        (["--holdout", "0"], "held-out share"),
    ],
)
def test_bad_options_are_refused(deployment, tmp_path, capsys, extra, message) -> None:
    honest, log = deployment
    with pytest.raises(SystemExit) as done:
        run(["adapt", str(log), "--honest", str(honest), "-o", str(tmp_path / "x"), *extra])
    assert done.value.code == 2 and message in capsys.readouterr().err


def test_a_malformed_honest_model_is_named_with_its_line(deployment, tmp_path, capsys) -> None:
    _, log = deployment
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "honest.json").write_text('{\n  "generator": {"model": "x"}\n  "confidence": {}\n}\n')
    with pytest.raises(SystemExit) as done:
        run(["adapt", str(log), "--honest", str(broken), "-o", str(tmp_path / "x"), "--alpha", "0.5"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {broken / 'honest.json'}:3: malformed JSON (Expecting ',' delimiter"), err
    assert not (tmp_path / "x").exists()


def test_the_lineage_names_a_malformed_summary(tmp_path) -> None:
    (tmp_path / "honest.json").write_text(json.dumps({"generator": {"model": "x"}, "confidence": {}, "version": "v3"}))
    (tmp_path / "adapt.json").write_text('{"generation": 2')
    with pytest.raises(CandorError, match="^" + re.escape(f"{tmp_path / 'adapt.json'}: cannot read it (")):
        Lineage.of(tmp_path)
    (tmp_path / "adapt.json").write_text('{"generation": 2}')
    assert Lineage.of(tmp_path) == Lineage("v3", 2)


def test_a_model_served_without_a_head_gets_a_fresh_one(deployment, tiny_model_dir, tmp_path) -> None:
    _, log = deployment
    backend = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    honest = HonestModel(
        backend, "n-prob", threshold=0.2, template="fewshot", decoding=Decoding(max_new_tokens=3)
    ).save_pretrained(tmp_path / "nprob")
    with pytest.raises(SystemExit) as done:
        run(["adapt", str(log), "--honest", str(honest), "-o", str(tmp_path / "out"), "--alpha", "0.5", "--k", "2"])
    assert done.value.code == 0
    config = json.loads((tmp_path / "out" / "honest.json").read_text())
    assert config["confidence"]["kind"] == "head" and config["version"] != Lineage.of(honest).version
    head = ConfidenceHead.from_pretrained(tmp_path / "out" / "head")
    assert head.config.template == "fewshot" and head.config.backbone == tiny_model_dir


def test_a_guarantee_no_held_out_answer_exercised_says_so(deployment, tmp_path, capsys) -> None:
    """Issue 53, defect 7: trusting only the judge that calls everything wrong, no threshold answers anything.

    Fails on the old code, whose report named no "not exercised (0 answered)" (and had no --label-sources).
    """
    honest, log = deployment
    args = ["adapt", str(log), "--honest", str(honest), "-o", str(tmp_path / "a"), "--alpha", "0.5", "--k", "2"]
    with pytest.raises(SystemExit) as done:
        run([*args, "--label-sources", "judge:*"])
    printed = capsys.readouterr().out
    assert done.value.code == 0, printed
    summary = json.loads((tmp_path / "a" / "adapt.json").read_text())
    assert summary["counts"]["held_out_answered"] == 0 and summary["guarantee_exercised"] is False
    assert summary["guarantee"].startswith("not exercised (0 answered)")
    assert "guarantee: not exercised (0 answered)" in printed
    assert f"{PESSIMIST} 40 used" in printed and "human 0 used, 40 ignored (40 untrusted_source)" in printed


def test_labels_from_no_trusted_source_are_refused_with_the_sources_named(deployment, tmp_path, capsys) -> None:
    honest, log = deployment
    with pytest.raises(SystemExit) as done:
        run(["adapt", str(log), "--honest", str(honest), "-o", str(tmp_path / "x"), "--label-sources", "audit"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "0 labelled answers" in err and "from the sources audit only (--label-sources)" in err
    with pytest.raises(SystemExit) as done:
        run(["adapt", str(log), "--honest", str(honest), "-o", str(tmp_path / "x"), "--label-sources", ","])
    assert done.value.code == 2 and "--label-sources must be a comma list" in capsys.readouterr().err


SYSTEM = "You are a helpful assistant. Answer in a few words."


def test_adapt_learns_the_system_prompt_its_traffic_carried(deployment, tmp_path, capsys) -> None:
    """Issue 54 part 4: labels served after the deployment's system prompt make the adapted model calibrated for
    requests with it (and for nothing else); its text is saved in the folder. Fails on the old code, whose
    adapted model was tuned on "conversation" for any system message."""
    from candor.serve.shapes import QUESTION, system_shape

    honest, _ = deployment
    log = served_log(tmp_path / "served.jsonl", (("system", SYSTEM),))
    prompt = tmp_path / "system.txt"
    prompt.write_text(SYSTEM + "\n", encoding="utf-8")
    out = tmp_path / "a"
    args = ["adapt", str(log), "--honest", str(honest), "-o", str(out), "--alpha", "0.5", "--k", "2"]
    with pytest.raises(SystemExit) as done:
        run([*args, "--system-prompt-file", str(prompt)])
    printed = capsys.readouterr().out
    assert done.value.code == 0, printed
    shape = system_shape(SYSTEM)
    assert json.loads((out / "honest.json").read_text())["tuned_on"] == [shape]
    assert json.loads((out / "adapt.json").read_text())["tuned_on"] == [shape]
    assert (out / "system_prompts" / f"{shape.removeprefix('system:')}.txt").read_text(encoding="utf-8") == SYSTEM
    assert f"calibrated for: questions asked with the deployment's system prompt (sha {shape[7:]})" in printed
    model = HonestModel.from_pretrained(out)
    assert model.calibration(shape)["calibrated"] is True
    assert model.calibration(QUESTION)["calibrated"] is False
    assert model.calibration(system_shape("Another prompt."))["calibrated"] is False


def test_a_system_prompt_no_stage_two_label_was_asked_with_is_refused(deployment, tmp_path, capsys) -> None:
    honest, log = deployment  # served without any system message
    prompt = tmp_path / "system.txt"
    prompt.write_text(SYSTEM, encoding="utf-8")
    args = ["adapt", str(log), "--honest", str(honest), "-o", str(tmp_path / "x"), "--alpha", "0.5"]
    with pytest.raises(SystemExit) as done:
        run([*args, "--system-prompt-file", str(prompt)])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "none of the 20 stage-2 labels was asked with that system prompt" in err
    assert "questions asked alone" in err and not (tmp_path / "x").exists()
    prompt.write_text(" \n", encoding="utf-8")
    with pytest.raises(SystemExit) as done:
        run([*args, "--system-prompt-file", str(prompt)])
    assert done.value.code == 2 and "the file is empty" in capsys.readouterr().err


def misleading_log(path: Path) -> Path:
    """The deployment's 60 questions, 40 labelled. The held-out ones say what a consistency estimator sees: RIGHT
    ones answered consistently and labelled correct, WRONG ones not and wrong. Everything stage 1 and stage 2 read
    says the opposite (RIGHT inconsistent and labelled wrong), so the adapted head ranks the held-out ones worse."""
    asked = [q for pair in zip(RIGHT, WRONG, strict=True) for q in pair]
    labelled = [
        replace(Record(item=served_item(q), greedy=Completion("x"), samples=[]), greedy_correct=1) for q in asked[:40]
    ]
    _, held = split_labels(labelled, AdaptSettings(alpha=0.5))  # adapt's own split: seeded, by question
    held_questions = {r.item.question for r in held}
    with path.open("w") as fh:
        for i, question in enumerate(asked):
            told_true = (question in RIGHT) == (question in held_questions)
            samples = ["x", "x", "x"] if told_true else ["y", "z", "w"]
            served = {"id": f"chatcmpl-{i}", "indexes": [0], "returned": ["x"]}
            record = Record(
                item=served_item(question),
                greedy=Completion("x"),
                samples=[Completion(t) for t in samples],
                provenance={"served": served},
            )
            fh.write(json.dumps(record.to_dict()) + "\n")
    for i, question in enumerate(asked[:40]):
        append_label(path, f"chatcmpl-{i}", 0, (question in RIGHT) == (question in held_questions), "human")
    return path


def test_a_worse_adapted_head_is_written_kept_and_never_replaces_the_served_folder(
    tiny_model_dir, tmp_path, capsys
) -> None:
    """Issue 64, defect 12: a model served with a consistency estimator that ranks the held-out questions right,
    adapted on traffic and labels that teach the opposite: the adapted head ranks the held-out questions worse, so
    the folder is marked kept, with the numbers, reload refuses it, and it never replaces the served folder.

    Fails on 4132585, whose adapt.json had no comparison with the served model and marked nothing.
    """
    from candor.serve.promotion import NotPromotable, check_promotable

    backend = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    served = HonestModel(
        backend, "consis-lex", threshold=0.2, template="fewshot", decoding=Decoding(max_new_tokens=3)
    ).save_pretrained(tmp_path / "served")
    log = misleading_log(tmp_path / "served.jsonl")
    args = ["adapt", str(log), "--alpha", "0.5", "--k", "2"]
    with pytest.raises(SystemExit) as done:
        run([*args, "--honest", str(served), "-o", str(tmp_path / "next")])
    printed = capsys.readouterr().out
    assert done.value.code == 0, printed
    mark = json.loads((tmp_path / "next" / "adapt.json").read_text())["promotion"]
    assert mark["status"] == "kept" and mark["level"] == 0.1 and mark["questions"] == 20
    assert mark["serving_auroc"] == 1.0 and mark["adapted_auroc"] < 0.5
    assert mark["difference"] < 0 and mark["p_value"] > 0.1 and "paired bootstrap" in mark["test"]
    assert "against the model it was adapted from: kept: held-out AUROC" in printed
    assert 'marked kept: POST /admin/reload refuses it unless the body says "force": true' in printed
    with pytest.raises(NotPromotable, match="marked kept by candor adapt"):
        check_promotable(tmp_path / "next")
    # adapting in place: a kept model never replaces the served folder
    before = (served / "honest.json").read_text()
    with pytest.raises(SystemExit) as done:
        run([*args, "--honest", str(served), "-o", str(served)])
    printed = capsys.readouterr().out
    assert done.value.code == 1 and "not written: --out is the served folder --honest" in printed
    assert (served / "honest.json").read_text() == before and not (served / "adapt.json").exists()
