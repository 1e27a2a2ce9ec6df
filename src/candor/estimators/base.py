"""The estimator interface and its registry.

See docs/architecture.md "Vocabulary"; docs/methods.md "Training-free estimators".

An estimator turns records (and, for some, a model) into one confidence in
[0, 1] per record. Every estimator is a small class registered by name::

    @ESTIMATORS.register("n-prob")
    class NormalizedProb(Estimator):
        name = "n-prob"
        def _estimate(self, records, backend): ...

The public :meth:`Estimator.estimate` checks the backend first (present when
needed, white-box when hidden states are needed) and the output afterwards
(one finite value in [0, 1] per record), so each estimator only computes.

``requires`` names every backend capability an estimator depends on,
including what it reads from the records: :data:`LOGPROBS` when it reads a
completion's token log-probs (``logprobs`` or ``stop_logprob``),
:data:`TOP_LOGPROBS` when it reads the top-k alternatives. Those two travel in
the records (:data:`RECORDED`), so they are asked of the backend that
*generates* the answers (:meth:`Estimator.check_generator`, as serving does),
not of a backend that only scores records made earlier
(:meth:`Estimator.check_backend`). ``tests/test_estimators_requires.py``
checks every registered estimator's declaration against what it reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from candor.annotation.records import Record
from candor.backends.base import LOGPROBS, TOP_LOGPROBS, Backend, backend_capabilities
from candor.util.errors import CandorError
from candor.util.registry import Registry

logger = logging.getLogger(__name__)

Level = Literal["question", "answer"]

# Capabilities whose output a record carries (a completion's token log-probs and top-k alternatives):
# needed of the backend that generated the answers, not of one that scores records made earlier.
RECORDED = frozenset({LOGPROBS, TOP_LOGPROBS})


class Estimator:
    """Base class: ``name``, ``needs_backend``, ``needs_hidden_states``, ``level``.

    ``level`` is ``"question"`` for a confidence that does not look at an
    answer (EliCal's kind) and ``"answer"`` for one about the greedy answer.
    """

    name: str = "estimator"
    needs_backend: bool = False
    needs_hidden_states: bool = False
    # Backend capabilities this estimator needs (names from candor.backends.base), checked up front;
    # an instance may set its own when an option changes what it reads (see the module docstring).
    requires: frozenset[str] = frozenset()
    level: Level = "question"
    # Sampled answers per record this estimator needs (0: none); a caller choosing k can check it up front.
    min_samples: ClassVar[int] = 0
    # Sampled answers per record it reads (``record.samples``) when nobody says how many:
    # k = 5, as in docs/methods.md "HonestyBench-mini".
    # 0 for an estimator that reads none.
    default_samples: ClassVar[int] = 0
    # Values slightly outside [0, 1] from float round-off are clipped; anything further is a bug.
    _tolerance: ClassVar[float] = 1e-6

    def estimate(self, records: Sequence[Record], backend: Backend | None = None) -> np.ndarray:
        """One confidence in [0, 1] per record, in the records' order."""
        self.check_backend(backend)
        if not records:
            return np.zeros(0, dtype=float)
        out = np.asarray(self._estimate(records, backend), dtype=float)
        return self._checked(out, len(records))

    @property
    def reads_token_logprobs(self) -> bool:
        """Whether it reads the answers' token log-probs or top-k alternatives (not only their texts and tokens)."""
        return bool(self.requires & RECORDED)

    def check_generator(self, backend: Backend) -> None:
        """Raise :class:`CandorError` when this estimator cannot score answers that ``backend`` generates.

        :meth:`check_backend`, plus the capabilities it reads from the records
        (:data:`RECORDED`): a generator without log-probs makes answers that
        log-prob estimators cannot score.
        """
        self.check_backend(backend)
        self._refuse_missing(backend, self.requires & RECORDED, "with the answers it generates")

    def check_backend(self, backend: Backend | None) -> None:
        """Raise :class:`CandorError` when this estimator cannot run on ``backend``.

        ``backend`` is the one scoring the records; what the records carry
        (:data:`RECORDED`) is not asked of it (see :meth:`check_generator`).
        """
        if self.needs_backend and backend is None:
            raise CandorError(f"estimator {self.name!r} needs a model backend (pass --model / backend=...)")
        if self.needs_hidden_states and not getattr(backend, "white_box", False):
            kind = type(backend).__name__
            raise CandorError(
                f"estimator {self.name!r} needs hidden states, which the black-box backend {kind} "
                "does not give; use a white-box backend such as hf"
            )
        if backend is not None:
            self._refuse_missing(backend, self.requires - RECORDED)

    def _refuse_missing(self, backend: Backend, needed: frozenset[str], where: str = "") -> None:
        missing = needed - backend_capabilities(backend)
        if missing:
            kind = getattr(backend, "describe_kind", type(backend).__name__)
            raise CandorError(
                f"estimator {self.name!r} needs {', '.join(sorted(missing))}, which the backend {kind} "
                f"does not offer{' ' + where if where else ''}; use a backend that does (hf, vllm, or a server "
                "that returns log-probs)"
            )

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Settings that define this estimator, for provenance."""
        return {"name": self.name, "level": self.level}

    def _checked(self, out: np.ndarray, n: int) -> np.ndarray:
        if out.shape != (n,):
            raise RuntimeError(f"estimator {self.name!r} returned shape {out.shape} for {n} records")
        bad = ~np.isfinite(out) | (out < -self._tolerance) | (out > 1 + self._tolerance)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise RuntimeError(f"estimator {self.name!r} gave {out[i]!r} for record {i}, outside [0, 1]")
        return np.clip(out, 0.0, 1.0)


EstimatorFactory = Callable[..., Estimator]

ESTIMATORS: Registry[EstimatorFactory] = Registry("estimator", plugins="candor.estimators")


@dataclass(frozen=True)
class OptionWrapper:
    """Options any estimator takes (``keys``), applied by wrapping the built estimator (``wrap``)."""

    keys: tuple[str, ...]
    wrap: Callable[[Estimator, dict[str, Any]], Estimator]


# e.g. ``debias``/``debias_dev`` (candor.estimators.debias): registered by the wrapping module, so this one
# imports none of them.
WRAPPERS: Registry[OptionWrapper] = Registry("estimator wrapper")


def get_estimator(name: str, **kwargs: Any) -> Estimator:
    """Build a registered estimator, e.g. ``get_estimator("consis-sem", judge="llm", backend=b)``.

    Options named by a :data:`WRAPPERS` entry (``debias=length``) are taken out and wrap the built estimator.
    """
    wrappers = []
    for wrapper_name in WRAPPERS.names():
        wrapper = WRAPPERS.get(wrapper_name)
        own = {key: kwargs.pop(key) for key in wrapper.keys if key in kwargs}
        if own:
            wrappers.append((wrapper, own))
    estimator = ESTIMATORS.build(name, **kwargs)
    for wrapper, own in wrappers:
        estimator = wrapper.wrap(estimator, own)
    return estimator
