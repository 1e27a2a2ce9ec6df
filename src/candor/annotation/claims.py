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


# ---------------------------------------------------------------- list markers and headings

# A list marker: numbering (``1.``, ``2)``, ``(a)``, ``a.``, ``iv.``, ``(ii)``, ``B)``)
# or a bullet (``-``, ``*``, ``•``).
# A capital letter with a period (``A.``) is left out: it reads as an initial (``F. Scott``).
_NUMBERING = r"(?:(?:\d{1,3}|[a-z]|[ivx]{2,5}|[IVX]{2,5})[.)]|[A-Z]\)|\((?:\d{1,3}|[A-Za-z]|[ivx]{2,5}|[IVX]{2,5})\))"
_BULLET = r"[-*+\u2022\u2023\u2043\u25aa\u25e6\u00b7\u2013\u2014]"
_MARKER = rf"(?:{_NUMBERING}|{_BULLET})"
_ONE_MARKER = re.compile(rf"{_MARKER}(?:[ \t]+|$)")
_MARKERS = re.compile(rf"[ \t]*(?:{_MARKER}(?:[ \t]+|$))+")
_HEADING = re.compile(r"[ \t]{0,3}#{1,6}(?:[ \t]|$)")  # a Markdown (ATX) heading line
_UNDERLINE = re.compile(r"[ \t]{0,3}(?:=+|-{2,})[ \t]*")  # under a line, it makes that line a (setext) heading
# A marker after a colon opens the next piece ("Three facts: 1. Paris is ..."); such a "1." ends no sentence.
_MARKER_AFTER_COLON = re.compile(rf"(?<=:)[ \t]+({_MARKER})(?=[ \t])")
_NUMBERING_AFTER_COLON = re.compile(rf":[ \t]+{_NUMBERING}$")
# Where a list marker can stand inside a line: after the end of a sentence or clause, or a colon.
_PIECE_START = re.compile(r"[.!?;:][ \t]+")
# Inline numbering with a closing parenthesis opens a piece once a "1)" came before ("1) Paris is big 2) it is old").
_INLINE_NUMBERING = re.compile(r"(?<=[ \t])\d{1,3}\)(?=[ \t]+\S)")
_FIRST_NUMBER = re.compile(r"(?:^|(?<=[ \t]))1\)[ \t]")


def is_heading(line: str, below: str = "") -> bool:
    """Whether a line is a Markdown heading (``# Paris``, or a line over ``===`` or ``---``): it states no claim.

    ``below`` is the next line.
    """
    if _HEADING.match(line):
        return True
    # under a list item, "---" is a rule, not an underline
    return bool(line.strip() and _UNDERLINE.fullmatch(below) and marker_end(line, 0) == 0)


def marker_end(text: str, at: int, end: int | None = None) -> int:
    """Past the list markers (and the spaces after them) that start at ``at``; ``at`` when there are none."""
    m = _MARKERS.match(text, at, len(text) if end is None else end)
    return m.end() if m else at


# ---------------------------------------------------------------- the sentence decomposer

