"""The EliCal claim head: stage-1 targets from samples, the claim's token position, training, scoring, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import candor.train.elical.claim_estimator  # noqa: F401  (registers elical-claims, as the entry point does once installed)
from candor.annotation.claim_split import split_claims
from candor.annotation.claims import Claim, sentence_spans
from candor.annotation.judges import get_consistency_judge
from candor.annotation.records import Record, write_records
from candor.backends.base import Completion
from candor.backends.tokens import encode
from candor.data.items import QAItem
from candor.estimators.claim_scoring import claim_estimator_names, score_record_claims
from candor.train.elical import Budget, EliCalConfig
from candor.train.elical.claim_head import (
    POOLINGS,
    ClaimHead,
    claim_features,
    claim_last_position,
    fresh_head,
    train_claim_head,
)
from candor.train.elical.claim_targets import claim_consistency, pieces_at
from candor.util.errors import CandorError

PARTS = [
    ("What is the capital of France?", ["Paris"]),
    ("Which city is the capital of Italy?", ["Rome"]),
]


def compound(rid: str, text: str, samples: list[str], parts=PARTS, token_ids: list[int] | None = None) -> Record:
    item = QAItem(
        id=rid,
        dataset="compound-toy",
        split="train",
        question="\n".join(f"{i + 1}. {q}" for i, (q, _) in enumerate(parts)),
        answers=(),
        meta={"parts": [{"id": f"{rid}:{k}", "question": q, "answers": a} for k, (q, a) in enumerate(parts)]},
    )
    greedy = Completion(text, token_ids=token_ids or [])
    samples_ = [Completion(s) for s in samples]
    rec = Record(item=item, greedy=greedy, samples=samples_, provenance={"template": "compound"})
    rec.claims = [Claim(text=text[a:b], start=a, end=b) for a, b in sentence_spans(text)]
    return rec


# ------------------------------------------------------------ stage-1 targets


def test_a_claims_consistency_is_the_share_of_samples_agreeing_at_its_own_question():
    rec = compound(
        "c0",
        "1. Paris is the capital of France.\n2. Rome is in Italy.\n3. Extra line here.",
        [
            "1. Paris.\n2. Milan is in Italy.",  # agrees on 1, not on 2
            "1. Lyon is the capital of France.\n2. Rome.",  # not on 1 (only the question's words shared), agrees on 2
            "2. Paris is lovely.\n1. It is Paris",  # numbered out of order: its answer to question 1 is "It is Paris"
            "1. Rome is in Italy.\n2. Paris.",  # each claim's words, at the other question: supports neither
        ],
    )
    values = claim_consistency([rec], get_consistency_judge("lexical-echo"))[0]
    # Claim 1: samples 1 and 3 (sample 3's "2. Paris is lovely." answers question 2, so it does not count twice).
    # Claim 2: sample 2 only. Sample 4 says both claims' answers, each at the wrong question. Claim 3 answers no
    # question of the prompt: no target.
    assert values == [pytest.approx(2 / 4), pytest.approx(1 / 4), None]
    assert pieces_at("1. Paris is big.\n2. Rome is old. It is in Italy.", 1) == ["Rome is old.", "It is in Italy."]


def test_stage_one_refuses_a_record_without_samples():
    rec = compound("c0", "1. Paris.\n2. Rome.", [])
    with pytest.raises(CandorError, match="no sampled answers"):
        claim_consistency([rec], get_consistency_judge("lexical-echo"))


# ------------------------------------------------------------ the claim's last token


def answer_completion(tokenizer, text: str) -> Completion:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return Completion(text, token_ids=ids, tokens=[tokenizer.decode([i]) for i in ids], logprobs=[-0.1] * len(ids))


def test_the_claims_last_token_is_where_its_characters_end(tokenizer):
    prompt = "Answer each question.\n1. Capital of France?\n2. Capital of Italy?\n"
    text = "1. Paris is the capital of France.\n2. Rome is in Italy, they say."
    completion = answer_completion(tokenizer, text)
    claims = split_claims(text, completion, decode=tokenizer.decode)
    n_prompt = len(encode(tokenizer, [prompt])[0])
    full = encode(tokenizer, [prompt])[0] + completion.token_ids
    assert [c.text for c in claims] == ["Paris is the capital of France.", "Rome is in Italy, they say."]
    for claim in claims:
        at = claim_last_position(claim, n_prompt)
        through = tokenizer.decode(full[n_prompt : at + 1])
        before = tokenizer.decode(full[n_prompt:at])
        # Through the position the claim is complete; one token less, it is not: an off-by-one either way fails.
        assert through.rstrip().endswith(claim.text)
        assert not before.rstrip().endswith(claim.text)
    with pytest.raises(CandorError, match="rests on no token"):
        claim_last_position(Claim(text="x", start=0, end=1), n_prompt)


def test_claim_features_read_each_claims_tokens_whatever_the_padding(tiny_model, tokenizer):
    config = EliCalConfig(model="tiny", cal_target="hard")
    head = fresh_head(tiny_model, tokenizer, "fewshot", config)
    prompts = ["Question: a?\nAnswer:", "Question: a much longer question with many words in it?\nAnswer:"]
    texts = ["1. Paris is big.\n2. Rome is old.", "1. Yes.\n2. A long second line with more tokens than the first."]
    completions = [answer_completion(tokenizer, t) for t in texts]
    claims = [split_claims(t, c, decode=tokenizer.decode) for t, c in zip(texts, completions, strict=True)]
    feats = claim_features(head, prompts, [c.token_ids for c in completions], claims, batch_size=2)
    for i, prompt in enumerate(prompts):
        full = encode(tokenizer, [prompt])[0] + completions[i].token_ids
        n_prompt = len(encode(tokenizer, [prompt])[0])
        ids = torch.tensor([full])
        alone = head.token_states(ids, torch.ones_like(ids))[0].float().detach().numpy()
        for j, claim in enumerate(claims[i]):
            np.testing.assert_allclose(feats["last"][i][j], alone[claim_last_position(claim, n_prompt)], atol=1e-4)
            np.testing.assert_allclose(
                feats["mean"][i][j], alone[[n_prompt + t for t in claim.tokens]].mean(0), atol=1e-4
            )


# ------------------------------------------------------------ training and scoring


CITIES = ["Paris", "Rome", "Lyon", "Milan", "Berlin", "Madrid"]


def toy_records(tokenizer, n: int, start: int = 0) -> list[Record]:
    """Compound records whose greedy answers are real token ids of the real tokenizer, with samples."""
    rng = np.random.default_rng(start)
    out = []
    for i in range(start, start + n):
        a, b = rng.choice(CITIES, 2)
        text = f"1. The capital of France is {a}.\n2. The capital of Italy is {b}."
        samples = [f"1. {rng.choice(CITIES)}.\n2. {rng.choice(CITIES)}." for _ in range(3)]
        completion = answer_completion(tokenizer, text)
        rec = compound(f"c{i}", text, samples, token_ids=completion.token_ids)
        rec.greedy = completion
        rec.claims = None
        out.append(rec)
    return out


@pytest.fixture(scope="module")
def trained(tiny_model, tiny_model_dir, tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("claim-head")
    config = EliCalConfig(model=tiny_model_dir, cal_target="hard", max_epochs=2, batch_size=8)
    train, dev = toy_records(tokenizer, 24), toy_records(tokenizer, 8, start=100)
    result = train_claim_head(
        train, dev, out_dir=out, config=config, budget=Budget(10), model=tiny_model, tokenizer=tokenizer
    )
    return result, out, train


def test_the_claim_head_trains_both_stages_and_records_its_pooling_choice(trained):
    result, out, _ = trained
    assert [s.name for s in result.stages] == ["eli", "cal"]
    assert [s.target for s in result.stages] == ["claim-consistency", "claim-label"]
    assert result.stages[1].n_train == 10  # the budget of claim labels
    meta = json.loads((out / "elical_config.json").read_text())["meta"]
    assert meta["level"] == "claim" and meta["pooling"] in POOLINGS
    assert set(meta["pooling_choice"]["dev_auroc"]) == set(POOLINGS)
    assert (out / "training_questions.json").exists()
    assert result.config["cal_stop"] == "loss" and result.config["cal_anchor"] == 1.0  # the universal rule


def test_elical_claims_scores_claims_with_the_saved_head(trained, tiny_model, tokenizer):
    result, out, records = trained
    assert "elical-claims" in claim_estimator_names()
    values = score_record_claims("elical-claims", records[:4], head=str(out))
    assert [len(v) for v in values] == [len(r.claims or []) for r in records[:4]]
    # The same numbers as the trained head in memory, fed the prompts it renders.
    mine = ClaimHead(result.model)
    expected = mine.score(
        mine.head.prompts(records[:4]), [r.greedy.token_ids for r in records[:4]], [r.claims for r in records[:4]]
    )
    np.testing.assert_allclose(np.concatenate(values), np.concatenate(expected), atol=1e-5)


def test_a_question_head_is_not_a_claim_head(tiny_model, tokenizer, tmp_path):
    head = fresh_head(tiny_model, tokenizer, "fewshot", EliCalConfig(model="tiny", cal_target="hard"))
    head.save_pretrained(tmp_path / "q")
    with pytest.raises(CandorError, match="question-level"):
        ClaimHead.from_pretrained(tmp_path / "q")


def test_candor_claims_scores_with_a_head_and_refuses_without_one(trained, tmp_path):
    from typer.testing import CliRunner

    from candor.cli import app

    _, out, records = trained
    path = tmp_path / "recs.jsonl"
    write_records(path, records[:6])
    runner = CliRunner()
    ok = runner.invoke(
        app, ["claims", "-r", str(path), "-o", str(tmp_path / "r"), "-e", "elical-claims", "--head", str(out)]
    )
    assert ok.exit_code == 0, ok.output
    assert "elical-claims: AUROC" in ok.output
    rows = [json.loads(line) for line in (tmp_path / "r" / "claim_confidences.jsonl").read_text().splitlines()]
    assert rows and all(0.0 <= r["confidence"]["elical-claims"] <= 1.0 for r in rows)
    missing = runner.invoke(app, ["claims", "-r", str(path), "-o", str(tmp_path / "s"), "-e", "elical-claims"])
    assert missing.exit_code != 0 and "needs --claim-head" in missing.output
    stray = runner.invoke(
        app, ["claims", "-r", str(path), "-o", str(tmp_path / "t"), "-e", "claim-prob", "--head", str(out)]
    )
    assert stray.exit_code != 0 and "--claim-head is read only by" in stray.output


def test_the_trainer_table_runs_elical_claims_and_refuses_a_soft_target(tiny_model_dir, tokenizer, tmp_path):
    from candor.train.trainers import TRAINERS, TrainJob, run_training

    assert "elical-claims" in TRAINERS
    path = tmp_path / "train.jsonl"
    write_records(path, toy_records(tokenizer, 20))
    job = TrainJob(
        records=path, out=tmp_path / "soft", model=tiny_model_dir, settings={"cal_target": "soft", "budget": "5"}
    )
    with pytest.raises(CandorError, match="cal_target can only be 'hard'"):
        run_training("elical-claims", job)
    job = TrainJob(
        records=path,
        out=tmp_path / "head",
        model=tiny_model_dir,
        settings={"budget": "5", "max_epochs": "1", "pooling": "last"},
    )
    result = run_training("elical-claims", job)
    assert result.stages[1].n_train == 5
    assert json.loads((tmp_path / "head" / "elical_config.json").read_text())["meta"]["pooling"] == "last"


def test_the_entry_point_names_the_module_that_registers_elical_claims():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    group = '[project.entry-points."candor.claim_estimators"]\n'
    assert group + 'elical-claims = "candor.train.elical.claim_estimator"' in text


def test_the_question_level_elical_estimator_refuses_a_claim_head(trained):
    from candor.estimators.base import get_estimator

    _, out, records = trained
    with pytest.raises(CandorError, match="is a claim head"):
        get_estimator("elical", head=str(out)).estimate(records[:2])
