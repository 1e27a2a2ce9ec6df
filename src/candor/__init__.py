"""candor: make language models honest about what they know.

The front door (see :mod:`candor.api`)::

    import candor
    records = candor.annotate("starter", "runs/starter.jsonl", limit=8)
    print(candor.evaluate(candor.score(records, ["n-prob", "consis-sem"])).markdown())

Names load lazily, so ``import candor`` stays cheap (no torch until a model is used).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "load_model": "candor.api",
    "annotate": "candor.api",
    "score": "candor.api",
    "evaluate": "candor.api",
    "EliCal": "candor.api",
    "CandorError": "candor.errors",
    "get_calibrator": "candor.calibrators",
    "load_calibrator": "candor.calibrators",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'candor' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
