"""The shape of a request: what a calibration is fitted on, and what it holds for (docs/serving.md).

A served question has one of three shapes, a function of the turns before it alone:

- :data:`QUESTION` (``"question"``): asked alone;
- a **system-prompt shape** (``"system:<12 hex>"``, :func:`system_shape`): asked after exactly one
  system (or developer) message and no other turn, named by the sha256 of that message's text;
- :data:`CONVERSATION` (``"conversation"``): after anything else (earlier turns, several system messages).

Two system prompts are the same when their texts are equal after removing trailing whitespace
(:func:`normalize_system_prompt`; a file's final newline does not count); every other character
counts, case, inner spacing and line breaks included.

An honest folder's ``tuned_on`` lists the shapes its threshold and calibrator (or head) were fitted
on (:func:`shapes_of`: the shapes of the records they were fitted on), and holds the text of each
system prompt it names; a served answer is ``calibrated`` only for a request of one of those shapes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from candor.util.errors import CandorError

QUESTION, CONVERSATION = "question", "conversation"
SYSTEM_PREFIX = "system:"
SYSTEM_DIGITS = 12  # hex digits of the sha256 in a system-prompt shape

History = Sequence[tuple[str, str]]


def normalize_system_prompt(text: str) -> str:
    """The text two system prompts are compared on: trailing whitespace removed, nothing else changed."""
    return text.rstrip()


def system_shape(text: str) -> str:
    """``system:<first 12 hex of sha256(normalized text)>``: the shape of a question asked after this system prompt."""
    digest = hashlib.sha256(normalize_system_prompt(text).encode("utf-8")).hexdigest()
    return SYSTEM_PREFIX + digest[:SYSTEM_DIGITS]


def is_system_shape(shape: str) -> bool:
    return shape.startswith(SYSTEM_PREFIX)


def shape_of(history: History) -> str:
    """The shape of a question asked after ``history`` (``(role, text)`` turns, oldest first)."""
    if not history:
        return QUESTION
    if len(history) == 1 and history[0][0] == "system":
        return system_shape(history[0][1])
    return CONVERSATION


def shapes_of(histories: Iterable[History]) -> tuple[str, ...]:
    """The shapes of questions asked after each of ``histories``, sorted; :data:`QUESTION` when there are none."""
    return tuple(sorted({shape_of(h) for h in histories})) or (QUESTION,)


def system_prompts_of(histories: Iterable[History]) -> dict[str, str]:
    """Each system-prompt shape among ``histories`` with its (normalized) text."""
    out: dict[str, str] = {}
    for h in histories:
        shape = shape_of(h)
        if is_system_shape(shape):
            out.setdefault(shape, normalize_system_prompt(h[0][1]))
    return out


def shape_words(shape: str) -> str:
    """The questions of a shape, in words (the ``calibrated_on`` of a response)."""
    if is_system_shape(shape):
        return f"questions asked with the deployment's system prompt (sha {shape[len(SYSTEM_PREFIX) :]})"
    words = {QUESTION: "questions asked alone", CONVERSATION: "questions asked in conversations"}
    if shape not in words:
        raise CandorError(f"unknown request shape {shape!r} (question, conversation or system:<12 hex>)")
    return words[shape]


def check_shape(shape: str) -> str:
    """``shape`` itself, or a :class:`CandorError` naming what a shape may be."""
    if is_system_shape(shape):
        digits = shape[len(SYSTEM_PREFIX) :]
        if len(digits) != SYSTEM_DIGITS or any(c not in "0123456789abcdef" for c in digits):
            raise CandorError(f"request shape {shape!r}: a system-prompt shape is system:<{SYSTEM_DIGITS} hex digits>")
        return shape
    shape_words(shape)
    return shape


def read_system_prompt(path: str | Path) -> str:
    """The system prompt in a UTF-8 text file, normalized; refused when unreadable or empty.

    The bytes are decoded as they are (no newline translation): a ``\\r\\n`` in the file must be one in the request.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CandorError(f"--system-prompt-file {path}: cannot read it as UTF-8 text ({exc})") from None
    text = normalize_system_prompt(text)
    if not text.strip():
        raise CandorError(f"--system-prompt-file {path}: the file is empty")
    return text
