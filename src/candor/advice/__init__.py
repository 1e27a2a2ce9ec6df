"""ADVICE and ConfTuner: training a model to state answer-dependent, calibrated confidence (DESIGN.md §4.5).

- :mod:`candor.advice.triplets`: (question, a_correct, a_wrong) from annotated records.
- :mod:`candor.advice.losses`: L_LM, L_JSD, L_Margin, L_Sum and ConfTuner's tokenized Brier.
- :mod:`candor.advice.data`: tokenized examples, one-format-per-batch sampler, collators.
- :mod:`candor.advice.trainer`: the ``transformers.Trainer`` subclasses.
- :mod:`candor.advice.config`: one config class per method (AdviceConfig, ConfTunerConfig) and the presets.
- :mod:`candor.advice.pipeline`: the one call that trains and saves a LoRA adapter.
"""

from candor.advice.config import METHODS, AdviceConfig, ConfTunerConfig, method_config
from candor.advice.losses import LossWeights, brier, jsd, jsd_hinge, margin_hinge, sum_penalty
from candor.advice.pipeline import is_trained, load_result, train
from candor.advice.triplets import Triplet, TripletSet, TripletStats, build_triplets, read_triplets, write_triplets
from candor.training import TrainResult

__all__ = [
    "METHODS",
    "AdviceConfig",
    "ConfTunerConfig",
    "LossWeights",
    "TrainResult",
    "Triplet",
    "TripletSet",
    "TripletStats",
    "brier",
    "build_triplets",
    "is_trained",
    "jsd",
    "jsd_hinge",
    "load_result",
    "margin_hinge",
    "method_config",
    "read_triplets",
    "sum_penalty",
    "train",
    "write_triplets",
]