# A sentence ends at . ! ? followed by space, unless the period closes an initial or a short abbreviation.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_ABBREVIATION = re.compile(r"(?:\b[A-Z]|\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|vs|etc|No|Mt|U\.S))\.$")
_CLAUSE_END = re.compile(r";\s*")
_SEPARATOR = re.compile(r"[;, \t]*")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every sentence or clause of ``text`` that states something.

    List markers (numbering, bullets) are left out of the span and are never a
    span of their own; a heading line, or a piece with no letter or digit, gives none.
    """
    out: list[tuple[int, int]] = []
    at = 0
    lines = text.split("\n")
    for line, below in zip(lines, [*lines[1:], ""], strict=True):
        if not is_heading(line, below):
            out.extend((at + a, at + b) for a, b in _pieces(line))
        at += len(line) + 1
    return out


def settled_end(text: str, finished: bool = False) -> int:
    """How much of a growing answer holds only complete claims: the start of its last sentence.

    A stream can release the text up to here claim by claim (what follows may
    still grow into the same claim); once ``finished``, the whole text.
    """
    spans = sentence_spans(text)
    return len(text) if finished or not spans else spans[-1][0]


def _pieces(line: str) -> list[tuple[int, int]]:
    cuts = [0]
    for m in _SENTENCE_END.finditer(line):
        before = line[: m.start()]
        if not (_ABBREVIATION.search(before) or _NUMBERING_AFTER_COLON.search(before)):
            cuts.append(m.end())
    cuts.extend(m.start(1) for m in _MARKER_AFTER_COLON.finditer(line))
    cuts.extend(m.end() for m in _CLAUSE_END.finditer(line))
    cuts.extend(m.start() for m in _INLINE_NUMBERING.finditer(line) if _FIRST_NUMBER.search(line, 0, m.start()))
    cuts = sorted(set(cuts)) + [len(line)]
    spans = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        a = marker_end(line, a, b)  # the list markers that open the piece are not part of it
        piece = line[a:b]
        if any(ch.isalnum() for ch in piece):
            left = a + len(piece) - len(piece.lstrip())
            right = a + len(piece.rstrip(" ;\t"))
            spans.append((left, right))
    return spans


# ---------------------------------------------------------------- refinement

RefineMode = Literal["remove", "mark"]
MARK_OPEN, MARK_CLOSE = "[?", "]"  # ``mark``: a low-confidence claim reads "[?claim]"


@dataclass(frozen=True)
class Refinement:
    """What :func:`refine` returns.

    ``text``: the refined text; ``removed``: the claims below the threshold
    (removed, or marked with ``mark``), in text order; ``spans``: for each claim
    given, in the order given, its ``[start, end)`` in ``text`` (a marked claim's
    inside the marks), None for a removed claim or one not whole in ``text``.
    """

    text: str
    removed: list[Claim]
    spans: list[tuple[int, int] | None]


def refine(
    text: str, claims: Sequence[Claim], values: Sequence[float], threshold: float, mode: RefineMode = "remove"
) -> Refinement:
    """The text with the claims below ``threshold`` removed (or marked), those claims, and where each claim now is.

    ``remove`` cuts each low claim's span with the separator after it and the
    list marker that opens it (a line left empty goes, a run of spaces it leaves
    closes up; lines no claim was cut from stay as they were); ``mark`` wraps it
    as ``[?claim]``, after its marker. Spans must not overlap.
    """
    if len(claims) != len(values):
        raise CandorError(f"refine: {len(claims)} claims but {len(values)} values")
    if mode not in ("remove", "mark"):
        raise CandorError(f"refine: mode must be 'remove' or 'mark', got {mode!r}")
    low = sorted((c for c, v in zip(claims, values, strict=True) if v < threshold), key=lambda c: c.start)
    for a, b in zip(low, low[1:], strict=False):
        if b.start < a.end:
            raise CandorError(f"refine: claims {a.text!r} and {b.text!r} overlap; refine needs disjoint spans")
    edit = _Edit(text)
    at = 0
    for claim in low:
        edit.keep(at, claim.start)
        if mode == "mark":
            edit.insert(MARK_OPEN)
            edit.keep(claim.start, claim.end)
            edit.insert(MARK_CLOSE)
            at = claim.end
        else:  # the separator after a removed claim goes with it
            edit.cut()
            at = claim.end + len(_SEPARATOR.match(text, claim.end).group())  # type: ignore[union-attr]
    edit.keep(at, len(text))
    if mode == "remove":
        edit.tidy()
    removed = {id(c) for c in low} if mode == "remove" else set()
    spans = [None if id(c) in removed else edit.span(c.start, c.end) for c in claims]
    return Refinement(text=edit.text(), removed=list(low), spans=spans)


class _Edit:
    """A text being refined: each character with the position it came from in the original (None: inserted)."""

    def __init__(self, original: str) -> None:
        self.original = original
        self.chars: list[str] = []
        self.origin: list[int | None] = []
        self.cuts: list[int] = []  # where in the edited text something was removed

    def keep(self, start: int, end: int) -> None:
        self.chars.extend(self.original[start:end])
        self.origin.extend(range(start, end))

    def insert(self, piece: str) -> None:
        self.chars.extend(piece)
        self.origin.extend([None] * len(piece))

    def cut(self) -> None:
        self.cuts.append(len(self.chars))

    def text(self) -> str:
        return "".join(self.chars)

    def span(self, start: int, end: int) -> tuple[int, int] | None:
        """Where the original ``[start, end)`` is now; None when its first or last character is gone."""
        if end <= start:
            return None
        where = {o: i for i, o in enumerate(self.origin) if o is not None}
        if start not in where or end - 1 not in where:
            return None
        return where[start], where[end - 1] + 1

    def tidy(self) -> None:
        """In each line something was cut from: drop the markers left opening nothing, the line if left empty,
        the spaces left doubled or trailing."""
        text = self.text()
        keep = [True] * len(text)
        line_start = 0
        for line in text.split("\n"):
            line_end = line_start + len(line)
            if any(line_start <= c <= line_end for c in self.cuts):
                mask = _tidy_line(line)
                if not "".join(ch for ch, k in zip(line, mask, strict=True) if k).strip():
                    mask = [False] * len(line)
                    newline = line_end if line_end < len(text) else line_start - 1  # the line goes with a newline
                    if newline >= 0:
                        keep[newline] = False
                keep[line_start:line_end] = mask
            line_start = line_end + 1
        chars = [ch for ch, k in zip(self.chars, keep, strict=True) if k]
        origin = [o for o, k in zip(self.origin, keep, strict=True) if k]
        left = "".join(chars)  # and no blank line is left opening or closing the text
        first, last = left[: len(left) - len(left.lstrip())].rfind("\n") + 1, len(left.rstrip())
        self.chars, self.origin = chars[first:last], origin[first:last]


def _tidy_line(line: str) -> list[bool]:
    """Which characters of a line a cut left stay: not an orphaned marker, a doubled or trailing space."""
    keep = [True] * len(line)
    starts = [len(line) - len(line.lstrip(" \t"))] + [m.end() for m in _PIECE_START.finditer(line)]
    for p in starts:
        markers = []
        while m := _ONE_MARKER.match(line, p):
            markers.append((p, m.end()))
            p = m.end()
        opens_text = bool(markers) and bool(line[p:].strip())
        for a, b in markers[:-1] if opens_text else markers:  # a marker followed by another, or by nothing
            keep[a:b] = [False] * (b - a)
    kept = [i for i, k in enumerate(keep) if k]
    previous, inside = None, False
    for i in kept:  # runs of spaces between words close up to one (the indentation stays)
        if line[i] == " " and inside and previous is not None and line[previous] == " ":
            keep[i] = False
            continue
        inside = inside or line[i] not in " \t"
        previous = i
    for i in reversed(kept):  # trailing spaces go
        if keep[i] and line[i] not in " \t":
            break
        keep[i] = False
    return keep
