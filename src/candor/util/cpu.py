"""What this machine's CPU can do, as torch sees it: its name, its cores, and the instructions behind a dtype's speed.

A 16-bit dtype is fast on a CPU only where the CPU multiplies in it (AMX or
AVX512 tiles and dot products); elsewhere oneDNN and MKL widen every 16-bit
operand to float32 first, so the products cost float32's arithmetic plus the
conversions and only the memory traffic halves. Benchmarks record
:func:`describe` beside their timings, since the same job runs at very
different rates on different CPUs, and loading a model in a 16-bit dtype on
a CPU without those instructions logs a warning (:func:`native_16bit`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

# The CPU instructions that multiply each 16-bit dtype natively (any one suffices).
NATIVE_16BIT: dict[torch.dtype, tuple[str, ...]] = {
    torch.bfloat16: ("amx_bf16", "avx512_bf16"),
    torch.float16: ("amx_fp16", "avx512_fp16"),
}


@functools.cache
def capabilities() -> dict[str, Any]:
    """torch's report of the CPU (name, cores, cache sizes, instruction sets); empty if this torch has none."""
    report = getattr(torch.cpu, "get_capabilities", None)
    if report is None:
        return {}
    try:
        return dict(report())
    except RuntimeError:  # a torch built without cpuinfo
        return {}


def native_16bit(dtype: torch.dtype) -> bool | None:
    """Whether the CPU multiplies in ``dtype`` natively; None when unknown (torch cannot tell, or not 16-bit)."""
    features = NATIVE_16BIT.get(dtype)
    caps = capabilities()
    if features is None or not caps:
        return None
    return any(bool(caps.get(feature)) for feature in features)


def describe() -> dict[str, Any]:
    """The CPU facts a timing depends on: name, cores, torch's vector level, and the 16-bit instructions present."""
    caps = capabilities()
    present = [feature for features in NATIVE_16BIT.values() for feature in features if caps.get(feature)]
    return {
        "name": caps.get("cpu_name", "unknown"),
        "architecture": caps.get("architecture", "unknown"),
        "physical_cores": caps.get("num_physical_cores"),
        "logical_cores": caps.get("num_logical_cores"),
        "vector_level": torch.backends.cpu.get_cpu_capability(),
        "avx512": bool(caps.get("avx512_f")),
        "native_16bit": present,
    }
