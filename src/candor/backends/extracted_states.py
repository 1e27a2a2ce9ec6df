"""The prompt's hidden states that vLLM writes from its own generation pass (``extract_hidden_states``).

vLLM (PR 33736) extracts hidden states inside the pass that generates: the
``extract_hidden_states`` speculative method caches the chosen layers' states
as if they were a draft model's KV cache, and a hidden-states KV connector
writes them to disk when the request ends. What this module reads, as
confirmed in vLLM's source and docs (2026-12):

- the engine is built with ``speculative_config={"method": "extract_hidden_states",
  "num_speculative_tokens": 1, "draft_model_config": {"hf_config":
  {"eagle_aux_hidden_state_layer_ids": [...]}}}`` and ``kv_transfer_config=
  {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
  "kv_connector_extra_config": {"shared_storage_path": DIR}}``, with chunked
  prefill off (vLLM's docs page "Hidden State Extraction" and
  ``examples/offline_inference/extract_hidden_states.py``);
- the connector (``vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``)
  writes one safetensors file per request, ``DIR/<request id>.safetensors``, holding
  ``hidden_states`` of shape ``[prompt tokens, layers, hidden]`` (layers in the order of
  ``eagle_aux_hidden_state_layer_ids``) and ``token_ids`` (the prompt's token ids); the request's
  output carries the path in ``kv_transfer_params["hidden_states_path"]``. The writer holds an
  exclusive ``flock`` on ``<path>.lock`` until the file is whole; a reader takes a shared one;
- layer id ``i`` is the residual stream entering decoder layer ``i`` (the models'
  ``aux_hidden_state_layers`` collect ``hidden_states + residual`` before layer ``i``), which is
  transformers' ``output_hidden_states[i]``; id ``num_hidden_layers`` is the last layer's output
  *before* the final norm (the docs page says so), while transformers' last entry is after it.

So a head trained on layer ``i < num_hidden_layers`` reads vLLM's row as is, and a head on the
last layer (``-1``, candor's default) reads it through the model's own final norm
(:class:`FinalNorm`, the RMSNorm of Llama-family models, read from the model folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from candor.backends.base import absolute_layer
from candor.util.errors import CandorError

CONNECTOR = "ExampleHiddenStatesConnector"
METHOD = "extract_hidden_states"
PATH_KEY = "hidden_states_path"  # in a request output's kv_transfer_params
STATES_TENSOR = "hidden_states"
TOKENS_TENSOR = "token_ids"
LOCK_SUFFIX = ".lock"
FILE_SUFFIX = ".safetensors"
WRITE_WAIT = 60.0  # seconds a finished request's file may take to be written

# Families whose final norm is ``weight * x / sqrt(mean(x^2) + eps)`` at ``model.norm.weight``.
RMS_NORM_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
NORM_WEIGHT = "model.norm.weight"


def model_config(folder: str | Path) -> dict[str, Any]:
    """A model folder's ``config.json`` (empty when absent)."""
    path = Path(folder) / "config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def engine_args(layers: Sequence[int], num_hidden_layers: int, directory: str | Path) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments that make it write the prompt's states of ``layers`` (absolute) to ``directory``."""
    ids = sorted({absolute_layer(layer, num_hidden_layers) for layer in layers})
    return {
        "speculative_config": {
            "method": METHOD,
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}},
        },
        "kv_transfer_config": {
            "kv_connector": CONNECTOR,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(directory)},
        },
        "enable_chunked_prefill": False,  # the file then holds every prompt position
    }


@dataclass(frozen=True)
class Extraction:
    """What an engine that writes prompt states needs: the reader, the folder it writes to, its arguments."""

    reader: ExtractedStates
    files: StatesFolder
    engine_args: dict[str, Any]


