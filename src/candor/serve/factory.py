"""Build an :class:`HonestModel` from command-line choices (``candor ask``, ``candor serve``).

Precedence: a saved honest-model folder; else a generator (``model``, with an
optional ADVICE ``adapter``) plus a confidence source: an EliCal ``head``, an
estimator ``method``, or by default the adapter's first verbalized format
(with an adapter) or ``n-prob`` (without).
"""

from __future__ import annotations

import logging
from pathlib import Path

from candor.serve.confidence import ConfidenceSource, EstimatorSource, HeadSource
from candor.serve.model import Decoding, HonestModel
from candor.serve.thresholds import Threshold
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

DEFAULT_METHOD = "n-prob"


def adapter_method(adapter: Path) -> str:
    """The verbalized estimator matching the format an ADVICE/ConfTuner adapter was trained on."""
    from candor.train.advice.pipeline import load_result

    config = load_result(adapter).get("config") or {}
    formats = config.get("formats") or ["letter"]
    variant = config.get("variant", "default")
    return f"verbal-{formats[0]}" + ("" if variant == "default" else f"-{variant}")


def build_model(
    model: str,
    *,
    backend: str = "hf",
    honest: Path | None = None,
    head: Path | None = None,
    adapter: Path | None = None,
    method: str | None = None,
    threshold: float | None = None,
    max_new_tokens: int = 32,
    batch_size: int = 16,
    base_url: str | None = None,
) -> HonestModel:
    """An honest model from a saved folder or from its parts; ``threshold`` overrides a saved one.

    ``backend`` names the generator's engine in :data:`candor.backends.BACKENDS` (``hf`` in process;
    a remote engine when one is registered), while the confidence is computed locally.
    """
    from candor.backends import load_backend

    if honest is not None:
        if head or adapter or method:
            raise CandorError("--honest already holds the confidence source; drop --head/--adapter/--method")
        loaded = HonestModel.from_pretrained(honest, batch_size=batch_size)
        if threshold is not None:
            loaded.threshold = Threshold(threshold)
        return loaded
    if head is not None and method is not None:
        raise CandorError("give either --head (EliCal) or --method (an estimator), not both")
    kwargs: dict[str, object] = {"batch_size": batch_size}
    if base_url is not None:  # a remote OpenAI-compatible generator (--backend openai)
        kwargs["base_url"] = base_url
    if adapter is not None:
        kwargs["adapter"] = str(adapter)
    generator = load_backend(model, backend, **kwargs)
    source: ConfidenceSource
    if head is not None:
        source = HeadSource(head)
    else:
        source = EstimatorSource(method or (adapter_method(adapter) if adapter else DEFAULT_METHOD))
    logger.info("confidence: %s (%s)", source.name, source.kind)
    return HonestModel(generator, source, threshold=threshold, decoding=Decoding(max_new_tokens=max_new_tokens),
                       backend_name=backend)  # fmt: skip
