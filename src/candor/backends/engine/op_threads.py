"""A decode step's threads on CPU: its small ops on one thread, its products and attention on all.

A decode step of a small model runs hundreds of elementwise ops (norms,
rotary embeddings, activations, residual adds) on tensors of rows × hidden
elements: tens of thousands for the embedded model. ATen splits every op of
more than 32k elements across its OpenMP threads, and waking a sleeping
OpenMP thread (``OMP_WAIT_POLICY=PASSIVE``, which candor's CLI sets so that
idle threads do not spin on a shared machine) costs more than such an op: on
the 2-core machine here, a multiply of ``[80, 576]`` took about 90 µs on two
threads and 5 µs on one.

:func:`small_ops_on_one_thread` runs a block with the calling thread's OpenMP
team cut to one thread; inside it, :func:`all_threads` (the packed linear
layers, :mod:`candor.backends.engine.packed_linear`) and :func:`widen` (the slot
cache, for the attention that reads it) give the large ops their threads
back. Elementwise ops compute each element the same way whatever the thread
count, and a row's reduction runs on one thread either way, so the numbers
do not change (``tests/test_op_threads.py`` checks generations bit for bit).

MKL keeps a thread count of its own: with OpenMP's count alone set to one,
every MKL call in the block (SDPA's CPU kernel runs its small products
through it; vector functions such as ``exp`` too) still started a team of
two, so an attention took 75 ms where it takes 2 ms on torch's threads, and
an ``exp`` of 855 values 75 µs instead of 4. The block therefore sets MKL's
count for the calling thread as well (``MKL_Set_Num_Threads_Local``, which
torch's MKL exports). Attention over more than
:data:`ONE_THREAD_ATTENTION_ROWS` rows gets all threads back
(:func:`widen_for_attention`); over fewer, one thread runs it sooner than two
after a wake. Only caches whose layers widen for attention
(:class:`candor.backends.engine.kv_slots.SlotKV`) get the split. Attention on one
thread keeps the tokens but not always the last bits: MKL picks its products'
kernels by thread count on some CPUs (bit-equal on the AVX512/AMX machine the
threshold was measured on; log-probs up to 1e-6 apart on an AVX2-only AMD
EPYC, ``tests/test_op_threads.py``).

The count is set through the OpenMP runtime's own ``omp_set_num_threads``,
which changes the calling thread's setting only (``torch.set_num_threads``
would also change the count every thread started later begins with: a
server's worker threads). Where no OpenMP runtime is loaded (not Linux, or a
torch built without OpenMP), nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

logger = logging.getLogger(__name__)

# Blocks whose activations are larger run as before: on one thread, an op of
# 400k elements took as long as on two waking ones (benchmarks/annotate_throughput.py's machine).
SMALL_OP_ELEMENTS = 1 << 18
OPENMP_LIBRARIES = ("libgomp", "libiomp", "libomp")
MKL_LIBRARIES = ("libtorch_cpu", "libmkl")  # torch links MKL into libtorch_cpu
# A decode step's attention over at most this many rows runs on one thread: there the wake costs more
# than the second thread saves (the embedded model's fp32 split attention over 8 rows: 118 µs on one
# thread, 267 on two; over 96 rows: 1019 against 776).
ONE_THREAD_ATTENTION_ROWS = 48

_state = threading.local()  # .full: the thread's own count while its small ops run on one thread


@functools.cache
def openmp_runtime() -> Any | None:
    """The OpenMP runtime torch runs on (a ``ctypes`` library), found among the loaded ones; None if none.

    Other libraries bring their own OpenMP runtimes (scikit-learn does), and
    setting theirs would do nothing to torch, so each candidate is tried: it
    is torch's when the count it sets is the one torch reads.
    """
    for library in _loaded(OPENMP_LIBRARIES):
        if (
            hasattr(library, "omp_set_num_threads")
            and hasattr(library, "omp_get_max_threads")
            and (_sets_torchs_count(library))
        ):
            return library
    logger.info("torch's OpenMP runtime not found: decode steps keep every op on torch's threads")
    return None


@functools.cache
def mkl_runtime() -> Any | None:
    """The loaded library exporting MKL's ``MKL_Set_Num_Threads_Local`` (torch's own MKL); None if none.

    MKL keeps its own thread count: without it set too, an MKL product called
    from a one-thread block (inside SDPA's kernel, or a vector ``exp``) still
    wakes a team of its own for every call.
    """
    for library in _loaded(MKL_LIBRARIES):
        if hasattr(library, "MKL_Set_Num_Threads_Local"):
            return library
    return None


def _loaded(names: tuple[str, ...]) -> Iterator[Any]:
    """The loaded libraries whose file names start with one of ``names``, as ``ctypes`` handles."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "/" in line})
    except OSError:
        return
    for path in paths:
        if os.path.basename(path).startswith(names):
            try:
                yield ctypes.CDLL(path)  # already loaded: this only finds it
            except OSError:
                continue


def _sets_torchs_count(library: Any) -> bool:
    """Whether ``library``'s ``omp_set_num_threads`` sets the count torch reads (its own count restored)."""
    count = torch.get_num_threads()  # also runs torch's per-thread initialization first
    own = library.omp_get_max_threads()
    library.omp_set_num_threads(count + 1)
    moved = torch.get_num_threads() == count + 1
    library.omp_set_num_threads(own)
    return moved


def _set_threads(count: int) -> None:
    runtime = openmp_runtime()
    if runtime is not None:
        runtime.omp_set_num_threads(count)
    mkl = mkl_runtime()
    if mkl is not None:
        mkl.MKL_Set_Num_Threads_Local(1 if count == 1 else 0)  # 0: back to MKL's global count


@contextlib.contextmanager
def small_ops_on_one_thread(elements: int) -> Iterator[None]:
    """Run the block's ops on one thread in this thread, when its activations have at most ``elements``.

    ``elements``: the size of the block's activations (rows × hidden size).
    A no-op when they are larger than :data:`SMALL_OP_ELEMENTS`, when torch
    runs on one thread anyway, without an OpenMP runtime, or inside another
    such block of this thread.
    """
    full = torch.get_num_threads()
    if elements > SMALL_OP_ELEMENTS or full <= 1 or getattr(_state, "full", None) or openmp_runtime() is None:
        yield
        return
    _state.full = full
    _set_threads(1)
    try:
        yield
    finally:
        _state.full = None
        _set_threads(full)


def widen_for_attention(rows: int) -> None:
    """:func:`widen` for an attention over ``rows`` rows, unless so few that one thread runs it sooner."""
    if rows > ONE_THREAD_ATTENTION_ROWS:
        widen()


def widen() -> None:
    """Give this thread its full count back for the ops that follow, until :func:`narrow`."""
    full = getattr(_state, "full", None)
    if full:
        _set_threads(full)


def narrow() -> None:
    """Back to one thread, inside a :func:`small_ops_on_one_thread` block (a no-op outside one)."""
    if getattr(_state, "full", None):
        _set_threads(1)


class _AllThreads:
    """The context :func:`all_threads` returns: a plain class, as it wraps every product of a step."""

    def __enter__(self) -> None:
        widen()

    def __exit__(self, *exc: object) -> None:
        narrow()


_ALL_THREADS = _AllThreads()


def all_threads() -> contextlib.AbstractContextManager[None]:
    """Run one large op (a matrix product) on this thread's full count, then back to one thread."""
    return _ALL_THREADS
