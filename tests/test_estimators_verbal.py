"""verbal-0, verbal-10 and p-true: parsing, prompts, and the numbers on the tiny model."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from candor.annotation.records import Record
from candor.backends.base import Completion, SamplingParams
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.estimators.answers import record_answer
from candor.estimators.ptrue import ptrue_prompt
from candor.estimators.verbal_question import BUILTIN_EXAMPLES, FALLBACK_SCORE, parse_verbal_score
from candor.util.errors import CandorError


def record(rid: str, question: str, greedy: str = "Paris", sample_correct=None, choices=None) -> Record:
    item = QAItem(id=rid, dataset="toy", split="train", question=question, answers=("Paris",), choices=choices)
    return Record(item=item, greedy=Completion(text=greedy, logprobs=[-0.5]), samples=[], sample_correct=sample_correct)


RECORDS = [record("a", "What is the capital of France?"), record("b", "Who wrote Hamlet?", "Shakespeare")]


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("0.8", 0.8),
        ("Score: 1", 1.0),
        ("I'd say 0.35.", 0.35),
        ("70%", 0.7),
        ("between 0 and 1, I pick .6", 0.6),
        ("0.2 at first, but 0.9 on reflection", 0.9),  # the last number wins
        ("8 out of 10", None),  # numbers outside [0, 1] are ignored
        ("1.5", None),
        ("v0.8 -0.3", None),  # glued to a letter or a minus sign
        ("I am not sure.", None),
        ("", None),
    ],
)
def test_parse_verbal_score(reply, score):
    got = parse_verbal_score(reply)
    assert got == (pytest.approx(score) if score is not None else None)


def test_verbal_0_prompt_ends_with_the_score_cue(tiny_backend):
    est = get_estimator("verbal-0")
    prompt = est.prompt(tiny_backend, RECORDS[0])
    assert prompt.startswith("<|im_start|>")
    assert prompt.endswith("<|im_start|>assistant\nScore:")
    assert "Judge whether you can provide a correct answer" in prompt
    assert "Question: What is the capital of France?" in prompt
    assert prompt.count("Question:") == 1


def test_verbal_0_scores_are_the_parsed_replies(tiny_backend):
    est = get_estimator("verbal-0")
    out = est.estimate(RECORDS, tiny_backend)
    prompts = [est.prompt(tiny_backend, r) for r in RECORDS]
    gens = tiny_backend.generate(prompts, 0, SamplingParams(max_new_tokens=16, stop=("\n",)))
    parsed = [parse_verbal_score(g.greedy.text) for g in gens]
    np.testing.assert_allclose(out, [FALLBACK_SCORE if p is None else p for p in parsed])
    assert est.last_fallbacks == sum(p is None for p in parsed)


def test_verbal_0_on_a_model_without_chat_template_uses_plain_text(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    prompt = get_estimator("verbal-0").prompt(HFBackend(tiny_model, plain), RECORDS[0])
    assert "<|im_start|>" not in prompt
    assert prompt.startswith("Judge whether")
    assert prompt.endswith("Question: What is the capital of France?\nScore:")


def test_verbal_10_uses_ten_builtin_examples(tiny_backend):
    prompt = get_estimator("verbal-10").prompt(tiny_backend, RECORDS[0])
    assert prompt.count("Question:") == 11
    assert len(BUILTIN_EXAMPLES) == 10
    assert f"Question: {BUILTIN_EXAMPLES[0][0]}\nScore: 1.0" in prompt
    assert f"Question: {BUILTIN_EXAMPLES[-1][0]}\nScore: 0.1" in prompt


def test_verbal_10_scores_examples_by_sample_accuracy(tiny_backend):
    train = [record(f"t{i}", f"Training question {i}?", sample_correct=[1] * i + [0] * (5 - i)) for i in range(6)]
    train += [record(f"u{i}", f"Other question {i}?", sample_correct=[1, 1, 1, 1]) for i in range(6)]
    train.append(record("no-labels", "Unlabelled question?"))
    est = get_estimator("verbal-10", examples=train, seed=3)
    shots = est.examples()
    assert len(shots) == 10
    by_question = {r.item.question: r.sample_accuracy for r in train if r.sample_correct}
    assert all(by_question[q] == s for q, s in shots)
    prompt = est.prompt(tiny_backend, RECORDS[0])
    assert "Unlabelled question?" not in prompt
    assert prompt.count("Question:") == 11
    assert get_estimator("verbal-10", examples=train, seed=3).examples() == shots  # fixed by the seed


def test_verbal_10_needs_ten_labelled_examples():
    with pytest.raises(CandorError, match="verbal-10 needs 10 example records.*got 2"):
        get_estimator("verbal-10", examples=[record("x", "q?", sample_correct=[1])] * 2)


# ---------------------------------------------------------------- p-true


def test_ptrue_prompt_shows_the_proposal_and_ends_with_the_cue(tiny_backend):
    prompt = ptrue_prompt(tiny_backend, RECORDS[1])
    shown = "Question: Who wrote Hamlet?\nProposed answer: Shakespeare\nIs the proposed answer:\nA. True\nB. False"
    assert shown in prompt
    assert prompt.endswith("<|im_start|>assistant\nThe proposed answer is:")


def test_ptrue_is_p_a_renormalized_over_a_and_b_with_space_variants(tiny_backend, tokenizer):
    out = get_estimator("p-true").estimate(RECORDS, tiny_backend)
    ids = tokenizer.convert_tokens_to_ids(["A", "ĠA", "B", "ĠB"])
    prompts = [ptrue_prompt(tiny_backend, r) for r in RECORDS]
    probs = np.exp(tiny_backend.next_token_logprobs(prompts, ids))
    expected = probs[:, :2].sum(1) / probs.sum(1)
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    assert ((out > 0) & (out < 1)).all()


def test_ptrue_proposes_the_option_letter_for_multiple_choice(tiny_backend):
    mc = record(
        "mc", "Which city is in France?", greedy="The answer is B.", choices=("Rome", "Paris", "Berlin", "Madrid")
    )
    assert record_answer(mc) == "B"
    prompt = ptrue_prompt(tiny_backend, mc)
    assert "A. Rome\nB. Paris\nC. Berlin\nD. Madrid\nProposed answer: B\n" in prompt
