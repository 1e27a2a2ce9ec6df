"""Content hashes that key caches: weights on disk, weights in memory, canonical settings.

A cache entry must change when anything that determines its value changes
(docs/architecture.md "Conventions"): the model's weights, an adapter's or head's weights, the
options and the input. ``candor score`` and ``candor diagnose`` both key their
caches with these helpers.

- :func:`path_digest`: a file's bytes, or a folder's files (relative names and
  bytes, recursively), so an adapter or head retrained into the same folder
  gets a new digest;
- :func:`module_digest`: a loaded torch module's parameters and buffers, so
  two models saved under one name are told apart;
- :func:`backend_identity`: what a loaded backend is (name, adapter digest,
  weights digest where it holds a torch model);
- :func:`canonical`: settings as JSON-ready data, with path-valued settings
  replaced by their content digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def path_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes, or of every file under a folder (relative path and bytes, in sorted order)."""
    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file is not path:
            h.update(file.relative_to(path).as_posix().encode("utf-8") + b"\0")
        with file.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def module_digest(module: Any) -> str:
    """SHA-256 of a torch module's state: each tensor's name, dtype, shape and bytes."""
    import torch

    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}\0".encode())
        flat = t.contiguous().reshape(-1)
        step = max(1, _CHUNK // max(1, t.element_size()))
        for start in range(0, flat.numel(), step):  # chunked, so a big tensor on a GPU is copied piecewise
            h.update(flat[start : start + step].cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def backend_identity(backend: Any) -> dict[str, Any]:
    """``{"model", "adapter", "weights"}`` of a loaded backend (None where it does not apply)."""
    adapter = getattr(backend, "adapter", None)
    model = getattr(backend, "model", None)
    return {
        "model": getattr(backend, "model_name", None),
        "adapter": {"path": str(adapter), "sha256": path_digest(adapter)} if adapter else None,
        "weights": module_digest(model) if hasattr(model, "state_dict") else None,
    }


def canonical(value: Any, *, paths: bool = True) -> Any:
    """``value`` as plain JSON data that is equal exactly when the setting is.

    Mappings are sorted by key; a string or path naming an existing file or
    folder becomes ``{"path", "sha256"}``; an object with ``to_dict`` (a record)
    becomes its dict, a torch module its weights' digest; anything else becomes
    its type and ``repr`` (an object's default repr holds its address, so it
    never matches another run: a cache recomputes rather than guesses).
    Inside a record's dict strings are data (an answer "/" or "." is text, not a
    folder to hash), so ``paths`` is off there.
    """
    if isinstance(value, Mapping):
        return {str(k): canonical(v, paths=paths) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [canonical(v, paths=paths) for v in value]
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    if isinstance(value, (str, Path)):
        path = Path(value)
        if paths and str(value) and path.exists():
            return {"path": str(value), "sha256": path_digest(path)}
        return str(value)
    if hasattr(value, "to_dict"):
        return canonical(value.to_dict(), paths=False)
    if hasattr(value, "state_dict"):  # a loaded model or head: its repr shows the architecture, not the weights
        return {"type": type(value).__name__, "sha256": module_digest(value)}
    return {"type": type(value).__name__, "repr": repr(value)}


def json_digest(value: Any) -> str:
    """SHA-256 of ``value``'s canonical JSON."""
    return hashlib.sha256(json.dumps(canonical(value), sort_keys=True).encode("utf-8")).hexdigest()


def records_digest(records: Sequence[Any]) -> str:
    """SHA-256 of records' content (each one's ``to_dict``), in order."""
    h = hashlib.sha256()
    for rec in records:
        h.update(json.dumps(rec.to_dict(), sort_keys=True).encode("utf-8") + b"\n")
    return h.hexdigest()
