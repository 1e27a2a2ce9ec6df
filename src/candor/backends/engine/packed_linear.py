"""A model's linear layers through oneDNN with prepacked weights, for inference on CPU.

``nn.Linear`` on CPU calls MKL's GEMM, which reads the weight in its plain
row-major layout at every call. oneDNN can reorder a weight once into the
blocked layout its kernels stream from, which is faster, most of all for the
LM head's wide product and for the few rows of a batch's tail
(``benchmarks/annotate_profile.py`` measures both kernels' rates, and
``benchmarks/annotate_throughput.py`` the decode loop with each). The
arithmetic is the same (float32 or bfloat16 in, float32 accumulation): the
outputs differ from ``nn.Linear``'s by rounding only, as the outputs of two
batch shapes already do.

:class:`PackedLinears` is a re-entrant scope over one model. Inside it, each
plain ``nn.Linear`` (exactly that type: LoRA wrappers, quantized layers and
others keep their own forward, and a LoRA's base layer is packed) runs on its
packed weight when gradients are off, the input is on the CPU and of the
weight's dtype; anything else, and everything outside a scope, runs the
layer's own forward untouched, so training never sees a packed weight.

The copies take as much memory as the weights they copy (0.5 GB for the
embedded 135M model in float32), so a model whose copies would not fit in
half the free memory is not packed.

Every product of a layer in a scope runs on the thread's full OpenMP count,
also inside a decode step whose small ops run on one thread
(:mod:`candor.backends.engine.op_threads`); a scope that does not pack leaves
threads alone, since ``nn.Linear``'s own kernels are not widened.

:class:`PackedStack` packs sibling layers that read the same input (q, k
and v; gate and up) as one weight, for the lean decode step of
:mod:`candor.backends.engine.llama_step`: one product where there were several.

A packed weight is a copy, so it is keyed by what determines it: the
parameter object, its storage, its version counter, and a content
fingerprint taken when the outermost scope opens (an in-place change through
``.data``, as PEFT's merge does, bumps no version counter but moves the
fingerprint). A stale copy is repacked, never used.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch

from candor.backends.engine.op_threads import all_threads, small_ops_on_one_thread

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# The dtypes oneDNN's packed kernels take, each where this CPU runs it (packing_available), and how
# close a probe's product must come to F.linear's.
PACKABLE_DTYPES = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
FINGERPRINT_SAMPLES = 4096  # elements read per weight for its fingerprint; a merge moves (nearly) all of them


@functools.cache
def packing_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build and CPU run oneDNN's packed linear kernels in ``dtype``, with ``F.linear``'s numbers.

    The two ops are the ones torch's own compiler uses for CPU linear layers;
    they are tried once per dtype on a small product, so a torch whose ops
    changed, or a CPU that lacks a dtype's path, falls back to ``nn.Linear``
    instead of failing mid-run. oneDNN's bfloat16 reorder needs AVX512
    (BW, VL, DQ) or AVX-NE-CONVERT; an AVX2-only CPU refuses it.
    """
    mkldnn = getattr(torch.ops, "mkldnn", None)
    if dtype not in PACKABLE_DTYPES:
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")):
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        weight, x = torch.randn(8, 16, generator=generator), torch.randn(3, 16, generator=generator)
        weight, x = weight.to(dtype), x.to(dtype)
        with torch.inference_mode():
            got = mkldnn._linear_pointwise(x, mkldnn._reorder_linear_weight(weight, None), None, "none", [], "")
            want = torch.nn.functional.linear(x, weight)
        tolerance = PACKABLE_DTYPES[dtype]
        return bool(torch.allclose(got.float(), want.float(), rtol=tolerance, atol=tolerance))
    except (RuntimeError, TypeError, AttributeError) as exc:
        logger.info("oneDNN packed linear kernels unusable here in %s (%s): using nn.Linear", dtype, exc)
        return False


def linear_weight_bytes(model: Any) -> int:
    """Bytes of the CPU weights of ``model``'s plain linear layers (what packing copies)."""
    return sum(
        m.weight.numel() * m.weight.element_size()
        for m in model.modules()
        if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"
    )


