"""Last-token features of a frozen backbone, computed once and cached on disk (``head`` mode).

The cache is a folder per (backbone, layer, template, weights dtype); a feature row is keyed
by the SHA-256 of its prompt text, so the same prompts never run the model
twice, whichever records or runs they come from::

    <root>/<model>--layer<layer>--<template>[--<dtype>]/   (no suffix for float32)
      shard-<digest>.npy    float32 [rows, hidden]
      shard-<digest>.json   the prompt keys of those rows, in order (written last)

New rows go to a new shard, written to a temporary name and renamed, and a
shard counts only once its key file exists, so a killed run never leaves a
half-written entry: at worst it recomputes its last batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from candor.util.files import atomic_target

logger = logging.getLogger(__name__)

# Prompts per model call when filling the cache: bounded memory, and a killed run loses one chunk.
CHUNK = 256

Extractor = Callable[[Sequence[str]], np.ndarray]


def prompt_key(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[-80:] or "model"


class FeatureCache:
    """Features of one backbone, layer, template and weights dtype, by prompt text."""

    def __init__(self, root: str | Path, model: str, layer: int, template: str, dtype: str = "float32") -> None:
        # The weights' dtype changes the features: a bf16 backbone's rows must never serve a float32 run.
        # float32 keeps the folder name caches had before the dtype was part of the key.
        suffix = "" if dtype == "float32" else f"--{_slug(dtype)}"
        self.folder = Path(root) / f"{_slug(model)}--layer{layer}--{_slug(template)}{suffix}"
        self.hits = 0
        self.misses = 0
        self._rows: dict[str, np.ndarray] = {}
        self._load()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, prompts: Sequence[str], extract: Extractor) -> np.ndarray:
        """``[len(prompts), hidden]`` features; only prompts not cached go through ``extract``."""
        keys = [prompt_key(p) for p in prompts]
        todo = list(dict.fromkeys(k for k in keys if k not in self._rows))
        self.misses += len(todo)
        self.hits += sum(k in self._rows for k in keys)
        by_key = {k: p for k, p in zip(keys, prompts, strict=True)}
        if todo:
            logger.info("feature cache %s: %d of %d prompts not cached yet", self.folder.name, len(todo), len(keys))
        for start in range(0, len(todo), CHUNK):
            chunk = todo[start : start + CHUNK]
            values = np.asarray(extract([by_key[k] for k in chunk]), dtype=np.float32)
            self._store(chunk, values)
            logger.info("feature cache %s: extracted %d of those %d", self.folder.name, start + len(chunk), len(todo))
        if not keys:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._rows[k] for k in keys])

    def _store(self, keys: list[str], values: np.ndarray) -> None:
        if values.shape[0] != len(keys):
            raise RuntimeError(f"feature extractor returned {values.shape[0]} rows for {len(keys)} prompts")
        self.folder.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256("".join(keys).encode()).hexdigest()[:16]
        stem = self.folder / f"shard-{digest}"
        _atomic_write(stem.with_suffix(".npy"), lambda fh: np.save(fh, values))
        _atomic_write(stem.with_suffix(".json"), lambda fh: fh.write(json.dumps(keys).encode()))
        self._rows.update(zip(keys, values, strict=True))

    def _load(self) -> None:
        if not self.folder.exists():
            return
        for key_file in sorted(self.folder.glob("shard-*.json")):
            keys = json.loads(key_file.read_text())
            values = np.load(key_file.with_suffix(".npy"))
            if values.shape[0] != len(keys):
                logger.warning("feature cache: %s does not match its keys; ignoring it", key_file.name)
                continue
            self._rows.update(zip(keys, values, strict=True))


def _atomic_write(path: Path, write: Callable) -> None:
    with atomic_target(path) as tmp, tmp.open("wb") as fh:
        write(fh)
