"""Claims of list-shaped answers (issue 54 part 6): no list marker, numbering, bullet or heading is ever a
claim, a fact stays whole, and refinement takes a removed fact's marker with it and never leaves its words.

Property-style: answers are built from a grid of marker styles, layouts (one item per line, all on one line,
after an introduction with a colon, nested, under headings) and facts (with decimals, initials, abbreviations
and sentences that end in a number), with seeded random values for refinement."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from candor.annotation.claim_split import split_claims
from candor.annotation.claims import Claim, refine, sentence_spans
from candor.backends.base import Completion

FACTS = [
    "Paris is the capital of France.",
    "About 2.1 million people live in Paris.",
    "The Seine is 777 km long.",
    "F. Scott Fitzgerald lived there in 1925.",
    "Dr. Guillotin was born in Saintes.",
    "The Eiffel Tower ranks 1.",
    "It has 3.5 million visitors a year.",
    "The Louvre opened in 1793.",
]
ROMAN = ["i", "ii", "iii", "iv", "v", "vi", "vii", "viii"]
LETTERS = "abcdefgh"


def numbered(fmt: str, names: list[str]) -> list[str]:
    return [fmt.format(n) for n in names]


MARKERS: dict[str, list[str]] = {
    "1.": numbered("{}.", [str(i) for i in range(1, 9)]),
    "1)": numbered("{})", [str(i) for i in range(1, 9)]),
    "(1)": numbered("({})", [str(i) for i in range(1, 9)]),
    "a.": numbered("{}.", list(LETTERS)),
    "a)": numbered("{})", list(LETTERS)),
    "(a)": numbered("({})", list(LETTERS)),
    "A)": numbered("{})", list(LETTERS.upper())),
    "i.": numbered("{}.", ROMAN),
    "(ii)": numbered("({})", ROMAN),
    "-": ["-"] * 8,
    "*": ["*"] * 8,
    "•": ["\u2022"] * 8,
    "+": ["+"] * 8,
}
MARKER_ONLY = re.compile(r"\W*(?:\(?(?:\d{1,3}|[A-Za-z]|[ivxIVX]{1,5})[.)]\W*)*")
MARKER_TOKEN = re.compile(r"\(?(?:\d{1,3}|[A-Za-z]|[ivxIVX]{2,5})[.)]|[-*+\u2022]")


def layouts(facts: list[str], markers: list[str]) -> dict[str, str]:
    items = [f"{m} {f}" for m, f in zip(markers, facts, strict=False)]
    half = len(items) // 2
    return {
        "lines": "\n".join(items),
        "inline": " ".join(items),
        "colon": "Here are the facts: " + " ".join(items),
        "intro-lines": "Here are the facts:\n\n" + "\n".join(items),
        "nested": "\n".join([items[0], *("   " + i for i in items[1:half]), *items[half:]]),
        "headings": "# Facts about Paris\n" + "\n".join(items[:half]) + "\n## More\n" + "\n".join(items[half:]),
        "setext": "Facts\n=====\n" + "\n".join(items),
        "rule": "\n".join(items[:half]) + "\n---\n" + "\n".join(items[half:]),
    }


def cases() -> list[tuple[str, str, list[str]]]:
    rng = random.Random(0)
    out = []
    for style, layout_index in itertools.product(MARKERS, range(8)):
        facts = rng.sample(FACTS, rng.randint(2, 5))
        name, text = list(layouts(facts, MARKERS[style]).items())[layout_index]
        out.append((f"{style}|{name}", text, facts))
    return out


CASES = cases()


def claims_of(text: str) -> list[Claim]:
    return [Claim(text=text[a:b], start=a, end=b) for a, b in sentence_spans(text)]


@pytest.mark.parametrize(("name", "text", "facts"), CASES, ids=[c[0] for c in CASES])
def test_no_marker_or_heading_is_a_claim_and_each_fact_stays_whole(name, text, facts):
    claims = claims_of(text)
    texts = [c.text for c in claims]
    for claim in texts:
        assert not MARKER_ONLY.fullmatch(claim), f"{name}: a marker made a claim: {claim!r} of {texts}"
        assert "Facts about" not in claim and claim not in ("More", "Facts"), f"{name}: a heading is a claim"
    # every fact is exactly one claim, its marker left out; besides the facts only the introduction
    assert [t for t in texts if t != "Here are the facts:"] == facts, f"{name}: {texts}"


@pytest.mark.parametrize(("name", "text", "facts"), CASES, ids=[c[0] for c in CASES])
def test_removing_a_fact_takes_its_marker_and_leaves_none_of_its_words(name, text, facts):
    claims = claims_of(text)
    rng = random.Random(name)
    for _ in range(6):
        values = [rng.random() for _ in claims]
        refined = refine(text, claims, values, 0.5)
        for claim, value, span in zip(claims, values, refined.spans, strict=True):
            if value < 0.5:
                assert span is None and claim.text not in refined.text, f"{name}: {claim.text!r} left"
            else:
                assert span is not None and refined.text[span[0] : span[1]] == claim.text
        # no marker is left standing alone: every line states something, and no marker opens another marker
        again = [c.text for c in claims_of(refined.text)]
        kept = [c.text for c, v in zip(claims, values, strict=True) if v >= 0.5]
        assert again == kept, f"{name}: {refined.text!r}"
        for line in refined.text.split("\n"):
            only_markers = line.split() and all(MARKER_TOKEN.fullmatch(tok) for tok in line.split())
            assert not only_markers, f"{name}: a line of markers: {line!r}"
        # between two kept claims at most the later one's marker; after the last, none
        spans = sorted(span for span in refined.spans if span is not None)
        bounds = [0, *(x for span in spans for x in span), len(refined.text)]
        for i, (a, b) in enumerate(zip(bounds[0::2], bounds[1::2], strict=True)):
            markers = [tok for tok in refined.text[a:b].split() if MARKER_TOKEN.fullmatch(tok)]
            assert len(markers) <= (1 if i < len(spans) else 0), f"{name}: markers left {markers}: {refined.text!r}"


@pytest.mark.parametrize(("name", "text", "facts"), CASES[::7], ids=[c[0] for c in CASES[::7]])
def test_mark_wraps_the_fact_after_its_marker(name, text, facts):
    claims = claims_of(text)
    marked = refine(text, claims, [0.0] * len(claims), 0.5, "mark")
    assert [marked.text[a:b] for a, b in marked.spans] == [c.text for c in claims]
    for claim in claims:
        assert f"[?{claim.text}]" in marked.text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the numbers of the issue: list numbers inside a line, not split off
        (
            "1. Paris is the capital of France. 2. The Eiffel Tower is in Paris. 3. The Seine flows through it.",
            ["Paris is the capital of France.", "The Eiffel Tower is in Paris.", "The Seine flows through it."],
        ),
        # decimals and numbers that end a sentence are not markers
        (
            "Paris has 2.1 million people. Lyon has 0.5 million.",
            ["Paris has 2.1 million people.", "Lyon has 0.5 million."],
        ),
        ("It ranks 1. Paris is big.", ["It ranks 1.", "Paris is big."]),
        ("The answer is 3.5 million.", ["The answer is 3.5 million."]),
        ("He got 3) wrong.", ["He got 3) wrong."]),
        ("1) Paris is big 2) it is old", ["Paris is big", "it is old"]),
        ("1.\nParis is big.\n\n***\n", ["Paris is big."]),
        ("### 1. Paris\n- It is big.", ["It is big."]),
        ("- - Paris is big.", ["Paris is big."]),
    ],
)
def test_list_shapes_split_as_written(text, expected):
    assert [c.text for c in claims_of(text)] == expected


def test_split_claims_tokens_of_a_list_fact_leave_out_its_marker():
    text = "1. Paris is big. 2. Lyon is old."
    tokens = ["1", ".", " Paris", " is", " big", ".", " 2", ".", " Lyon", " is", " old", "."]
    comp = Completion(text=text, token_ids=list(range(len(tokens))), tokens=tokens, logprobs=[-0.1] * len(tokens))
    claims = split_claims(text, comp)
    assert [c.text for c in claims] == ["Paris is big.", "Lyon is old."]
    assert [c.tokens for c in claims] == [[2, 3, 4, 5], [8, 9, 10, 11]]