def available_memory_bytes() -> int | None:
    """Physical memory free now (Linux and most Unixes), or None where the OS does not say."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def copies_fit(model: Any, free: int | None = None) -> bool:
    """Whether packed copies of the weights (one more copy of every linear layer) fit in half the free memory.

    ``free``: bytes of free memory (default: what the OS says now).
    """
    return bytes_fit(linear_weight_bytes(model), free)


def bytes_fit(needed: int, free: int | None = None) -> bool:
    """Whether ``needed`` bytes of copies fit in half the free memory (``free``: default, what the OS says)."""
    free = available_memory_bytes() if free is None else free
    return needed > 0 and (free is None or needed <= free // 2)


def weight_fingerprint(weight: torch.Tensor) -> float:
    """A cheap content summary of ``weight``: the sum of an evenly strided sample of its elements."""
    flat = weight.detach().reshape(-1)
    stride = max(1, flat.numel() // FINGERPRINT_SAMPLES)
    return float(flat[::stride].double().sum())


@dataclass(frozen=True)
class WeightKey:
    """Everything a packed copy depends on: which parameter, its storage, its version, its content."""

    param_id: int
    data_ptr: int
    version: int
    dtype: torch.dtype
    fingerprint: float

    @classmethod
    def of(cls, weight: torch.Tensor, fingerprint: float) -> WeightKey:
        # A weight made under inference_mode has no version counter: its storage and fingerprint key it.
        version = -1 if weight.is_inference() else weight._version
        return cls(
            param_id=id(weight),
            data_ptr=weight.data_ptr(),
            version=version,
            dtype=weight.dtype,
            fingerprint=fingerprint,
        )


class PackedLayer:
    """One ``nn.Linear``'s packed weight and the forward that uses it inside a scope."""

    def __init__(self, layer: torch.nn.Linear, scope: PackedLinears) -> None:
        self.layer = layer
        self.scope = scope
        self.packed: torch.Tensor | None = None
        self.key: WeightKey | None = None
        self.fingerprint = 0.0

    def refresh_fingerprint(self) -> None:
        self.fingerprint = weight_fingerprint(self.layer.weight)

    def current_key(self) -> WeightKey:
        return WeightKey.of(self.layer.weight, self.fingerprint)

    def usable(self, x: torch.Tensor) -> bool:
        weight = self.layer.weight
        return (
            self.scope.active
            and not torch.is_grad_enabled()
            and x.device.type == "cpu"
            and weight.device.type == "cpu"
            and x.dtype == weight.dtype
            and packing_available(weight.dtype)
        )

    def packed_weight(self) -> torch.Tensor:
        key = self.current_key()
        packed = self.packed
        if packed is None or key != self.key:
            packed = torch.ops.mkldnn._reorder_linear_weight(self.layer.weight.detach(), None)
            self.packed, self.key = packed, key
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with all_threads():  # also inside a decode step whose small ops run on one thread
            if not self.usable(x):
                return torch.nn.Linear.forward(self.layer, x)
            bias = self.layer.bias
            return torch.ops.mkldnn._linear_pointwise(
                x, self.packed_weight(), None if bias is None else bias.detach(), "none", [], ""
            )


class PackedStack:
    """Sibling linear layers that read the same input (q, k, v; gate, up) as one packed product.

    Their weights are concatenated along the outputs and packed once: one
    product instead of one per layer, so one wake of the OpenMP team instead
    of several (on the 2-core machine here a wake costs about 80 µs, as much
    as a small product). Each output column is the same dot product as in its
    own layer's product, so float32 outputs are those of the separate
    products bit for bit. The copy is keyed by its layers' keys
    (:class:`WeightKey`) and repacked when any of them moves.
    """

    def __init__(self, layers: tuple[torch.nn.Linear, ...], scope: PackedLinears) -> None:
        self.members = layers
        self.scope = scope
        self.packed: torch.Tensor | None = None
        self.keys: tuple[WeightKey, ...] = ()

    def nbytes(self) -> int:
        return sum(m.weight.numel() * m.weight.element_size() for m in self.members)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The members' outputs side by side along the last dimension, in their order."""
        layers = [self.scope.layers.get(id(m)) for m in self.members]
        if any(layer is None or layer.layer is not m for layer, m in zip(layers, self.members, strict=True)):
            return torch.cat([m(x) for m in self.members], dim=-1)  # the scope is not packing these layers
        first = cast(PackedLayer, layers[0])
        if not first.usable(x):
            return torch.cat([m(x) for m in self.members], dim=-1)
        keys = tuple(cast(PackedLayer, layer).current_key() for layer in layers)
        if self.packed is None or keys != self.keys:
            weight = torch.cat([m.weight.detach() for m in self.members])
            self.packed, self.keys = torch.ops.mkldnn._reorder_linear_weight(weight, None), keys
        with all_threads():
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self._bias(), "none", [], "")

    def _bias(self) -> torch.Tensor | None:
        """The members' biases side by side, read now (as each layer's own product reads its bias)."""
        if all(m.bias is None for m in self.members):
            return None
        parts = [m.weight.new_zeros(m.out_features) if m.bias is None else m.bias.detach() for m in self.members]
        return torch.cat(parts)  # a layer without a bias adds zeros, as its own product does


