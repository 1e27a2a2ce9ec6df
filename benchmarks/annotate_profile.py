"""Where the decode loop's time goes, and what fraction of the CPU's compute roofline it reaches.

Runs ``HFBackend.generate`` (embedded default, ``fewshot`` template, greedy +
k samples, the settings of ``annotate_throughput.py``) on NQ test questions
under ``torch.profiler``, and in the same process times a GEMM of the model's
shape (the roofline's compute rate, measured, not quoted). It merges a
``profile`` section into ``benchmarks/results/annotate_throughput.json``:
generated tokens/s, FLOPs per generated token, the roofline fraction
(achieved FLOP rate over the GEMM rate, per wall second and per CPU
second), and the share of CPU time per
operator group (linear layers, attention, cache copies, sampling, other).

FLOPs count only the generated tokens' decoder and LM-head matmuls
(2 x parameters per token), so prompt prefill is work the fraction does not
credit: the fraction is that of useful generation work.

    python -m benchmarks.annotate_profile [--questions 32] [--k 5] [--threads 2]
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from typing import Any

from benchmarks.annotation_job import MODEL, generated_tokens, job_parser, load_items, prompts_for, sampling_params

# Operator name fragments → group, first match wins.
GROUPS = (
    ("linear (matmul)", ("aten::addmm", "aten::mm", "aten::linear", "aten::matmul", "aten::bmm", "mkldnn::_linear")),
    ("attention", ("scaled_dot_product", "aten::_softmax", "flash_attention")),
    ("cache copies (cat, index, pad)", ("aten::cat", "aten::index", "aten::copy_", "aten::repeat_interleave")),
    ("sampling (topk, softmax, searchsorted)", ("aten::topk", "aten::searchsorted", "aten::cumsum", "aten::sort")),
    (
        "elementwise (norm, rotary, activation)",
        (
            "aten::mul",
            "aten::add",
            "aten::silu",
            "aten::rsqrt",
            "aten::pow",
            "aten::mean",
            "aten::neg",
            "aten::sub",
            "aten::div",
        ),
    ),
)


def gemm_rate(hidden: int, inner: int, rows: int, seconds: float = 3.0, packed: bool = False) -> float:
    """FLOP/s of ``[rows, hidden] @ [hidden, inner]`` fp32, the model's MLP shape, best of repeated runs.

    ``packed``: through oneDNN with the weight prepacked, the kernel candor's
    linear layers use (:mod:`candor.backends.engine.packed_linear`); else ``torch.mm`` (MKL).
    """
    import torch

    a, b = torch.randn(rows, hidden), torch.randn(hidden, inner)
    if packed:
        weight = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), None)

        def product() -> Any:
            return torch.ops.mkldnn._linear_pointwise(a, weight, None, "none", [], "")
    else:

        def product() -> Any:
            return a @ b

    best, end = 0.0, time.perf_counter() + seconds
    with torch.inference_mode():
        while time.perf_counter() < end:
            start = time.perf_counter()
            for _ in range(10):
                product()
            best = max(best, 10 * 2 * rows * hidden * inner / (time.perf_counter() - start))
    return best


def group_of(name: str) -> str:
    for group, fragments in GROUPS:
        if any(f in name for f in fragments):
            return group
    return "other ops"


def main() -> None:
    args = job_parser(__doc__.split("\n")[0], questions=32).parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from candor.backends.hf import HFBackend

    torch.set_num_threads(args.threads)
    backend = HFBackend.from_pretrained(MODEL, batch_size=args.batch_size)
    prompts = prompts_for(load_items(args.questions), backend)
    params = sampling_params()
    backend.generate(prompts[:1], 1, params)  # warm-up
    load_before = os.getloadavg()[0]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start, cpu = time.perf_counter(), time.process_time()
        gens = backend.generate(prompts, args.k, params, seeds=list(range(len(prompts))))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = generated_tokens(gens, params.max_new_tokens)

    config = backend.model.config
    params_total = sum(p.numel() for p in backend.model.parameters())
    embed = config.vocab_size * config.hidden_size
    tied = bool(getattr(config, "tie_word_embeddings", False))
    # Per generated token: decoder matmuls (all weights but the embedding table) + LM head.
    flops_per_token = 2 * (params_total - embed) + (2 * embed if tied else 0)
    stock_rate = gemm_rate(config.hidden_size, config.intermediate_size, 96)
    packed_rate = gemm_rate(config.hidden_size, config.intermediate_size, 96, packed=True)
    rate = max(stock_rate, packed_rate)  # the roofline: the fastest float32 GEMM this machine gave
    head_rates = {
        kernel: gemm_rate(config.hidden_size, config.vocab_size, 96, packed=kernel != "mkl") / 1e9
        for kernel in ("mkl", "onednn_packed")
    }

    groups: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        groups[group_of(event.key)] += event.self_cpu_time_total / 1e6
    op_total = sum(groups.values())
    shares = {g: round(t / op_total, 3) for g, t in sorted(groups.items(), key=lambda kv: -kv[1])}
    achieved = tokens * flops_per_token / wall
    section: dict[str, Any] = {
        "command": "python -m benchmarks.annotate_profile "
        f"--questions {args.questions} --k {args.k} --threads {args.threads}",
        "questions": args.questions,
        "k": args.k,
        "generated_tokens": tokens,
        "seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 2),
        "tokens_per_second": round(tokens / wall, 1),
        "gflop_per_generated_token": round(flops_per_token / 1e9, 3),
        "gemm_gflops_measured": round(rate / 1e9, 1),
        # 96 rows: the MLP's [hidden -> intermediate] product and the LM head's [hidden -> vocabulary].
        "gemm_gflops_by_kernel": {
            "mlp": {"mkl": round(stock_rate / 1e9, 1), "onednn_packed": round(packed_rate / 1e9, 1)},
            "lm_head": {kernel: round(value, 1) for kernel, value in head_rates.items()},
        },
        "roofline_tokens_per_second": round(rate / flops_per_token, 1),
        "roofline_fraction": round(achieved / rate, 3),
        # Under load the process gets a fraction of the cores: per CPU-second against the GEMM's per-thread rate.
        "roofline_fraction_cpu_time": round(tokens * flops_per_token / cpu / (rate / args.threads), 3),
        "profiler_op_seconds": round(op_total, 2),
        "share_of_op_time": shares,
        "load_average": [round(x, 2) for x in (load_before, os.getloadavg()[0])],
        "note": "the GEMM rate and the decode loop are measured in one process on the same 2 shared cores, so "
        "the fraction is their ratio under the same load; the profiler adds overhead per op",
    }
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    out["profile"] = section
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(section, indent=2))


if __name__ == "__main__":
    main()
