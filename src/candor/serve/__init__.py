"""Honest answering: a generator, a confidence, and a threshold to abstain below.

See docs/architecture.md "The stages".

- :mod:`~candor.serve.model`: :class:`HonestModel`, one folder via ``save_pretrained``;
- :mod:`~candor.serve.answering`: what one question's answering passes around (the ask, the reply
  settings, the listener, the answer);
- :mod:`~candor.serve.confidence_sources`: where the confidence comes from (EliCal head or any estimator);
- :mod:`~candor.serve.thresholds`: choosing the abstention threshold on dev (accuracy, coverage, risk control);
- :mod:`~candor.serve.batching`: the engine a question runs on (live decode loop, or micro-batches of ``generate``);
- :mod:`~candor.serve.rescoring`: a question's answers re-read alone, so its confidence is its own;
- :mod:`~candor.serve.claim_answers`: a confidence per claim of a long answer (``--claims``);
- :mod:`~candor.serve.factuality`: the claim threshold with a factuality guarantee (``--factuality-alpha``);
- :mod:`~candor.serve.honest_folder`: the saved folder (``honest.json``), read and written in one place;
- :mod:`~candor.serve.factory`: the honest model a command's options name;
- :mod:`~candor.serve.classify_client`: a confidence read from a classify server;
- :mod:`~candor.serve.shapes`: request shapes (alone, after a system prompt, a conversation): what a
  calibration holds for;
- :mod:`~candor.serve.adaptation`: ``candor adapt``, a model recalibrated on its own served traffic.

The web door, ``candor serve``'s OpenAI-compatible service, is :mod:`candor.serve.http`; this
core never imports it. The last stage: it may import every other one (util through diagnose).
"""

from candor.serve.answering import Decoding, HonestAnswer, ServedBy
from candor.serve.model import HonestModel
from candor.serve.thresholds import Threshold

__all__ = ["Decoding", "HonestAnswer", "HonestModel", "ServedBy", "Threshold"]