def for_model(folder: str | Path, layers: Sequence[int], directory: str | Path | None = None) -> Extraction:
    """The reader of an engine's hidden-states files for the model in ``folder``, a fresh folder for them (in
    ``directory`` when given, else the system's temporary folder) and the engine arguments that make it write
    ``layers`` there (any numbering :func:`absolute_layer` takes; ``-1`` the last).

    A last-layer head needs the model's final norm (:class:`FinalNorm`), loaded here from the folder.
    """
    layer_count = model_config(folder).get("num_hidden_layers")
    if not isinstance(layer_count, int):
        raise CandorError(f"{folder}: no num_hidden_layers in config.json; cannot place prompt_state_layers")
    ids = sorted({absolute_layer(layer, layer_count) for layer in layers})
    norm = FinalNorm.from_folder(folder) if layer_count in ids else None
    reader = ExtractedStates(ids, layer_count, norm)
    files = StatesFolder(directory)
    return Extraction(reader=reader, files=files, engine_args=engine_args(reader.layer_ids, layer_count, files.path))


class FinalNorm:
    """A Llama-family model's final RMSNorm, read from its folder (applied in float32, as transformers does)."""

    def __init__(self, weight: np.ndarray, eps: float) -> None:
        self.weight = np.asarray(weight, dtype=np.float32)
        self.eps = float(eps)

    @classmethod
    def from_folder(cls, folder: str | Path) -> FinalNorm:
        from safetensors import safe_open

        config = model_config(folder)
        kind = config.get("model_type")
        if kind not in RMS_NORM_MODELS or "rms_norm_eps" not in config:
            raise CandorError(
                f"{folder}: the last layer's state from vLLM is before the final norm, which candor applies for "
                f"{', '.join(sorted(RMS_NORM_MODELS))} models only (this one is {kind!r}); train the head on an "
                "earlier layer to read it from vLLM's pass"
            )
        index = Path(folder) / "model.safetensors.index.json"
        shard = json.loads(index.read_text())["weight_map"].get(NORM_WEIGHT) if index.exists() else "model.safetensors"
        path = Path(folder) / str(shard)
        if not shard or not path.exists():
            raise CandorError(f"{folder}: no {NORM_WEIGHT} in its safetensors weights")
        with safe_open(str(path), "pt") as f:
            if NORM_WEIGHT not in list(f.keys()):
                raise CandorError(f"{path}: no {NORM_WEIGHT}")
            weight = f.get_tensor(NORM_WEIGHT).float().numpy()
        return cls(weight, float(config["rms_norm_eps"]))

    def __call__(self, state: np.ndarray) -> np.ndarray:
        import torch

        x = torch.from_numpy(np.asarray(state, dtype=np.float32))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (torch.from_numpy(self.weight) * x).numpy()


class ExtractedStates:
    """Reads the files of an engine built with :func:`engine_args` (see the module docstring).

    ``layers`` are the head layers asked for (any numbering :func:`absolute_layer` takes);
    ``final_norm`` is needed when one of them is the last layer.
    """

    def __init__(self, layers: Sequence[int], num_hidden_layers: int, final_norm: FinalNorm | None = None) -> None:
        self.num_hidden_layers = num_hidden_layers
        self.layer_ids = sorted({absolute_layer(layer, num_hidden_layers) for layer in layers})
        if num_hidden_layers in self.layer_ids and final_norm is None:
            raise CandorError("reading the last layer from vLLM's pass needs the model's final norm")
        self.final_norm = final_norm

    def read(self, path: str | Path, prompt_ids: Sequence[int] | None = None) -> dict[int, np.ndarray]:
        """The last prompt token's state per layer (transformers' numbering), from one request's file.

        ``prompt_ids``: the token ids the request was sent with; a file of another prompt is refused.
        """
        tensors = load_locked(path)
        if STATES_TENSOR not in tensors:
            raise CandorError(f"{path}: no {STATES_TENSOR!r} tensor (tensors: {', '.join(sorted(tensors))})")
        states = tensors[STATES_TENSOR]
        if states.ndim != 3 or states.shape[1] != len(self.layer_ids) or states.shape[0] == 0:
            raise CandorError(
                f"{path}: {STATES_TENSOR} has shape {tuple(states.shape)}; expected [prompt tokens, "
                f"{len(self.layer_ids)} layers, hidden] for layers {self.layer_ids}"
            )
        if prompt_ids is not None and TOKENS_TENSOR in tensors:
            written = [int(t) for t in tensors[TOKENS_TENSOR].reshape(-1).tolist()]
            if written != [int(t) for t in prompt_ids]:
                raise CandorError(f"{path}: its token_ids are not the prompt's ({len(written)} vs {len(prompt_ids)})")
        if prompt_ids is not None and states.shape[0] != len(prompt_ids):
            raise CandorError(
                f"{path}: {states.shape[0]} positions for a prompt of {len(prompt_ids)} tokens (chunked prefill on?)"
            )
        last = states[-1].float().numpy()
        out = {}
        for row, layer in enumerate(self.layer_ids):
            vector = np.ascontiguousarray(last[row], dtype=np.float32)
            out[layer] = self.final_norm(vector) if layer == self.num_hidden_layers else vector  # type: ignore[misc]
        return out


