"""Honest answering: a generator, a confidence, and a threshold to abstain below.

See docs/architecture.md "The stages".

- :mod:`~candor.serve.model`: :class:`HonestModel`, one folder via ``save_pretrained``;
- :mod:`~candor.serve.answering`: what one question's answering passes around (the ask, the reply
  settings, the listener, the answer);
- :mod:`~candor.serve.confidence_sources`: where the confidence comes from (EliCal head or any estimator);
- :mod:`~candor.serve.thresholds`: choosing the abstention threshold on dev (accuracy, coverage, risk control);
- :mod:`~candor.serve.batching`: the engine a question runs on (live decode loop, or micro-batches of ``generate``);
- :mod:`~candor.serve.rescoring`: a question's answers re-read alone, so its confidence is its own;
- :mod:`~candor.serve.app`: the OpenAI-compatible service (``candor serve``), with its settings,
  request checks, response shapes, the running model's generations (hot reload) and the
  operator's routes (feedback, reload) in modules of their own;
- :mod:`~candor.serve.claim_answers`: a confidence per claim of a long answer (``--claims``);
- :mod:`~candor.serve.adaptation`: ``candor adapt``, a model recalibrated on its own served traffic.

The last stage: it may import every other one (util through diagnose).
"""

from candor.serve.answering import Decoding, HonestAnswer
from candor.serve.model import HonestModel
from candor.serve.thresholds import Threshold

__all__ = ["Decoding", "HonestAnswer", "HonestModel", "Threshold"]