class PackedLinears:
    """A re-entrant scope in which ``model``'s plain linear layers run on prepacked oneDNN weights.

    The outermost ``with packed:`` gives each plain ``nn.Linear`` a packing
    forward (seen by every thread using the model) and the last one to close
    gives the layers their own forward back, so outside a scope the model is
    untouched (it copies, pickles and trains as before). Packed copies are
    kept between scopes and repacked when their key moves. The scope does
    nothing without oneDNN, for a model with no linear weights on the CPU, or
    when the copies (as large as those weights) would not fit in half the free memory.
    """

    def __init__(self, model: Any, *, enabled: bool = True) -> None:
        self.model_ref = weakref.ref(model)  # weak: the registry below must not keep a model alive
        self.depth = 0
        self.lock = threading.RLock()
        self.layers: dict[int, PackedLayer] = {}
        self.enabled = enabled and packing_available() and copies_fit(model)
        if enabled and not self.enabled:
            logger.info(
                "linear layers keep nn.Linear's kernels: no oneDNN packing in this torch build, "
                "or the packed copies would not fit in free memory"
            )

    @property
    def active(self) -> bool:
        return self.depth > 0

    def small_ops_on_one_thread(self, elements: int) -> contextlib.AbstractContextManager[None]:
        """:func:`candor.backends.engine.op_threads.small_ops_on_one_thread`, when this scope packs.

        Only then: the linear layers take their threads back through the
        packing forward, and ``nn.Linear``'s own would run on one thread.
        """
        return small_ops_on_one_thread(elements) if self.enabled else contextlib.nullcontext()

    def stack(self, layers: tuple[torch.nn.Linear, ...]) -> PackedStack | None:
        """One packed product for sibling ``layers`` (same input), or None when this scope does not pack them.

        The stack's copy comes on top of the layers' own: callers check that
        their stacks fit (:meth:`PackedStack.nbytes`, :func:`bytes_fit`).
        """
        if not self.enabled or any(type(m) is not torch.nn.Linear for m in layers):
            return None
        if not all(packing_available(m.weight.dtype) for m in layers):  # their products would not be packed
            return None
        return PackedStack(layers, self)

    def install(self) -> None:
        model = self.model_ref()
        if model is None:
            return
        for module in model.modules():
            if type(module) is not torch.nn.Linear:
                continue
            packed = self.layers.get(id(module))
            if packed is None or packed.layer is not module:
                packed = self.layers[id(module)] = PackedLayer(module, self)
            packed.refresh_fingerprint()
            module.forward = packed.forward  # type: ignore[method-assign]

    def uninstall(self) -> None:
        for packed in self.layers.values():
            if "forward" in vars(packed.layer):
                del packed.layer.forward  # back to the class's forward

    def release(self) -> None:
        """Drop every packed copy (they are rebuilt at the next scope)."""
        with self.lock:
            self.layers = {}

    def __enter__(self) -> PackedLinears:
        with self.lock:
            if self.depth == 0 and self.enabled:
                self.install()
            self.depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                self.uninstall()


_SCOPES: weakref.WeakKeyDictionary[Any, PackedLinears] = weakref.WeakKeyDictionary()
_SCOPES_LOCK = threading.Lock()


def packed_linears_of(model: Any) -> PackedLinears:
    """The one :class:`PackedLinears` of ``model``, shared by every backend around it.

    One per model, so that two backends on one model (tests share one) never
    install over each other's scope.
    """
    with _SCOPES_LOCK:
        scope = _SCOPES.get(model)
        if scope is None:
            scope = _SCOPES[model] = PackedLinears(model)
        return scope


def with_packed_linears(method: F) -> F:
    """Run a method of an object with a ``packed_linears`` scope (an ``HFBackend``) inside that scope."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self.packed_linears:
            return method(self, *args, **kwargs)

    return cast(F, wrapper)
