"""Which hidden layer the hidden-state estimators read, and the texts they read it on.

Both read the last token of the record's QA prompt followed by an answer
(a sample for EigenScore, the greedy answer for the probe), at a middle layer
by default: ``(layers + 1) // 2`` in the backend's ``hidden_states`` indexing
(0 is the embedding output), INSIDE's choice of ``len(hidden_states) / 2``.
"""

from __future__ import annotations

from collections.abc import Sequence

from candor.backends.base import Backend
from candor.util.errors import CandorError


def middle_layer(backend: Backend) -> int:
    """The middle entry of ``output_hidden_states`` for the backend's model."""
    config = getattr(getattr(backend, "model", None), "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    if layers is None:
        raise CandorError(
            f"cannot tell how many layers backend {type(backend).__name__} has; pass layer=<index> explicitly"
        )
    return (int(layers) + 1) // 2


def answer_texts(prompts: Sequence[str], answers: Sequence[str]) -> list[str]:
    """The prompt followed by the answer, as the model saw them (answers are stored stripped)."""
    return [p + a for p, a in zip(prompts, answers, strict=True)]
