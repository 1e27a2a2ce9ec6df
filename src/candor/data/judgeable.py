"""Which items can be judged, and how the ones that cannot are skipped and counted.

An item can be judged when it has at least one non-blank gold alias. Real
HonestyBench files hold items like ``"answer": [""]``: a blank alias would
make the ``contains`` judge call every response correct, so such an item is
skipped. Every reader (QA files, Hugging Face datasets, multiple choice,
HonestyBench imports) skips through :class:`SkippedItems`, which logs one
warning per file with the count and the first line numbers; ``strict=True``
turns the first such item into an error instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from candor.util.errors import CandorError, at_line

log = logging.getLogger(__name__)

# How many line numbers the warning names.
SHOWN_LINES = 5


class UnjudgeableItem(CandorError):
    """An item with no gold answer to judge a response against (e.g. ``"answer": [""]``)."""


def judgeable_aliases(aliases: Iterable[str | None]) -> tuple[str, ...]:
    """The non-blank aliases; :class:`UnjudgeableItem` when none is left."""
    given = list(aliases)
    kept = tuple(a for a in given if a is not None and a.strip())
    if not kept:
        raise UnjudgeableItem(f"no non-empty answer alias (answer {given!r}), so the item cannot be judged")
    return kept


@dataclass
class SkippedItems:
    """The lines of one source that were skipped as unjudgeable."""

    source: str
    strict: bool = False
    lines: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.lines)

    def skip(self, line: int, exc: UnjudgeableItem) -> None:
        """Count ``line`` as skipped, or raise (naming file and line) when strict."""
        if self.strict:
            raise at_line(self.source, line, str(exc)) from None
        self.lines.append(line)

    def first_lines(self) -> str:
        shown = ", ".join(str(n) for n in self.lines[:SHOWN_LINES])
        return shown + (", ..." if self.count > SHOWN_LINES else "")

    def warn(self) -> None:
        """One warning for the whole source, if anything was skipped."""
        if self.lines:
            log.warning(
                "%s: skipped %d item(s) with no non-empty answer alias (lines %s); --strict refuses them instead",
                self.source,
                self.count,
                self.first_lines(),
            )

    def check_something_left(self, kept: int) -> None:
        """A source whose every item was skipped is an error, not an empty result."""
        if self.lines and kept == 0:
            raise at_line(
                self.source,
                self.lines[0],
                f"no item can be judged: all {self.count} have no non-empty answer alias (lines {self.first_lines()})",
            )
