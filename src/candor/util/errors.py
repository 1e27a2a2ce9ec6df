"""The one exception type for user mistakes.

Anything a user can fix (a bad file, a missing field, an unknown name, a wrong
format) raises :class:`CandorError` with a message that says where and what.
The CLI prints the message without a traceback and exits with code 2.
"""

from __future__ import annotations

from pathlib import Path


class CandorError(Exception):
    """A user-facing error: bad input, unknown name, inconsistent settings."""


class UpstreamError(CandorError):
    """A server candor relies on (a generation or classify endpoint) is unreachable or answered badly.

    Still a :class:`CandorError` (the CLI exits 2 with its message); ``candor
    serve`` answers it with 502, since the client's request was not at fault.
    """


def at_line(path: str | Path, line: int, message: str) -> CandorError:
    """Build an error that names the file and the 1-based line it came from."""
    return CandorError(f"{path}:{line}: {message}")
