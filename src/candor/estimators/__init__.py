"""Confidence estimators by name, and running several of them into a confidences table or file.

Training-free, question level (docs/methods.md "Training-free estimators"): ``prob``, ``n-prob``,
``min-prob``, ``consis-lex``, ``consis-sem``, ``verbal-0``, ``verbal-10``.
Answer level: ``p-true``, ``verbal-{letter,number,text,float,percent}`` and
their ``-prompting`` variants (§4.3, §4.5), ``self-consistency``.

The strong baselines of issue 14, question level: from next-token
distributions ``token-entropy-mean``, ``token-entropy-max``, ``prob-margin``,
``perplexity``; from the samples ``mc-entropy``, ``semantic-entropy``,
``semantic-entropy-discrete``, ``num-sem-sets``, ``eigv``, ``degree``,
``eccentricity``, ``kle``, ``cocoa`` (similarity-based ones take
``similarity=lexical|judge|llm|embedding``); from hidden states
``eigenscore``. The answer-length baseline ``length`` (direction fitted on
dev records when given). ``ensemble``: named estimators stacked by a logistic
regression fitted on dev records; any estimator takes ``debias=length``
(with ``debias_dev``) to remove what answer length explains.

Importing this package registers every estimator module listed below; a new
estimator is one module with one ``@ESTIMATORS.register`` and one import here.
Estimators that read a trained artifact (``elical``: EliCal's head; ``probe``:
the answer-level linear probe) live with their trainers in :mod:`candor.train`
and join :data:`ESTIMATORS` through the ``candor.estimators`` entry-point group
(``pyproject.toml``), the same door another installed package can use.

:mod:`~candor.estimators.confidences` holds the confidences file and how columns
get into it (:func:`score_records` in memory, :func:`score_into` a file, with reuse).
Shared helpers: :mod:`~candor.estimators.answers` (the answers a record holds),
:mod:`~candor.estimators.hidden_layers`.

May import: :mod:`candor.util`, :mod:`candor.data`, :mod:`candor.backends`,
:mod:`candor.annotation`, :mod:`candor.verbal`.
"""

from __future__ import annotations

from candor.estimators import (  # noqa: F401
    annotated_consistency,
    cocoa,
    debias,
    eigenscore,
    ensemble,
    kernel_entropy,
    length,
    logprob,
    ptrue,
    sample_entropy,
    selfconsistency,
    spectral,
    tokenstats,  # noqa: F401
    verbal_answer,
    verbal_question,
)
from candor.estimators.base import ESTIMATORS, Estimator, get_estimator
from candor.estimators.confidences import score_into, score_records

__all__ = ["ESTIMATORS", "Estimator", "get_estimator", "score_into", "score_records"]
