"""Claims: the facts of a long answer, each with its place in the text and in the tokens.

See docs/claims.md.

A :class:`Claim` is a piece of the generated answer: its text, its character
span ``[start, end)`` in the answer's text and the positions of the answer's
tokens it rests on (``tokens``, indices into ``completion.token_ids``). A
claim-level confidence reduces the answer's per-token numbers over ``tokens``,
as lm-polygraph's ``aligned_token_ids`` do.

The decomposers that split an answer into claims are in
:mod:`candor.annotation.claim_split` (``split_claims``); this module holds what
they share: the spans of sentences (:func:`sentence_spans`) and of tokens
(:func:`token_offsets`).

:func:`refine` drops (or marks) the claims whose confidence is below a threshold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from candor.backends.base import Completion
from candor.util.errors import CandorError


@dataclass
class Claim:
    """One claim of an answer (see the module docstring); ``label`` and ``judge`` once judged.

    ``question`` is the index of the question of a compound prompt this claim
    answers, by its position (None for a free answer); ``failure`` names why the
    claim is left out of claim metrics (an echoed question, an answer to another
    question, a repeated line; see :mod:`candor.annotation.claim_labels`).
    """

    text: str
    start: int
    end: int
    tokens: list[int] = field(default_factory=list)
    question: int | None = None
    label: int | None = None
    failure: str | None = None

    @property
    def token_start(self) -> int:
        return min(self.tokens) if self.tokens else 0

    @property
    def token_end(self) -> int:
        return max(self.tokens) + 1 if self.tokens else 0

    @property
    def scored(self) -> bool:
        """Whether the claim counts in claim metrics: labelled and no failure mode."""
        return self.label is not None and self.failure is None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "start": self.start, "end": self.end, "tokens": list(self.tokens)}
        for key in ("question", "label", "failure"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Claim:
        try:
            return cls(
                text=str(d["text"]),
                start=int(d["start"]),
                end=int(d["end"]),
                tokens=[int(t) for t in d.get("tokens", [])],
                question=None if d.get("question") is None else int(d["question"]),
                label=None if d.get("label") is None else int(d["label"]),
                failure=d.get("failure"),
            )
        except (KeyError, TypeError, ValueError) as exc:  # a ValueError: the records reader names file and line
            raise ValueError(f"a claim needs text, start, end and integer tokens ({exc})") from None


# Function words (English): they carry no fact of a claim (echo detection, fact-to-token mapping, CCP).
FUNCTION_WORDS = frozenset(
    {
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "if",
        "of",
        "at",
        "by",
        "for",
        "with",
        "about",
        "to",
        "from",
        "in",
        "on",
        "into",
        "over",
        "under",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "has",
        "have",
        "had",
        "do",
        "does",
        "did",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "he",
        "she",
        "they",
        "them",
        "his",
        "her",
        "their",
        "we",
        "our",
        "you",
        "your",
        "i",
        "me",
        "my",
        "as",
        "so",
        "than",
        "then",
        "there",
        "here",
        "which",
        "who",
        "whom",
        "whose",
        "what",
        "when",
        "where",
        "why",
        "how",
    }
)


# ---------------------------------------------------------------- token offsets


def token_offsets(
    completion: Completion, decode: Callable[[Sequence[int]], str] | None = None
) -> list[tuple[int, int]]:
    """The character span of each generated token in ``completion.text``.

    The token texts joined give the text (up to the surrounding whitespace a
    backend strips); when they do not (a character split across tokens), the
    spans come from decoding growing prefixes with ``decode``.
    """
    joined = "".join(completion.tokens)
    lead = len(joined) - len(joined.lstrip())
    if joined.strip() == completion.text and len(completion.tokens) == len(completion.logprobs or completion.tokens):
        return spans_from_lengths([len(t) for t in completion.tokens], lead, len(completion.text))
    if decode is None:
        raise CandorError(
            "the answer's token texts do not join into its text; pass the backend's decode to map claims to tokens"
        )
    ids = list(completion.token_ids)
    prefix_lengths = [len(decode(ids[: i + 1])) for i in range(len(ids))]
    full = decode(ids)
    lead = len(full) - len(full.lstrip())
    lengths = [b - a for a, b in zip([0, *prefix_lengths], prefix_lengths, strict=False)]
    return spans_from_lengths(lengths, lead, len(completion.text))


def spans_from_lengths(lengths: Sequence[int], lead: int, text_length: int) -> list[tuple[int, int]]:
    """Consecutive spans of the given lengths, shifted left by ``lead`` and clipped to the text."""
    spans, at = [], -lead
    for n in lengths:
        spans.append((min(max(at, 0), text_length), min(max(at + n, 0), text_length)))
        at += n
    return spans


def tokens_in_span(offsets: Sequence[tuple[int, int]], start: int, end: int) -> list[int]:
    """Positions of the tokens whose characters overlap ``[start, end)``."""
    return [i for i, (a, b) in enumerate(offsets) if b > start and a < end and b > a]


# ---------------------------------------------------------------- the sentence decomposer

_LIST_MARKER = re.compile(r"^\s*(?:\d{1,3}[.)]|[-*\u2022])\s+")
# A sentence ends at . ! ? followed by space, unless the period closes an initial or a short abbreviation.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_ABBREVIATION = re.compile(r"(?:\b[A-Z]|\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|vs|etc|No|Mt|U\.S))\.$")
_CLAUSE_END = re.compile(r";\s*")
_SEPARATOR = re.compile(r"[;, \t]*")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every sentence or clause of ``text``, list markers and whitespace left out."""
    out: list[tuple[int, int]] = []
    at = 0
    for line in text.split("\n"):
        marker = _LIST_MARKER.match(line)
        body_start = marker.end() if marker else 0
        out.extend((at + a, at + b) for a, b in _pieces(line, body_start))
        at += len(line) + 1
    return out


