"""Training confidence: EliCal, ADVICE, ConfTuner and the answer probe, behind ``candor train METHOD``.

- :mod:`~candor.train.common`: what every trainer builds on (model loading, LoRA, ``TrainingArguments``,
  ``TrainResult``, the test-question check); :mod:`~candor.train.settings`: ``KEY=VALUE`` settings to configs.
- :mod:`~candor.train.trainers`: :data:`TRAINERS`, the table of methods behind ``candor train``.
- :mod:`~candor.train.elical`: the question-level head (docs/methods.md "EliCal").
- :mod:`~candor.train.advice`: answer-dependent verbalized confidence and ConfTuner (§4.5).
- :mod:`~candor.train.probe`: the answer-level linear probe.

Each method package has ``config.py`` (its settings), ``trainer.py`` (the
``transformers.Trainer`` subclass) and ``pipeline.py`` (the one call that
trains and saves). The estimators that read a trained artifact (``elical``,
``probe``) live beside their trainer and join the estimator registry through
the ``candor.estimators`` entry point, so :mod:`candor.estimators` never
imports this stage. Every trainer refuses test questions and writes the
fingerprints of its training questions into what it saves, through the
contamination guard (:mod:`candor.annotation.contamination`, one stage down
because scoring reads the same manifests).

Inside the stage, :mod:`~candor.train.common` and :mod:`~candor.train.settings` sit below the
method packages, which import neither each other nor :mod:`~candor.train.trainers`, the one module
above them all.

May import every stage before it: :mod:`candor.util`, :mod:`candor.data`,
:mod:`candor.backends`, :mod:`candor.annotation`, :mod:`candor.verbal`,
:mod:`candor.estimators`, :mod:`candor.evaluation`.
"""
