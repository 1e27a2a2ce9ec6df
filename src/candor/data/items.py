"""The QA item: what every loader produces and every later stage consumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class QAItem:
    """One question with its gold answers (docs/architecture.md "Vocabulary").

    ``answers`` holds gold aliases: a response is correct when it matches any.
    A multiple-choice item also has ``choices`` and ``answer_index``; its
    ``answers`` then holds the option letter and the option text.
    ``context`` is an optional passage shown before the question (LogiQA).
    ``history`` is the conversation the question was asked in, oldest first, as
    ``(role, text)`` pairs (``system``, ``user``, ``assistant``): empty for a
    question asked alone, which is every benchmark item (docs/architecture.md
    "Conversations").
    """

    id: str
    dataset: str
    split: str
    question: str
    answers: tuple[str, ...]
    choices: tuple[str, ...] | None = None
    answer_index: int | None = None
    context: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    history: tuple[tuple[str, str], ...] = ()

    @property
    def is_multiple_choice(self) -> bool:
        return self.choices is not None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["answers"] = list(self.answers)
        if self.choices is not None:
            out["choices"] = list(self.choices)
        out["history"] = [{"role": role, "content": text} for role, text in self.history] or None
        return {k: v for k, v in out.items() if v is not None and v != {}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QAItem:
        return cls(
            id=str(d["id"]),
            dataset=str(d.get("dataset", "")),
            split=str(d.get("split", "")),
            question=str(d["question"]),
            answers=tuple(d["answers"]),
            choices=tuple(d["choices"]) if d.get("choices") is not None else None,
            answer_index=d.get("answer_index"),
            context=d.get("context"),
            meta=dict(d.get("meta") or {}),
            history=tuple((str(t["role"]), str(t["content"])) for t in d.get("history") or ()),
        )


OPTION_LETTERS = "ABCDEFGHIJ"


class QAItems(list[QAItem]):
    """A loader's items, plus how many input rows were skipped as unjudgeable.

    A plain list in every other way; slicing gives a plain list, so read
    ``skipped`` from the list a loader returned.
    """

    skipped: int = 0