def settled_end(text: str, finished: bool = False) -> int:
    """How much of a growing answer holds only complete claims: the start of its last sentence.

    A stream can release the text up to here claim by claim (what follows may
    still grow into the same claim); once ``finished``, the whole text.
    """
    spans = sentence_spans(text)
    return len(text) if finished or not spans else spans[-1][0]


def _pieces(line: str, start: int) -> list[tuple[int, int]]:
    cuts = [start]
    for m in _SENTENCE_END.finditer(line, start):
        if not _ABBREVIATION.search(line[: m.start()]):
            cuts.append(m.end())
    cuts.extend(m.end() for m in _CLAUSE_END.finditer(line, start))
    cuts = sorted(set(cuts)) + [len(line)]
    spans = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        piece = line[a:b]
        if piece.strip(" ;\t"):
            left = a + len(piece) - len(piece.lstrip())
            right = a + len(piece.rstrip(" ;\t"))
            spans.append((left, right))
    return spans


# ---------------------------------------------------------------- refinement

RefineMode = Literal["remove", "mark"]
MARK_OPEN, MARK_CLOSE = "[?", "]"  # ``mark``: a low-confidence claim reads "[?claim]"


def refine(
    text: str, claims: Sequence[Claim], values: Sequence[float], threshold: float, mode: RefineMode = "remove"
) -> tuple[str, list[Claim]]:
    """The text with the claims below ``threshold`` removed (or marked), and those claims.

    ``remove`` cuts each low claim's span (and the list marker and whitespace of
    a line left empty); ``mark`` wraps it as ``[?claim]``. Spans must not overlap.
    """
    if len(claims) != len(values):
        raise CandorError(f"refine: {len(claims)} claims but {len(values)} values")
    if mode not in ("remove", "mark"):
        raise CandorError(f"refine: mode must be 'remove' or 'mark', got {mode!r}")
    low = sorted((c for c, v in zip(claims, values, strict=True) if v < threshold), key=lambda c: c.start)
    for a, b in zip(low, low[1:], strict=False):
        if b.start < a.end:
            raise CandorError(f"refine: claims {a.text!r} and {b.text!r} overlap; refine needs disjoint spans")
    out, at = [], 0
    for claim in low:
        out.append(text[at : claim.start])
        if mode == "mark":
            out.append(f"{MARK_OPEN}{text[claim.start : claim.end]}{MARK_CLOSE}")
            at = claim.end
        else:  # the separator after a removed claim goes with it
            at = claim.end + len(_SEPARATOR.match(text, claim.end).group())  # type: ignore[union-attr]
    out.append(text[at:])
    refined = "".join(out)
    return (tidy_lines(refined) if mode == "remove" else refined), list(low)


def tidy_lines(text: str) -> str:
    """Lines left with only a list marker or spaces dropped; runs of spaces inside a line closed up."""
    lines = []
    for line in text.split("\n"):
        if not _LIST_MARKER.sub("", line + " ").strip():
            continue
        lines.append(re.sub(r"(?<=\S) {2,}(?=\S)", " ", line).rstrip())
    return "\n".join(lines)
