"""Build an :class:`HonestModel` from command-line choices (``candor ask``, ``candor serve``).

Precedence: a saved honest-model folder; else a generator (``model``, with an
optional ADVICE ``adapter``) plus a confidence source: an EliCal ``head``, an
estimator ``method``, or by default the adapter's first verbalized format
(with an adapter) or ``n-prob`` (without). With ``confidence_url``, ``head``
is an exported head (``candor export --to seq-cls``) served at that address
and no head weights load here (:mod:`candor.serve.classify_client`).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from candor.serve.answering import Decoding
from candor.serve.confidence_sources import ConfidenceSource, EstimatorSource, HeadSource
from candor.serve.model import HonestModel
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
    samples: int | None = None,
    confidence_url: str | None = None,
) -> HonestModel:
    """An honest model from a saved folder or from its parts; ``threshold`` overrides a saved one.

    ``backend`` names the generator's backend in :data:`candor.backends.BACKENDS` (``hf`` in process;
    a remote engine when one is registered), while the confidence is computed locally. Every choice
    that can be checked without the model (the threshold, the method and its ``samples``) is checked
    before the model loads; the method's needs of the backend right after.
    """
    from candor.backends import load_backend

    check_threshold(threshold)
    if confidence_url is not None:
        other = any((honest, adapter, method, samples is not None))
        return remote_head_model(
            model, backend, confidence_url, head, other, threshold, max_new_tokens, batch_size, base_url
        )
    if honest is not None:
        if head or adapter or method or samples is not None:
            raise CandorError("--honest already holds the confidence source; drop --head/--adapter/--method/--samples")
        loaded = HonestModel.from_pretrained(honest, batch_size=batch_size)
        if threshold is not None:
            loaded.threshold = Threshold(threshold)
        return loaded
    if head is not None and method is not None:
        raise CandorError("give either --head (EliCal) or --method (an estimator), not both")
    if head is not None and samples is not None:
        raise CandorError("--samples is for a sample-based --method; an EliCal --head reads the question alone")
    if method == "elical":
        raise CandorError("an EliCal head is served with --head DIR (the folder `candor train elical` wrote)")
    source: ConfidenceSource | None = None
    if head is None and (method is not None or adapter is None):
        source = EstimatorSource(method or DEFAULT_METHOD, samples=samples)
    kwargs: dict[str, object] = {"batch_size": batch_size}
    if base_url is not None:  # a remote OpenAI-compatible generator (--backend openai)
        kwargs["base_url"] = base_url
    if adapter is not None:
        kwargs["adapter"] = str(adapter)
    if head is not None:
        kwargs.update(engine_pass_options(head))
    generator = load_backend(model, backend, **kwargs)
    if head is not None:
        source = HeadSource(head)
    elif source is None:
        source = EstimatorSource(adapter_method(adapter), samples=samples)  # type: ignore[arg-type]
    logger.info("confidence: %s (%s)", source.name, source.kind)
    return HonestModel(
        generator, source, threshold=threshold, decoding=Decoding(max_new_tokens=max_new_tokens), backend_name=backend
    )


def remote_head_model(
    model: str,
    backend: str,
    confidence_url: str,
    export: Path | None,
    other_source: bool,
    threshold: float | None,
    max_new_tokens: int,
    batch_size: int,
    base_url: str | None,
) -> HonestModel:
    """A generator plus an exported head on a classify server; the server is probed before the generator loads."""
    from candor.backends import load_backend
    from candor.serve.classify_client import ClassifySource

    if export is None or other_source:
        raise CandorError(
            "--confidence-url reads the confidence of one exported head: give --head OUT (the folder "
            "`candor export HEAD --to seq-cls OUT` wrote) and no --honest/--adapter/--method/--samples"
        )
    source = ClassifySource(confidence_url, export)
    # a remote generator takes a whole micro-batch of questions at once (the openai backend's default is 8)
    kwargs: dict[str, object] = {"batch_size": batch_size, "max_concurrency": batch_size}
    if base_url is not None:
        kwargs["base_url"] = base_url
    generator = load_backend(model, backend, **kwargs)
    logger.info("confidence: the exported head %s served at %s", export, source.url)
    return HonestModel(
        generator, source, threshold=threshold, decoding=Decoding(max_new_tokens=max_new_tokens), backend_name=backend
    )


def engine_pass_options(head: Path) -> dict[str, object]:
    """What makes an engine hand out the layer ``head`` reads from its own generation pass.

    The ``vllm`` backend takes ``prompt_state_layers`` (its engine then writes those layers'
    states, :mod:`candor.backends.extracted_states`); backends that take no such option leave it
    out (:func:`candor.backends.accepted_options`). A LoRA-mode head reads its own adapted
    backbone, never the generator's states, so it asks for none.
    """
    from candor.train.elical.model import HeadConfig

    config = HeadConfig.read(Path(head))
    return {"prompt_state_layers": (config.layer,)} if config.mode == "head" else {}


def check_threshold(threshold: float | None) -> None:
    """A threshold is a confidence in [0, 1] (refused before any model loads)."""
    if threshold is not None and not (math.isfinite(threshold) and 0.0 <= threshold <= 1.0):
        raise CandorError(f"--threshold must be a confidence in [0, 1], got {threshold}")
