"""Claim labels: which claims of an answer are right, by which judge (docs/claims.md "Labels").

- **Compound prompts** (an item whose ``meta["parts"]`` lists its questions, as
  the ``compound`` template asks them): a claim answers the question at its
  position (the number of its list marker, else the order of its line), and is
  judged against that question's gold aliases by a correctness judge
  (``contains`` by default). Before judging, three failure modes are detected,
  counted and left out of claim metrics (``Claim.failure``), since they are not
  wrong facts but a prompt the model did not follow:

  - ``repeated``: the same text as an earlier claim of the answer;
  - ``echo``: the claim restates a question (it ends with ``?``, or every word
    it adds to a question of the prompt is a function word);
  - ``other-question``: it holds a gold alias of another question of the prompt
    (or the worked example's answer) and none of its own;
  - ``extra``: its position is past the last question.

- **Free answers**: an ``llm`` judge asks a model whether each claim is true
  (:func:`label_free_claims`), the judge's model named in provenance.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from candor.annotation.claims import FUNCTION_WORDS, Claim
from candor.annotation.judges import CorrectnessJudge, get_correctness_judge, parse_verdict
from candor.annotation.prompts import COMPOUND_EXAMPLE
from candor.annotation.records import Record
from candor.annotation.text_matching import contains_words, normalize
from candor.backends.base import Backend, SamplingParams
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

FAILURES = ("repeated", "echo", "other-question", "extra")
_MARKER_NUMBER = re.compile(r"^\s*(\d{1,3})[.)]\s+")


def compound_parts(record: Record) -> list[dict[str, Any]]:
    """The questions of a compound record (``item.meta["parts"]``), refused when absent."""
    parts = record.item.meta.get("parts")
    if not parts:
        raise CandorError(f"record {record.id!r} is not a compound prompt (no item.meta['parts'])")
    return list(parts)


def claim_positions(text: str, claims: Sequence[Claim]) -> list[int]:
    """The question index each claim answers: its line's list number minus one, else its line's order."""
    lines = text.split("\n")
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    order = {}
    for i, line in enumerate(lines):
        if line.strip():
            order[i] = len(order)
    out = []
    for claim in claims:
        line_no = max(i for i, s in enumerate(starts) if s <= claim.start)
        m = _MARKER_NUMBER.match(lines[line_no])
        out.append(int(m.group(1)) - 1 if m else order.get(line_no, line_no))
    return out


def is_echo(claim: str, questions: Sequence[str]) -> bool:
    """Whether ``claim`` restates one of ``questions`` (see the module docstring)."""
    if claim.rstrip().endswith("?"):
        return True
    words = set(normalize(claim).split())
    return any(not (words - set(normalize(q).split()) - FUNCTION_WORDS) for q in questions)


def _holds_any(text: str, aliases: Sequence[str]) -> bool:
    return any(contains_words(normalize(text), normalize(a)) for a in aliases if normalize(a))


def failure_of(claim: Claim, position: int, parts: Sequence[dict[str, Any]], earlier: set[str]) -> str | None:
    """The failure mode of one claim of a compound answer, or None (see the module docstring)."""
    if normalize(claim.text) in earlier:
        return "repeated"
    if is_echo(claim.text, [p["question"] for p in parts]):
        return "echo"
    own = parts[position]["answers"] if 0 <= position < len(parts) else []
    others = [a for j, p in enumerate(parts) if j != position for a in p["answers"]]
    example = [a.rstrip(".") for _, a in COMPOUND_EXAMPLE]
    if not _holds_any(claim.text, own) and (_holds_any(claim.text, others) or _holds_any(claim.text, example)):
        return "other-question"
    if not 0 <= position < len(parts):  # past the last question (or numbered 0)
        return "extra"
    return None


def label_compound(records: Sequence[Record], judge: CorrectnessJudge | None = None) -> dict[str, Any]:
    """Set each claim's ``question``, ``failure`` and ``label`` (records must carry claims); returns counts.

    Claims with a failure mode keep ``label`` None. The judge is named in each
    record's ``provenance["claim_judge"]``.
    """
    judge = judge or get_correctness_judge("contains")
    todo: list[tuple[Claim, list[str], str]] = []
    failures: Counter[str] = Counter()
    for rec in records:
        if rec.claims is None:
            raise CandorError(f"record {rec.id!r} has no claims; split the answers first")
        parts = compound_parts(rec)
        earlier: set[str] = set()
        for claim, position in zip(rec.claims, claim_positions(rec.greedy.text, rec.claims), strict=True):
            claim.question = position
            claim.failure = failure_of(claim, position, parts, earlier)
            earlier.add(normalize(claim.text))
            claim.label = None
            if claim.failure is None:
                todo.append((claim, list(parts[position]["answers"]), parts[position]["question"]))
            else:
                failures[claim.failure] += 1
        rec.provenance = {**rec.provenance, "claim_judge": judge.describe()}
    verdicts = judge.judge([c.text for c, _, _ in todo], [g for _, g, _ in todo], [q for _, _, q in todo])
    for (claim, _, _), verdict in zip(todo, verdicts, strict=True):
        claim.label = int(verdict)
    total = sum(len(r.claims or []) for r in records)
    answered = sum(len({c.question for c in r.claims or [] if c.failure is None}) for r in records)
    asked = sum(len(compound_parts(r)) for r in records)
    return {
        "claims": total,
        "scored": len(todo),
        "correct": int(sum(verdicts)),
        "failures": {name: failures.get(name, 0) for name in FAILURES},
        "questions_asked": asked,
        "questions_answered": answered,
    }


FREE_CLAIM_PROMPT = "Is the following statement true? Reply with one word, yes or no.\nStatement: {claim}"


def label_free_claims(records: Sequence[Record], backend: Backend, batch_size: int = 16) -> None:
    """Label every claim of free answers by asking ``backend`` whether it is true (``llm`` judge)."""
    claims = [c for rec in records for c in rec.claims or []]
    prompts = [
        backend.render_chat([{"role": "user", "content": FREE_CLAIM_PROMPT.format(claim=c.text)}]) for c in claims
    ]
    params = SamplingParams(max_new_tokens=4)
    replies: list[str] = []
    for start in range(0, len(prompts), batch_size):
        for gen in backend.generate(prompts[start : start + batch_size], 0, params, greedy=True):
            replies.append(gen.greedy.text if gen.greedy is not None else "")
    for claim, reply in zip(claims, replies, strict=True):
        claim.label = parse_verdict(reply)
    judge = {"name": "llm", "model": backend.model_name, "prompt": "free-claim", "max_new_tokens": 4}
    for rec in records:
        rec.provenance = {**rec.provenance, "claim_judge": judge}
