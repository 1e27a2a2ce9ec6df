"""Where a served answer's confidence comes from: a trained EliCal head or any registered estimator.

Two kinds, in a registry so a saved model names its kind and reloads it:

- ``head``: an EliCal confidence head (docs/methods.md "EliCal"). It reads the question
  alone, so it decides *before* generating: a question it declines costs no
  generation at all.
- ``estimator``: any estimator of :mod:`candor.estimators` (``n-prob``,
  ``consis-lex``, ``p-true``, ``verbal-letter`` …). It scores an answer once it
  exists; a verbalized format on a backend that carries an ADVICE adapter is
  the answer-level confidence of ADVICE (§4.3, §4.5).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from candor.annotation.records import Record
from candor.backends.base import (
    LIVE_DECODE,
    PROMPT_HIDDEN_STATES,
    Backend,
    Completion,
    absolute_layer,
    backend_capabilities,
)
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.serve.answering import served_item
from candor.serve.classify_client import ClassifySource
from candor.train.elical.estimator import EliCalEstimator, same_weights
from candor.train.elical.model import HeadConfig, LinearHead, load_linear_head
from candor.util.errors import CandorError
from candor.util.registry import Registry

logger = logging.getLogger(__name__)

HEAD_DIR = "head"


def question_item(question: str, index: int = 0, history: tuple[tuple[str, str], ...] = ()) -> QAItem:
    return QAItem(id=f"q{index}", dataset="", split="", question=question, answers=(), history=history)


class ConfidenceSource(Protocol):
    """``before_generation`` sources score questions; the others score answered records."""

    kind: str
    name: str
    before_generation: bool
    samples: int  # sampled answers per question the source reads (0: none)
    # Optional ``runs_in_engine`` (default True): False for a question-level source whose scoring is a
    # remote call (it then runs in a worker thread instead of holding the engine between decode steps).
    # Optional ``reads_token_logprobs`` (default True): False for an answer-level source that reads only
    # the answers' texts and token ids, which serving then does not re-read alone (serve.rescoring).

    def check(self, backend: Backend) -> None:
        """Raise :class:`CandorError` (one line) when the source cannot serve on ``backend``."""
        ...

    def score_questions(self, questions: Sequence[str | QAItem]) -> np.ndarray: ...

    def score_records(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray: ...

    def save(self, folder: Path) -> dict[str, Any]: ...


class PrefillReader:
    """The head's linear layer on a hidden state the generator's prefill already computed.

    Called with the prefill's states at the prompt's last position: one vector
    per layer, embeddings first, as :data:`~candor.backends.base.PrefillHook`
    gives them (a live engine in this process), or, with ``from_engine_pass``,
    the layers a remote engine returned with its generation
    (:attr:`~candor.backends.base.Generations.prompt_states`, keyed by absolute
    layer). Returns the head's confidence, as :meth:`ConfidenceHead.predict`
    computes it from its own pass over the same prompt.
    """

    def __init__(self, head: LinearHead, layer: int, from_engine_pass: bool = False) -> None:
        self.head = head.eval()
        self.layer = layer
        self.from_engine_pass = from_engine_pass

    def __call__(self, states: Sequence[np.ndarray] | dict[int, np.ndarray]) -> float:
        if isinstance(states, dict):
            if self.layer not in states:
                raise CandorError(f"the engine's pass gave layers {sorted(states)}, not the head's layer {self.layer}")
        elif not -len(states) <= self.layer < len(states):
            raise CandorError(f"layer {self.layer} is out of range: the prefill gave {len(states)} hidden states")
        with torch.no_grad():
            return float(self.head(torch.from_numpy(np.asarray(states[self.layer])).unsqueeze(0))[0])


class HeadSource:
    """An EliCal head: confidence from the question alone, before any answer.

    Where the generator prefills the very prompt the head reads (same model and
    weights, same template) and runs a live engine, the head is read from that
    prefill (:meth:`prefill_reader`) and never loads a backbone of its own; a
    remote engine that returns the prompt's hidden states with its generation
    (the ``prompt_hidden_states`` capability: vLLM's ``extract_hidden_states``,
    SGLang's ``return_hidden_states``) is read the same way from that pass. The
    separate pass (:meth:`score_questions`) loads the backbone on first use.
    """

    kind = "head"
    name = "elical"
    before_generation = True
    samples = 0

    def __init__(self, head: str | Path | Any, batch_size: int = 16, device: str | None = None) -> None:
        self.estimator = EliCalEstimator(head=head, batch_size=batch_size, device=device)
        self.ran_own_pass = False  # whether the head ran its own backbone (loading it)

    def check(self, backend: Backend) -> None:
        return None  # the head carries its own backbone

    @property
    def calibrated_on_labels(self) -> bool:
        """Whether the head's output is a probability fitted on labels: EliCal's stage 2 ran."""
        return "cal" in (self.config().meta or {}).get("stages", [])

    def score_questions(self, questions: Sequence[str | QAItem]) -> np.ndarray:
        self.ran_own_pass = True
        return self.estimator.score_questions(list(questions))

    def score_records(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        self.ran_own_pass = True
        return self.estimator.estimate(records)

    def config(self) -> HeadConfig:
        source = self.estimator.head_source
        return HeadConfig.read(Path(source)) if isinstance(source, (str, Path)) else source.config

    def prefill_reader(self, backend: Backend, template: str) -> tuple[PrefillReader | None, str]:
        """A reader of the generator's prefill when it computes what the head reads, else None; and why."""
        config = self.config()
        generator = str(backend.model_name)
        if config.mode == "lora":
            return None, "the head is in LoRA mode (it reads its own adapted backbone): a separate pass per question"
        caps = backend_capabilities(backend)
        layer, engine_pass = config.layer, PROMPT_HIDDEN_STATES in caps and LIVE_DECODE not in caps
        if LIVE_DECODE not in caps and not engine_pass:
            return None, (
                "the generator has no live engine to read a prefill from, nor the prompt's hidden states from its "
                "generation pass: a separate pass per question"
            )
        if engine_pass:
            offered = tuple(getattr(backend, "prompt_state_layers", ()))
            try:
                layer = absolute_layer(config.layer, int(getattr(backend, "num_hidden_layers", -2)))
            except CandorError:
                layer = -1 - max(offered, default=0)  # out of the model's range: matches no layer offered
            if layer not in offered:
                return None, (
                    f"the engine returns the prompt's states of layers {list(offered)} from its pass, the head reads "
                    f"layer {config.layer}: a separate pass per question"
                )
        if config.template != template:
            return None, (
                f"the head reads the {config.template!r} template but the generator prefills {template!r}: "
                "a separate pass per question"
            )
        if not same_weights(config.backbone, generator) or getattr(backend, "adapter", None):
            return None, (
                f"the head's backbone {config.backbone!r} is not the generator's weights ({generator!r}"
                f"{' with an adapter' if getattr(backend, 'adapter', None) else ''}): a separate pass "
                "per question"
            )
        if engine_pass:
            return PrefillReader(self._linear_head(config), layer, from_engine_pass=True), (
                f"read from the engine's generation pass (layer {config.layer}, template {template!r}): no second "
                "prefill and no classify server; the engine generates the answer before the head decides, so a "
                "declined question's answer is generated and withheld"
            )
        return PrefillReader(self._linear_head(config), config.layer), (
            f"read from the generator's own prefill (layer {config.layer}, template {template!r}): one prefill for "
            "confidence and answer, no second backbone"
        )

    def _linear_head(self, config: HeadConfig) -> LinearHead:
        source = self.estimator.head_source
        if not isinstance(source, (str, Path)):
            return source.head  # type: ignore[no-any-return]
        return load_linear_head(source)

    def save(self, folder: Path) -> dict[str, Any]:
        source = self.estimator.head_source
        target = folder / HEAD_DIR
        if isinstance(source, (str, Path)):
            shutil.copytree(source, target)
        else:
            source.save_pretrained(target)
        return {"kind": self.kind, "head": HEAD_DIR}

    @classmethod
    def load(cls, config: dict[str, Any], folder: Path) -> HeadSource:
        return cls(folder / config["head"])


class EstimatorSource:
    """A registered estimator applied to the generated answer (and ``samples`` sampled ones).

    ``samples`` defaults to the estimator's own ``default_samples`` (0 for one
    that reads no samples); an estimator that reads samples refuses 0.
    """

    kind = "estimator"
    before_generation = False

    def __init__(self, name: str, samples: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.name = name
        self.options = dict(options or {})
        self.estimator = get_estimator(name, **self.options)
        wanted = int(getattr(self.estimator, "default_samples", 0))
        self.samples = wanted if samples is None else samples
        if self.samples < 0:
            raise CandorError(f"samples must be >= 0, got {self.samples}")
        if wanted and not self.samples:
            raise CandorError(
                f"estimator {name!r} reads sampled answers: give --samples of at least 1 (default {wanted})"
            )
        if not wanted and self.samples:
            raise CandorError(f"estimator {name!r} reads no sampled answers: drop --samples")
        needed = self.estimator.min_samples
        if self.samples and self.samples < needed:  # e.g. k = 1 for an estimator comparing samples pairwise
            raise CandorError(f"estimator {name!r} compares samples with each other: give --samples {needed} or more")

    def check(self, backend: Backend) -> None:
        self.estimator.check_generator(backend)  # the backend serving it both generates and scores

    @property
    def reads_token_logprobs(self) -> bool:
        """Whether the estimator reads the answers' token log-probs or top-k (see ``Estimator.requires``)."""
        return self.estimator.reads_token_logprobs

    def score_questions(self, questions: Sequence[str | QAItem]) -> np.ndarray:
        raise CandorError(f"estimator {self.name!r} scores answers; generate first")

    def score_records(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        return self.estimator.estimate(records, backend)

    def save(self, folder: Path) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "samples": self.samples, "options": self.options}

    @classmethod
    def load(cls, config: dict[str, Any], folder: Path) -> EstimatorSource:
        return cls(config["name"], samples=config.get("samples"), options=config.get("options"))


SOURCES: Registry[Callable[[dict[str, Any], Path], ConfidenceSource]] = Registry("confidence source")
SOURCES.register("head")(HeadSource.load)
SOURCES.register("estimator")(EstimatorSource.load)
SOURCES.register("classify")(ClassifySource.load)  # an exported head on a classify server


def load_source(config: dict[str, Any], folder: Path) -> ConfidenceSource:
    return SOURCES.get(str(config.get("kind")))(config, folder)


def as_source(confidence: str | ConfidenceSource) -> ConfidenceSource:
    """A source from an estimator name (``"n-prob"``) or a source object as it is."""
    if isinstance(confidence, str):
        return EstimatorSource(confidence)
    return confidence


def answer_records(
    questions: Sequence[str | QAItem],
    answers: Sequence[Completion],
    samples: Sequence[list[Completion]],
    provenance: dict[str, Any] | None = None,
) -> list[Record]:
    """Unlabelled records for an estimator: each answer as the record's greedy answer.

    ``provenance`` (model, template, decoding) travels with each record, so an
    estimator that re-reads the prompt renders the one the answer was made with.
    """
    return [
        Record(
            item=q if isinstance(q, QAItem) else served_item(q),
            greedy=a,
            samples=list(s),
            provenance=dict(provenance or {}),
        )
        for q, a, s in zip(questions, answers, samples, strict=True)
    ]
