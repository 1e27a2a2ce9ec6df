"""Model backends behind one protocol (``candor.backends.base.Backend``), by name.

Each entry of :data:`BACKENDS` is a loader ``(model, **kwargs) -> Backend``.
Loaders import their engine lazily, so importing candor (and ``candor --help``)
never pays for torch or transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from candor.backends.base import Backend, Completion, Generations, SamplingParams
from candor.backends.default_model import DEFAULT_MODEL
from candor.registry import Registry

BackendLoader = Callable[..., Backend]

BACKENDS: Registry[BackendLoader] = Registry("backend")


@BACKENDS.register("hf")
def _load_hf(model: str, **kwargs: Any) -> Backend:
    """transformers on CPU or GPU (see ``candor.backends.hf.HFBackend.from_pretrained``)."""
    from candor.backends.hf import HFBackend

    return HFBackend.from_pretrained(model, **kwargs)


def load_backend(model: str = DEFAULT_MODEL, backend: str = "hf", **kwargs: Any) -> Backend:
    """Load ``model`` on the named backend; extra keyword arguments go to its loader."""
    return BACKENDS.get(backend)(model, **kwargs)


__all__ = [
    "BACKENDS",
    "Backend",
    "Completion",
    "Generations",
    "SamplingParams",
    "load_backend",
]
