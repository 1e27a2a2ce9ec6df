"""Lazy package attributes (PEP 562): a package lists what it exports and from where, and pays
for an import only when a name is first used (``import candor`` stays free of torch)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], also: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``(__getattr__, __dir__)`` pair for ``package``.

    ``exports`` maps a public name to the module defining it, absolute or
    relative to ``package`` (``".model"``); ``also`` names what the package
    binds itself, so ``dir()`` lists it too. A loaded name is stored on the
    package, so each is imported once.
    """
    names = sorted({*exports, *also})

    def getattr_(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return list(names)

    return getattr_, dir_
