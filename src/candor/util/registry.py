"""Named registries: one per kind (judges, estimators, backends, calibrators, ...).

Adding a method is one file and one decorator::

    JUDGES = Registry("correctness judge")

    @JUDGES.register("contains")
    class Contains: ...

A registry may also take entries from other packages: given ``plugins``, the
name of an entry-point group, it imports each module that group lists the
first time a name is looked up or listed, and those modules register
themselves with the same decorator. That is how a later stage (candor's
trained methods) or another installed package adds entries to an earlier
stage's registry without the earlier stage importing it.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import logging
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Registry(Generic[T]):
    """A name → object map with a decorator and a helpful unknown-name error."""

    def __init__(self, kind: str, plugins: str | None = None) -> None:
        self.kind = kind
        self.plugins = plugins
        self._entries: dict[str, T] = {}
        self._plugins_loaded = plugins is None
        self._no_plugins_found = False

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return decorator

    def _load_plugins(self) -> None:
        """Import every module of the ``plugins`` entry-point group once (they register on import)."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True  # before loading: a plugin's own lookups must not recurse
        entries = importlib.metadata.entry_points(group=self.plugins)
        self._no_plugins_found = not entries
        for entry in entries:
            try:
                entry.load()
            except Exception as exc:  # one broken plugin must not hide the others
                logger.warning("%s plugin %r (%s) failed to load: %s", self.kind, entry.name, entry.value, exc)

    def get(self, name: str) -> T:
        if name not in self._entries:
            self._load_plugins()
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            close = difflib.get_close_matches(name, list(self._entries), n=3, cutoff=0.6)
            guess = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
            hint = ""
            if self._no_plugins_found:  # e.g. run from a source tree that was never pip-installed
                hint = f" (no {self.plugins!r} entry points are installed: `pip install -e .` registers them)"
            raise CandorError(f"unknown {self.kind} {name!r}{guess}; known: {known}{hint}") from None

    def build(self, name: str, **kwargs: Any) -> Any:
        """Call the registered factory with ``kwargs``; bad options are a user error."""
        factory = self.get(name)
        try:
            return factory(**kwargs)  # type: ignore[operator]
        except TypeError as exc:
            raise CandorError(f"{self.kind} {name!r}: bad options {sorted(kwargs)} ({exc})") from None

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            self._load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