class StatesFolder:
    """The folder an engine writes its per-request states files to, owned by one backend and removed with it.

    The connector names each file after the engine's internal request id, ``<request id>-<8 random
    characters>`` (``<index>_<request id>-…`` for each of ``n`` samples), and holds an exclusive ``flock``
    on ``<file>.lock`` from the request's first step until the file is whole. A request's output names its
    file in ``kv_transfer_params``, except one that ended on a stop string: vLLM's front end ends it
    (with ``kv_transfer_params=None``) and the engine then aborts it, and still writes its file. So
    :meth:`file_of` falls back on the request id, and :meth:`clear` removes every file of a call once
    written: on success, on error, and on cancel (an interrupted call's late files go when the next call or
    the backend ends).
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix="candor-vllm-states-", dir=directory))
        self._remove = weakref.finalize(self, shutil.rmtree, str(self.path), ignore_errors=True)

    def file_of(self, output: Any) -> Path:
        """The states file of one finished request output (its ``kv_transfer_params``, else its request id)."""
        named = (getattr(output, "kv_transfer_params", None) or {}).get(PATH_KEY)
        if named:
            return Path(named)
        request = str(output.request_id)
        found = [
            self.path / name[: -len(LOCK_SUFFIX)]
            for name in os.listdir(self.path)
            if name.endswith(FILE_SUFFIX + LOCK_SUFFIX)
            and (name[: -len(FILE_SUFFIX + LOCK_SUFFIX)] == request or name.startswith(request + "-"))
        ]
        if len(found) != 1:
            raise CandorError(
                f"vLLM wrote {len(found)} hidden-states files for request {request} in {self.path} (expected 1): "
                "is its hidden-states KV connector on?"
            )
        return found[0]

    def clear(self, wait: float = WRITE_WAIT) -> None:
        """Remove every file in the folder, waiting up to ``wait`` seconds in all for those being written
        (``0``: leave those for a later call)."""
        deadline = time.monotonic() + wait
        for name in sorted(os.listdir(self.path)):
            if not name.endswith(FILE_SUFFIX + LOCK_SUFFIX):
                continue
            with contextlib.suppress(FileNotFoundError), open(self.path / name) as handle:
                if _shared_lock(handle, max(0.0, deadline - time.monotonic())):
                    discard(self.path / name[: -len(LOCK_SUFFIX)])
        for name in os.listdir(self.path):  # files without a lock (a connector that takes none)
            if name.endswith(FILE_SUFFIX) and not os.path.exists(self.path / (name + LOCK_SUFFIX)):
                discard(self.path / name)

    def close(self) -> None:
        """Remove the folder and all it holds."""
        self._remove()


def _shared_lock(handle: Any, wait: float) -> bool:
    """Take a shared ``flock`` on ``handle`` (the writer holds an exclusive one until its file is whole)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def load_locked(path: str | Path) -> dict[str, Any]:
    """A connector's file as torch tensors, once its writer released ``<path>.lock`` (when there is one)."""
    from safetensors.torch import load_file

    lock = str(path) + LOCK_SUFFIX
    if not os.path.exists(lock):
        return dict(load_file(str(path), device="cpu"))
    with open(lock) as handle:
        if not _shared_lock(handle, WRITE_WAIT):  # the writer's exclusive lock is released when the file is whole
            raise CandorError(f"{path}: vLLM did not finish writing it in {WRITE_WAIT:.0f} s")
        return dict(load_file(str(path), device="cpu"))


def discard(path: str | Path) -> None:
    """Remove a read file and its lock (the connector leaves both behind)."""
    for name in (str(path) + LOCK_SUFFIX, str(path)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)
