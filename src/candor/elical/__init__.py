"""EliCal (Ni et al., 2025): question-level confidence elicited, then calibrated (DESIGN.md §4.4).

A confidence head on a causal LM reads the QA prompt and predicts, before any
answer exists, how likely the model is to answer correctly. Stage 1 (Eli)
trains it on the consistency rate of sampled answers, which needs no gold
labels; stage 2 (Cal) calibrates it on a small labelled budget.

    from candor.elical import EliCalConfig, train_elical, ConfidenceHead

    result = train_elical(train, dev, method="elical", budget=1000,
                          config=EliCalConfig(mode="head"), out_dir="heads/elical")
    head = ConfidenceHead.from_pretrained("heads/elical")
    head.predict(["Who wrote Hamlet?"])        # array([0.31])

Modules: :mod:`~candor.elical.model` (the head, save/load),
:mod:`~candor.elical.features` (cached features for ``head`` mode),
:mod:`~candor.elical.targets` (stage targets and their checks),
:mod:`~candor.elical.splits` (budgets, dev slice), :mod:`~candor.elical.trainer`
(the Trainer subclass), :mod:`~candor.elical.config` (the settings),
:mod:`~candor.elical.train` (the stages),
:mod:`~candor.elical.sweep` (the label-budget sweep).
"""

from candor.elical.config import EliCalConfig
from candor.elical.features import FeatureCache
from candor.elical.model import ConfidenceHead, HeadConfig, LinearHead
from candor.elical.splits import carve_dev, check_disjoint, draw_budget, parse_budget
from candor.elical.sweep import DEFAULT_BUDGETS, SweepData, run_sweep
from candor.elical.targets import targets
from candor.elical.train import STAGES, StageResult, train_elical, train_stage
from candor.training import TrainResult

__all__ = [
    "DEFAULT_BUDGETS",
    "STAGES",
    "ConfidenceHead",
    "EliCalConfig",
    "FeatureCache",
    "HeadConfig",
    "LinearHead",
    "StageResult",
    "SweepData",
    "TrainResult",
    "carve_dev",
    "check_disjoint",
    "draw_budget",
    "parse_budget",
    "run_sweep",
    "targets",
    "train_elical",
    "train_stage",
]
