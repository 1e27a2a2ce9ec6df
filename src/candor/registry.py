"""Named registries: one per kind (judges, estimators, backends, calibrators, ...).

Adding a method is one file and one decorator::

    JUDGES = Registry("correctness judge")

    @JUDGES.register("contains")
    class Contains: ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from candor.errors import CandorError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name → object map with a decorator and a helpful unknown-name error."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise CandorError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def build(self, name: str, **kwargs: Any) -> Any:
        """Call the registered factory with ``kwargs``; bad options are a user error."""
        factory = self.get(name)
        try:
            return factory(**kwargs)  # type: ignore[operator]
        except TypeError as exc:
            raise CandorError(f"{self.kind} {name!r}: bad options {sorted(kwargs)} ({exc})") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
