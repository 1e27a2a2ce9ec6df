"""candor: make language models honest about what they know.

The front door (see :mod:`candor.api`)::

    import candor
    records = candor.annotate("starter", "runs/starter.jsonl", limit=8)
    print(candor.evaluate(candor.score(records, ["n-prob", "consis-sem"])).markdown())

Names load lazily, so ``import candor`` stays cheap (no torch until a model is used).
"""

from __future__ import annotations

from candor.util.lazy import lazy_exports
from candor.util.version import __version__

# public name -> module that defines it
_EXPORTS = {
    "load_model": "candor.api",
    "annotate": "candor.api",
    "score": "candor.api",
    "evaluate": "candor.evaluation.summary",
    "EliCal": "candor.api",
    "HonestModel": "candor.serve.model",
    "CandorError": "candor.util.errors",
    "get_calibrator": "candor.evaluation.calibration",
    "load_calibrator": "candor.evaluation.calibration",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, also=__all__)
