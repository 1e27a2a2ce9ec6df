"""Model backends behind one protocol (``candor.backends.base.Backend``), by name.

Each entry of :data:`BACKENDS` is a loader ``(model, **kwargs) -> Backend``.
Loaders import their engine lazily, so importing candor (and ``candor --help``)
never pays for torch or transformers.

Also here: the engine the ``hf`` backend and live serving decode with
(:mod:`~candor.backends.engine`), the text calls of backends that hold a tokenizer
(:mod:`~candor.backends.tokenizer_mixin`), the embedded default model
(:mod:`~candor.backends.default_model`), token plumbing shared by every torch path
(:mod:`~candor.backends.tokens`), and the offline sentence-embedding model
(:mod:`~candor.backends.embeddings`).

May import: :mod:`candor.util`, :mod:`candor.data`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from candor.backends.base import Backend, Completion, Generations, SamplingParams
from candor.backends.default_model import DEFAULT_MODEL
from candor.util.errors import CandorError
from candor.util.registry import Registry

logger = logging.getLogger(__name__)

BackendLoader = Callable[..., Backend]

BACKENDS: Registry[BackendLoader] = Registry("backend")


@BACKENDS.register("hf")
def _load_hf(model: str, **kwargs: Any) -> Backend:
    """transformers on CPU or GPU (see ``candor.backends.hf.HFBackend.from_pretrained``)."""
    from candor.backends.hf import HFBackend

    return HFBackend.from_pretrained(model, **accepted_options(HFBackend.from_pretrained, kwargs))


@BACKENDS.register("openai")
def _load_openai(model: str, **kwargs: Any) -> Backend:
    """An OpenAI-compatible server at ``base_url`` (see ``candor.backends.openai.OpenAIBackend``)."""
    from candor.backends.openai import OpenAIBackend

    if not kwargs.get("base_url"):
        raise CandorError("the openai backend needs a server address (--base-url http://host:port/v1)")
    return OpenAIBackend(model, **accepted_options(OpenAIBackend.__init__, kwargs))


@BACKENDS.register("sglang")
def _load_sglang(model: str, **kwargs: Any) -> Backend:
    """An SGLang server at ``base_url`` (see ``candor.backends.sglang.SGLangBackend``).

    The tokenizer defaults to ``model`` where that is a local folder or the embedded default: its
    ``config.json`` gives the layer count the prompt's hidden states are read at.
    """
    from pathlib import Path

    from candor.backends.default_model import is_embedded
    from candor.backends.openai import OpenAIBackend
    from candor.backends.sglang import SGLangBackend

    if not kwargs.get("base_url"):
        raise CandorError("the sglang backend needs a server address (--base-url http://host:port/v1)")
    if not kwargs.get("tokenizer") and (is_embedded(model) or Path(model).is_dir()):
        kwargs["tokenizer"] = model
    options = accepted_options(OpenAIBackend.__init__, kwargs)
    if kwargs.get("num_hidden_layers") is not None:
        options["num_hidden_layers"] = kwargs["num_hidden_layers"]
    return SGLangBackend(model, **options)


@BACKENDS.register("vllm")
def _load_vllm(model: str, **kwargs: Any) -> Backend:
    """vLLM's offline engine in this process (see ``candor.backends.vllm.VLLMBackend``)."""
    from candor.backends.vllm import VLLMBackend

    return VLLMBackend.from_pretrained(model, **accepted_options(VLLMBackend.from_pretrained, kwargs))


def accepted_options(fn: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """The options ``fn`` takes, so one CLI can offer every backend's settings (unset ones are None)."""
    names = set(inspect.signature(fn).parameters)
    dropped = sorted(k for k, v in options.items() if k not in names and v is not None)
    if dropped:
        logger.debug("%s ignores options %s", getattr(fn, "__qualname__", fn), dropped)
    return {k: v for k, v in options.items() if k in names and v is not None}


def load_backend(model: str = DEFAULT_MODEL, backend: str = "hf", **kwargs: Any) -> Backend:
    """Load ``model`` on the named backend; extra keyword arguments go to its loader.

    Options the backend does not take, and options set to None, are left out,
    so callers can pass the settings of every backend at once.
    """
    return BACKENDS.get(backend)(model, **kwargs)


__all__ = [
    "BACKENDS",
    "Backend",
    "Completion",
    "Generations",
    "SamplingParams",
    "load_backend",
]
