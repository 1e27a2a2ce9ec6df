"""Claims: splitting an answer, its spans and tokens, refinement, labels with failure modes, records."""

from __future__ import annotations

import json

import pytest

from candor.annotation.claim_labels import claim_positions, is_echo, label_compound
from candor.annotation.claim_split import split_claims
from candor.annotation.claims import Claim, refine, token_offsets
from candor.annotation.records import Record, read_records, write_records
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.util.errors import CandorError

ANSWER = "1. The capital of France is Paris.\n2. F. Scott Fitzgerald wrote it; he was American.\n3. Gold is Au."


def completion(text: str, pieces: int = 7) -> Completion:
    """A completion whose tokens are ``text`` cut into equal pieces, a leading space first (as BPE gives)."""
    joined = " " + text
    step = max(1, len(joined) // pieces)
    tokens = [joined[i : i + step] for i in range(0, len(joined), step)]
    return Completion(text=text, token_ids=list(range(len(tokens))), tokens=tokens, logprobs=[-0.1] * len(tokens))


def test_sentence_claims_have_exact_spans_and_overlapping_tokens():
    comp = completion(ANSWER)
    claims = split_claims(ANSWER, comp)
    assert [c.text for c in claims] == [
        "The capital of France is Paris.",
        "F. Scott Fitzgerald wrote it",
        "he was American.",
        "Gold is Au.",
    ]
    offsets = token_offsets(comp)
    for claim in claims:
        assert ANSWER[claim.start : claim.end] == claim.text
        # exactly the tokens whose characters overlap the claim
        expected = [i for i, (a, b) in enumerate(offsets) if a < claim.end and b > claim.start and b > a]
        assert claim.tokens == expected
        assert claim.token_start == expected[0] and claim.token_end == expected[-1] + 1
    assert "".join(ANSWER[a:b] for a, b in offsets) == ANSWER


def test_token_offsets_decode_when_token_texts_do_not_join():
    comp = Completion(
        text="héllo world", token_ids=[1, 2, 3], tokens=["h\ufffd", "\ufffdllo", " world"], logprobs=[0, 0, 0]
    )
    pieces = {1: "h", 2: "é", 3: "llo world"}  # a decode that only joins whole characters
    with pytest.raises(CandorError, match="decode"):
        token_offsets(comp)
    spans = token_offsets(comp, decode=lambda ids: "".join(pieces[i] for i in ids))
    assert spans == [(0, 1), (1, 2), (2, 11)]


def test_split_claims_refuses_text_that_is_not_the_completions():
    with pytest.raises(CandorError, match="not the completion's text"):
        split_claims("other", completion(ANSWER))


def test_refine_remove_and_mark_agree_with_the_removed_claims():
    claims = split_claims(ANSWER, completion(ANSWER))
    values = [0.9, 0.2, 0.8, 0.1]
    refined = refine(ANSWER, claims, values, threshold=0.5)
    assert [c.text for c in refined.removed] == ["F. Scott Fitzgerald wrote it", "Gold is Au."]
    assert refined.text == "1. The capital of France is Paris.\n2. he was American."
    for claim in refined.removed:
        assert claim.text not in refined.text
    for claim, v, span in zip(claims, values, refined.spans, strict=True):
        if v >= 0.5:  # a kept claim's span indexes the refined text
            assert span is not None and refined.text[span[0] : span[1]] == claim.text
        else:
            assert span is None
    marked = refine(ANSWER, claims, values, threshold=0.5, mode="mark")
    assert marked.removed == refined.removed
    assert (
        marked.text
        == "1. The capital of France is Paris.\n2. [?F. Scott Fitzgerald wrote it]; he was American.\n3. [?Gold is Au.]"
    )
    assert [marked.text[a:b] for a, b in marked.spans] == [c.text for c in claims]  # a marked claim: inside the marks
    untouched = refine(ANSWER, claims, values, threshold=0.0)
    assert (untouched.text, untouched.removed) == (ANSWER, [])
    assert untouched.spans == [(c.start, c.end) for c in claims]


def test_refine_refuses_bad_input():
    claims = split_claims(ANSWER, completion(ANSWER))
    with pytest.raises(CandorError, match="4 claims but 3 values"):
        refine(ANSWER, claims, [0.1, 0.2, 0.3], 0.5)
    with pytest.raises(CandorError, match="mode"):
        refine(ANSWER, claims, [0.1] * 4, 0.5, mode="hide")  # type: ignore[arg-type]
    overlapping = [Claim(text="a b", start=0, end=3), Claim(text="b c", start=2, end=5)]
    with pytest.raises(CandorError, match="overlap"):
        refine("a b c", overlapping, [0.0, 0.0], 0.5)


def compound_record(text: str, parts: list[tuple[str, list[str]]]) -> Record:
    item = QAItem(
        id="compound:0",
        dataset="compound-starter",
        split="test",
        question="\n".join(q for q, _ in parts),
        answers=(),
        meta={"parts": [{"id": f"q{i}", "question": q, "answers": a} for i, (q, a) in enumerate(parts)]},
    )
    rec = Record(item=item, greedy=completion(text), samples=[])
    rec.claims = split_claims(text, rec.greedy)
    return rec


PARTS = [
    ("What is the capital of France?", ["Paris"]),
    ("Who wrote Hamlet?", ["William Shakespeare", "Shakespeare"]),
    ("What is the chemical symbol for gold?", ["Au"]),
]


def test_compound_labels_by_position_and_counts_failure_modes():
    text = (
        "1. The capital of France is Lyon.\n"  # wrong
        "2. Paris is the capital of France.\n"  # answers question 1, not its own
        "3. The chemical symbol for gold is Au.\n"  # right
        "4. The chemical symbol for gold is Au."  # repeated (and past the last question)
    )
    rec = compound_record(text, PARTS)
    counts = label_compound([rec])
    assert [(c.question, c.label, c.failure) for c in rec.claims] == [
        (0, 0, None),
        (1, None, "other-question"),
        (2, 1, None),
        (3, None, "repeated"),
    ]
    assert counts["failures"] == {"repeated": 1, "echo": 0, "other-question": 1, "extra": 0}
    assert counts["scored"] == 2 and counts["correct"] == 1 and counts["questions_answered"] == 2
    assert rec.provenance["claim_judge"] == {"name": "contains"}


def test_echoed_questions_and_extra_lines_are_failures():
    text = "1. What is the capital of France?\n2. The capital of France.\n3. Gold is Au.\n4. Hamlet is long.\n0. Odd."
    rec = compound_record(text, PARTS)
    label_compound([rec])
    assert [c.failure for c in rec.claims] == ["echo", "echo", None, "extra", "extra"]
    assert is_echo("The first man on the moon was Neil Armstrong.", ["Who was the first man on the moon?"]) is False


def test_positions_follow_the_list_numbers_else_the_line_order():
    text = "2. Second.\n1. First."
    claims = split_claims(text, completion(text))
    assert claim_positions(text, claims) == [1, 0]
    plain = "Alpha.\n\nBeta."
    assert claim_positions(plain, split_claims(plain, completion(plain))) == [0, 1]


def test_label_compound_refuses_records_without_claims_or_parts():
    rec = compound_record("1. Paris.", PARTS)
    rec.claims = None
    with pytest.raises(CandorError, match="no claims"):
        label_compound([rec])
    plain = Record(
        item=QAItem(id="x", dataset="d", split="test", question="q?", answers=("a",)),
        greedy=completion("A."),
        samples=[],
        claims=[],
    )
    with pytest.raises(CandorError, match="not a compound prompt"):
        label_compound([plain])


def test_records_keep_claims_and_old_records_stay_readable(tmp_path):
    rec = compound_record(ANSWER, PARTS)
    label_compound([rec])
    path = tmp_path / "records.jsonl"
    write_records(path, [rec])
    back = read_records(path)[0]
    assert back.claims == rec.claims
    line = json.loads(path.read_text())
    assert line["claims"][0] == {
        "text": "The capital of France is Paris.",
        "start": 3,
        "end": 34,
        "tokens": rec.claims[0].tokens,
        "question": 0,
        "label": 1,
    }
    # a record written before claims existed: no key, read as None, written back without the key
    old = {k: v for k, v in line.items() if k != "claims"}
    old_path = tmp_path / "old.jsonl"
    old_path.write_text(json.dumps(old) + "\n")
    old_rec = read_records(old_path)[0]
    assert old_rec.claims is None
    assert "claims" not in old_rec.to_dict()


def test_a_bad_claim_names_the_file_and_line(tmp_path):
    rec = compound_record(ANSWER, PARTS)
    line = rec.to_dict()
    line["claims"] = [{"text": "no span"}]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(rec.to_dict()) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(CandorError, match=r"bad\.jsonl:2: .*a claim needs text, start, end"):
        read_records(path)


def test_llm_decomposer_parses_facts_and_maps_them_to_the_sentence_tokens():
    from candor.annotation.claim_split import fact_tokens, facts_of

    reply = "Here are the facts:\n- Fitzgerald wrote the novel.\n-  \n- He was American.\nDone"
    assert facts_of(reply) == ["Fitzgerald wrote the novel.", "He was American."]
    texts = [" F", ".", " Scott", " Fitzgerald", " wrote", " it", ";", " he", " was", " American", "."]
    sentence = list(range(11))
    assert fact_tokens("Fitzgerald wrote the novel.", sentence, texts) == [3, 4]
    assert fact_tokens("He was American.", sentence, texts) == [9]  # "he", "was": function words
    assert fact_tokens("Nothing shared here", [4, 5], texts) == [4, 5]  # no shared word: the whole sentence
    with pytest.raises(CandorError, match="needs a backend"):
        split_claims(ANSWER, completion(ANSWER), decomposer="llm")


def test_settled_end_releases_complete_claims_only():
    from candor.annotation.claims import settled_end

    growing = "1. The capital of France is Paris.\n2. Hamlet was"
    assert growing[: settled_end(growing)] == "1. The capital of France is Paris.\n2. "
    assert settled_end(growing, finished=True) == len(growing)
    assert settled_end("The capital of France is Paris. It is") == len("The capital of France is Paris. ")
    assert settled_end("") == 0
