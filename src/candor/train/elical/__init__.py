"""EliCal (Ni et al., 2025): question-level confidence elicited, then calibrated (docs/methods.md "EliCal").

A confidence head on a causal LM reads the QA prompt and predicts, before any
answer exists, how likely the model is to answer correctly. Stage 1 (Eli)
trains it on the consistency rate of sampled answers, which needs no gold
labels; stage 2 (Cal) calibrates it on a small labelled budget.

    from candor.train.elical import Budget, EliCalConfig, train_elical, ConfidenceHead

    result = train_elical(train, dev, method="elical", budget=Budget(1000),
                          config=EliCalConfig(mode="head"), out_dir="heads/elical")
    head = ConfidenceHead.from_pretrained("heads/elical")
    head.predict(["Who wrote Hamlet?"])        # array([0.31])

Modules: :mod:`~candor.train.elical.model` (the head, save/load),
:mod:`~candor.train.elical.features` (cached features for ``head`` mode),
:mod:`~candor.train.elical.targets` (stage targets and their checks),
:mod:`~candor.train.elical.budgets` (the label budget), :mod:`~candor.train.elical.pool`
(the pool, its dev slice and the test-question check every EliCal run shares), :mod:`~candor.train.elical.trainer`
(the Trainer subclass), :mod:`~candor.train.elical.config` (the settings),
:mod:`~candor.train.elical.pipeline` (the stages),
:mod:`~candor.train.elical.held_out` (the held-out-domain report of ``candor train``),
:mod:`~candor.train.elical.selection` (stage 2's rule, chosen by held-out domains),
:mod:`~candor.train.elical.sweep` (the label-budget sweep) and its
:mod:`~candor.train.elical.curve`, :mod:`~candor.train.elical.estimator` (the
``elical`` estimator, which scores records with a trained head) and
:mod:`~candor.train.elical.export` (a head as a standard sequence classifier).

Names load lazily, so the estimator registry can find the ``elical`` estimator
without importing torch.

May import the stages before :mod:`candor.train` and the rest of it (see :mod:`candor.train`).
"""

from __future__ import annotations

# Eager: the function shares its module's name, and a lazy name would be shadowed by the
# submodule once anything imports it.
from candor.train.elical.targets import targets  # noqa: F401 (in __all__)
from candor.util.lazy import lazy_exports

# public name -> module of this package that defines it
_EXPORTS = {
    "EliCalConfig": ".config",
    "FeatureCache": ".features",
    "ConfidenceHead": ".model",
    "HeadConfig": ".model",
    "LinearHead": ".model",
    "Budget": ".budgets",
    "WHOLE_POOL": ".budgets",
    "TrainingPool": ".pool",
    "carve_dev": ".pool",
    "check_disjoint": ".pool",
    "DEFAULT_BUDGETS": ".sweep",
    "SweepData": ".sweep",
    "run_sweep": ".sweep",
    "STAGES": ".pipeline",
    "StageResult": ".pipeline",
    "train_elical": ".pipeline",
    "train_stage": ".pipeline",
    "export_seq_cls": ".export",
    "TrainResult": "candor.train.common",
}

__all__ = sorted([*_EXPORTS, "targets"])


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, also=__all__)
