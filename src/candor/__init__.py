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

from candor.util.version import __version__

# public name -> module that defines it
_EXPORTS = {
    "load_model": "candor.api",
    "annotate": "candor.api",
    "score": "candor.api",
    "evaluate": "candor.api",
    "EliCal": "candor.api",
    "CandorError": "candor.util.errors",
    "get_calibrator": "candor.evaluation.calibration",
    "load_calibrator": "candor.evaluation.calibration",
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
