"""Verbalized answer-level confidence: formats, prompts, P(C | q, a) and μ.

See docs/methods.md "Verbalized answer-level confidence".
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers import MC, OPEN

from candor.util.errors import CandorError
from candor.verbal.formats import (
    FORMATS,
    PROMPTING_SENTENCE,
    TASK_MC,
    TASK_OPEN,
    answer_prompt,
    confidence_distribution,
    expected_confidence,
    format_prompt,
    get_format,
    parse_answer,
    system_text,
)

KEYS = ["letter", "number", "text", "float", "percent"]


def with_template(backend, template):
    from candor.backends.hf import HFBackend

    tok = copy.deepcopy(backend.tokenizer)
    tok.chat_template = template
    return HFBackend(backend.model, tok)


# ---------------------------------------------------------------- formats


def test_format_values_follow_the_table():
    assert get_format("letter").labels == ("A", "B", "C", "D", "E")
    np.testing.assert_allclose(get_format("letter").values, [0.9, 0.7, 0.5, 0.3, 0.1])
    np.testing.assert_allclose(get_format("number").values, np.arange(10) / 9)
    assert get_format("text").labels == ("very high", "high", "medium", "low", "very low")
    np.testing.assert_allclose(get_format("text").values, [0.9, 0.7, 0.5, 0.3, 0.1])
    assert get_format("float").labels[:3] == ("0.0", "0.1", "0.2") and get_format("float").n_values == 11
    np.testing.assert_allclose(get_format("float").values, np.arange(11) / 10)
    assert get_format("percent").labels[80] == "80%" and get_format("percent").n_values == 101
    np.testing.assert_allclose(get_format("percent").values, np.arange(101) / 100)


def test_formats_by_key_or_paper_name():
    assert FORMATS.names() == sorted(KEYS)
    for key in KEYS:
        fmt = get_format(key)
        assert get_format(fmt.name) is fmt and get_format(fmt.name.lower()) is fmt
    with pytest.raises(CandorError, match="unknown verbalized confidence format 'emoji'"):
        get_format("ScoreEmoji")


@pytest.mark.parametrize(
    ("key", "reply", "index"),
    [
        ("letter", " B (high confidence)", 1),
        ("letter", "very sure", None),
        ("number", " 7", 7),
        ("number", " 0.7", None),  # a probability, not a 0-9 digit
        ("number", " 7.5", 7),  # truncated, as the white-box label "7" collects "7.5"
        ("number", " 10", None),
        ("text", " Very High", 0),
        ("text", " low.", 3),
        ("float", " 0.83", 8),
        ("float", " 0.25", 2),  # truncated, never rounded: round() gave 2 here ...
        ("float", " 0.35", 3),  # ... but 4 here (banker's rounding)
        ("float", " 0.3", 3),  # exact decimal arithmetic: 0.3 * 10 is not 2.999...
        ("float", " 0.29", 2),
        ("float", " 1.0", 10),
        ("float", " 7", None),
        ("percent", " 85%", 85),
        ("percent", " 100", 100),
        ("percent", " 250%", None),
        ("percent", " 0.8", None),  # a fraction, not 0.8%: no label
        ("percent", " 0.8%", 0),  # an explicit percentage
        ("percent", " 37.5%", 37),
        ("number", "", None),
    ],
)
def test_parsing_generated_confidence(key, reply, index):
    assert get_format(key).parse(reply) == index


def test_expected_confidence_by_hand():
    letter = get_format("letter")
    dist = np.array([[0, 0, 1, 0, 0], [1, 0, 0, 0, 0], [0.5, 0, 0, 0, 0.5]], dtype=float)
    np.testing.assert_allclose(expected_confidence(dist, letter), [0.5, 0.9, 0.5])
    for key in KEYS:
        fmt = get_format(key)
        uniform = np.full((1, fmt.n_values), 1 / fmt.n_values)
        np.testing.assert_allclose(expected_confidence(uniform, fmt), [0.5])
    with pytest.raises(CandorError, match=r"expected a \(n, 10\) distribution"):
        expected_confidence(dist, "number")


# ---------------------------------------------------------------- prompts


def test_system_text_follows_the_skeleton():
    text = system_text("number", multiple_choice=False)
    assert text == (
        f"{TASK_OPEN} After your answer, provide a confidence score between 0 and 9 which measures how "
        "confident you are in your answer. Use the following format to respond:\n"
        "Answer: [Write your answer here.]\nConfidence: [Write your confidence score here.]"
    )
    assert system_text("letter", multiple_choice=True).startswith(
        TASK_MC + " After your answer, provide a confidence score between A (very high"
    )
    prompting = system_text("text", multiple_choice=False, variant="prompting")
    assert PROMPTING_SENTENCE in prompting and PROMPTING_SENTENCE not in text
    assert "provide one of: very high, high, medium, low, very low which measures" in prompting
    with pytest.raises(CandorError, match="unknown verbalized confidence variant 'shouting'"):
        system_text("text", multiple_choice=False, variant="shouting")


def test_rendered_prompt_keeps_the_assistant_turn_open(tiny_backend, tokenizer):
    prompt = format_prompt(tiny_backend, OPEN, " Shakespeare ", "letter")
    assert prompt.endswith("Confidence:")
    messages = [
        {"role": "system", "content": system_text("letter", False)},
        {"role": "user", "content": "Question: Who wrote Hamlet?"},
        {"role": "assistant", "content": "Answer: Shakespeare\nConfidence:"},
    ]
    assert prompt == tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert "<|im_end|>" not in prompt[prompt.rindex("<|im_start|>assistant") :]


def test_multiple_choice_prompt_shows_options_a_to_d(tiny_backend):
    prompt = format_prompt(tiny_backend, MC, "B", "number", "prompting")
    assert TASK_MC in prompt and PROMPTING_SENTENCE in prompt
    user = "Question: A short passage.\nWhich city is the capital of France?\nA. Rome\nB. Paris\nC. Berlin\nD. Madrid"
    assert f"<|im_start|>user\n{user}<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\nAnswer: B\nConfidence:")
    assert answer_prompt(tiny_backend, MC, "number").endswith("<|im_start|>assistant\n")


def test_template_without_system_role_gets_a_merged_user_turn(tiny_backend):
    gemma_like = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<model>{% endif %}"
    )
    prompt = format_prompt(with_template(tiny_backend, gemma_like), OPEN, "Shakespeare", "letter")
    assert (
        prompt == f"<user>{system_text('letter', False)}\n\nQuestion: Who wrote Hamlet?\n<model>"
        "Answer: Shakespeare\nConfidence:"
    )


def test_model_without_chat_template_gets_plain_text(tiny_backend):
    prompt = format_prompt(with_template(tiny_backend, None), OPEN, "Shakespeare", "float")
    assert prompt == f"{system_text('float', False)}\n\nQuestion: Who wrote Hamlet?\nAnswer: Shakespeare\nConfidence:"


def test_parse_answer_reads_the_answer_line():
    assert parse_answer("Answer: Paris\nConfidence: 8") == "Paris"
    assert parse_answer(" Paris Confidence: 8") == "Paris"
    assert parse_answer("answer:B") == "B"
    assert parse_answer("") == ""


# ---------------------------------------------------------------- P(C | q, a) on the tiny model


def test_single_token_labels_are_checked_against_the_real_tokenizer(tiny_backend, tokenizer):
    from candor.verbal.distribution import single_token_ids

    prompt = format_prompt(tiny_backend, OPEN, "Shakespeare", "letter")
    context = tiny_backend.tokenize(prompt)

    def continuation(text: str) -> list[str]:
        full = tiny_backend.tokenize(prompt + text)
        assert full[: len(context)] == context
        return tokenizer.convert_ids_to_tokens(full[len(context) :])

    # Letters: one token with and without the space (white-box backends other than hf read them with
    # next_token_logprobs; hf scores them as one-token continuations, which costs no extra position).
    for letter in "ABCDE":
        assert continuation(letter) == [letter] and continuation(" " + letter) == ["Ġ" + letter]
    assert single_token_ids(tiny_backend, [prompt], ["A", " A"]) == tokenizer.convert_tokens_to_ids(["A", "ĠA"])
    # Digits: the spaced form is two tokens, so ScoreNumber takes the multi-token path.
    assert continuation("7") == ["7"] and continuation(" 7") == ["Ġ", "7"]
    assert continuation(" very high") == ["Ġvery", "Ġhigh"] and continuation(" high") == ["Ġhigh"]
    assert continuation(" 0.7") == ["Ġ", "0", ".", "7"] and continuation(" 80%") == ["Ġ", "8", "0", "%"]
    for key in ("number", "text", "float", "percent"):
        labels = get_format(key).labels
        assert single_token_ids(tiny_backend, [prompt], list(labels) + [" " + x for x in labels]) is None, key


@pytest.mark.parametrize("key", KEYS)
def test_distribution_sums_to_one_and_mu_is_in_range(tiny_backend, key):
    fmt = get_format(key)
    dist = confidence_distribution(tiny_backend, [OPEN, MC], ["Shakespeare", "B"], fmt)
    assert dist.shape == (2, fmt.n_values)
    np.testing.assert_allclose(dist.sum(1), 1.0, atol=1e-9)
    assert (dist > 0).all()
    mu = expected_confidence(dist, fmt)
    assert ((mu >= min(fmt.values)) & (mu <= max(fmt.values))).all()


def test_letter_distribution_adds_spaced_and_unspaced_tokens(tiny_backend, tokenizer):
    dist = confidence_distribution(tiny_backend, [OPEN], ["Shakespeare"], "letter", "prompting")
    prompt = format_prompt(tiny_backend, OPEN, "Shakespeare", "letter", "prompting")
    ids = tokenizer.convert_tokens_to_ids([t for c in "ABCDE" for t in (c, "Ġ" + c)])
    p = np.exp(tiny_backend.next_token_logprobs([prompt], ids)).reshape(5, 2).sum(1)
    np.testing.assert_allclose(dist[0], p / p.sum(), rtol=1e-5)


def test_number_distribution_scores_both_digit_forms(tiny_backend):
    prompt = format_prompt(tiny_backend, OPEN, "Shakespeare", "number")
    dist = confidence_distribution(tiny_backend, [OPEN], ["Shakespeare"], "number")
    forms = [f for d in "0123456789" for f in (d, " " + d)]
    p = np.exp([sum(lps) for lps in tiny_backend.score([prompt] * 20, forms)]).reshape(10, 2).sum(1)
    np.testing.assert_allclose(dist[0], p / p.sum(), rtol=1e-4)


def test_mismatched_items_and_answers():
    with pytest.raises(CandorError, match="2 items but 1 answers"):
        confidence_distribution(None, [OPEN, MC], ["x"], "letter")
