"""The answer an answer-level estimator judges: the record's greedy answer, as the model would state it.

For open QA it is the greedy text. For a multiple-choice item it is the option
letter, read from replies such as "B", "(B)", "B. Paris", "**B**" or "The
answer is B"; a reply with no letter is kept as it is.
"""

from __future__ import annotations

import re

from candor.annotation.records import Record
from candor.data.items import OPTION_LETTERS, QAItem

_STATED = re.compile(r"(?i:answer|option)\s*(?:is|:)?\s*[(\[*]*([A-J])(?![A-Za-z])")
_LEADING = re.compile(r"^[\s(\[*\"'`]*([A-J])(?![A-Za-z])")


def option_letter(text: str, item: QAItem) -> str | None:
    """The option letter a reply chooses, or None; only letters of the item's options count."""
    if item.choices is None:
        return None
    allowed = OPTION_LETTERS[: len(item.choices)]
    for pattern in (_LEADING, _STATED):
        m = pattern.search(text)
        if m and m.group(1) in allowed:
            return m.group(1)
    return None


def stated_answer(text: str, item: QAItem) -> str:
    """``text`` as an answer to ``item``: its option letter for multiple choice, else stripped."""
    return option_letter(text, item) or text.strip()


def record_answer(record: Record) -> str:
    """The record's greedy answer as an estimator shows it to the model."""
    return stated_answer(record.greedy.text, record.item)
