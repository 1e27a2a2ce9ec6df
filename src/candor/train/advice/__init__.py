"""ADVICE and ConfTuner: training a model to state answer-dependent, calibrated confidence.

See docs/methods.md "ADVICE and ConfTuner".

- :mod:`candor.train.advice.triplets`: (question, a_correct, a_wrong) from annotated records.
- :mod:`candor.train.advice.losses`: L_LM, L_JSD, L_Margin, L_Sum and ConfTuner's tokenized Brier.
- :mod:`candor.train.advice.data`: tokenized examples, one-format-per-batch sampler, collators.
- :mod:`candor.train.advice.trainer`: the ``transformers.Trainer`` subclasses.
- :mod:`candor.train.advice.config`: one config class per method (AdviceConfig, ConfTunerConfig) and the presets.
- :mod:`candor.train.advice.pipeline`: the one call that trains and saves a LoRA adapter.

May import the stages before :mod:`candor.train` and the rest of it (see :mod:`candor.train`).
"""

from candor.train.advice.config import METHODS, AdviceConfig, ConfTunerConfig, method_config
from candor.train.advice.losses import LossWeights, brier, jsd, jsd_hinge, margin_hinge, sum_penalty
from candor.train.advice.pipeline import is_trained, load_result, train
from candor.train.advice.triplets import (
    Triplet,
    TripletSet,
    TripletStats,
    build_triplets,
    read_triplets,
    write_triplets,
)
from candor.train.common import TrainResult

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
