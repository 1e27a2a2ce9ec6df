"""The claim head's stage targets (docs/claims.md "A trained claim head").

- Stage 1 (Eli), no labels: a claim's **self-consistency**, the share of the
  ``k`` sampled answers that support it. A compound prompt asks several
  questions; a claim answers the question at its position
  (:func:`candor.annotation.claim_labels.claim_positions`), and a sample
  supports the claim when one of the sample's sentences at **the same
  position** is judged equivalent to the claim by a consistency judge (default
  ``lexical-echo``, given the sub-question, so words that only repeat the
  question never make two answers agree).
- Stage 2 (Cal): the claim's correctness label (``Claim.label``, from
  :func:`candor.annotation.claim_labels.label_compound`); a claim has one
  label, so there is no "soft" target.

A claim at no question's position (past the last one) has no stage-1 target.
"""

from __future__ import annotations

from collections.abc import Sequence

from candor.annotation.claim_labels import claim_positions, compound_parts
from candor.annotation.claims import Claim, sentence_spans
from candor.annotation.judges import ConsistencyJudge
from candor.annotation.records import Record
from candor.util.errors import CandorError


def pieces_at(text: str, position: int) -> list[str]:
    """The sentences of an answer ``text`` that answer the question at ``position`` (list markers left out)."""
    claims = [Claim(text=text[a:b], start=a, end=b) for a, b in sentence_spans(text)]
    return [c.text for c, at in zip(claims, claim_positions(text, claims), strict=True) if at == position]


def claim_consistency(records: Sequence[Record], judge: ConsistencyJudge) -> list[list[float | None]]:
    """Per record, per claim: the share of its samples supporting the claim (None: the claim answers no question).

    Records must be compound prompts with claims and at least one sample. All pairs go to the judge in one call.
    """
    left: list[str] = []
    right: list[str] = []
    asked: list[str] = []
    owners: list[tuple[int, int, int]] = []  # (record, claim, sample) of each judged pair
    out: list[list[float | None]] = []
    for i, rec in enumerate(records):
        if rec.claims is None:
            raise CandorError(f"record {rec.id!r} has no claims; split its answer first (candor claims)")
        if not rec.samples:
            raise CandorError(
                f"record {rec.id!r} has no sampled answers: stage 1 of the claim head trains on the claims' "
                "self-consistency over samples (annotate with k > 0)"
            )
        parts = compound_parts(rec)
        positions = claim_positions(rec.greedy.text, rec.claims)
        row: list[float | None] = []
        for j, (claim, position) in enumerate(zip(rec.claims, positions, strict=True)):
            if not 0 <= position < len(parts):
                row.append(None)
                continue
            row.append(0.0)
            for s, sample in enumerate(rec.samples):
                for piece in pieces_at(sample.text, position):
                    left.append(piece)
                    right.append(claim.text)
                    asked.append(str(parts[position]["question"]))
                    owners.append((i, j, s))
        out.append(row)
    verdicts = judge.judge(left, right, asked) if left else []
    support: dict[tuple[int, int], set[int]] = {}
    for (i, j, s), verdict in zip(owners, verdicts, strict=True):
        if verdict:
            support.setdefault((i, j), set()).add(s)
    for i, rec in enumerate(records):
        for j, value in enumerate(out[i]):
            if value is not None:
                out[i][j] = len(support.get((i, j), ())) / len(rec.samples)
    return out


def claim_labels(records: Sequence[Record]) -> list[list[float | None]]:
    """Per record, per claim: the claim's 0/1 label, None when it is not scored (unlabelled or a failure mode)."""
    return [[float(c.label) if c.scored else None for c in rec.claims or []] for rec in records]  # type: ignore[arg-type]
