"""What every command shares: one-line errors with exit 2, the command's provenance, printing, list options."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from candor.util.errors import CandorError

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Print CandorError as one line and exit 2, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CandorError as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def invoked_command() -> str:
    """The command line that is running, for a report's provenance."""
    return shlex.join(["candor", *sys.argv[1:]])


def print_rich(renderable: Any) -> None:
    from rich.console import Console

    Console().print(renderable)


def counted(n: int, noun: str) -> str:
    """``1 method``, ``2 methods``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def comma_list(text: str, option: str) -> list[str]:
    """``"a, b,c"`` → ``["a", "b", "c"]``; an empty list is a user error naming ``option``."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise CandorError(f"{option} {text!r}: expected a comma-separated list, e.g. 0,1,2")
    return parts


def integer(text: str, option: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CandorError(f"{option}: {text!r} is not an integer") from None
