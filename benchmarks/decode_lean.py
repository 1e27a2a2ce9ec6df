"""The lean Llama decode step against transformers' forward, and the OpenMP wakes it saves.

Two measurements, each against its baseline in the same process:

- ``wakes``: the products of one decode step's 30 layers at 1, 8 and 80 rows
  (the embedded model's q, k, v, gate and up shapes, prepacked oneDNN, on
  torch's threads with ``OMP_WAIT_POLICY=PASSIVE``): five separate products
  per layer against q|k|v and gate|up stacked (two per layer); and one
  ``[80, 576] x [576, 576]`` product on one thread against two, which prices
  waking the sleeping second thread;
- ``job``: the ``annotate_throughput.py`` job (``HFBackend.generate``, few-shot
  NQ questions, 1 greedy + k samples, cut at the first newline) in
  alternating pairs with the lean step (:mod:`candor.backends.engine.llama_step`, the
  default) and with it off (every decode step through transformers' forward).
  The outputs of the two arms must be bit-equal (token ids and log-probs).
  Both arms keep the shared few-shot prefix in every row (``split_prefix``
  off), so this measures the lean step alone; ``prefix_split.py`` measures
  keeping the prefix once.

    python -m benchmarks.decode_lean [--questions 64] [--pairs 5] [--threads 2]

Writes ``benchmarks/results/decode_lean.json``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.annotation_job import MODEL, load_items, prompts_for, sampling_params
from benchmarks.common import write_json
from benchmarks.races import race_generate, race_parser, race_report

RESULTS = Path(__file__).resolve().parent / "results" / "decode_lean.json"
LAYERS, HIDDEN, KV, INTERMEDIATE = 30, 576, 192, 1536  # the embedded model's shapes


def best_ms(run: Callable[[], Any], repeats: int, rounds: int = 3) -> float:
    """Fastest of ``rounds`` means of ``repeats`` calls, in ms (after one warm call)."""
    run()
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        means.append((time.perf_counter() - start) / repeats * 1e3)
    return round(min(means), 2)


def wakes(threads: int) -> dict[str, Any]:
    """Separate vs stacked products of a step's layers, and one product on one thread vs ``threads``."""
    import torch

    def pack(rows: int) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(torch.randn(rows, HIDDEN) * 0.02, None)

    def product(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

    torch.set_num_threads(threads)
    out: dict[str, Any] = {}
    with torch.inference_mode():
        separate = [[pack(n) for n in (HIDDEN, KV, KV, INTERMEDIATE, INTERMEDIATE)] for _ in range(LAYERS)]
        stacked = [[pack(HIDDEN + 2 * KV), pack(2 * INTERMEDIATE)] for _ in range(LAYERS)]

        def step(x: torch.Tensor, layers: list[list[torch.Tensor]]) -> Callable[[], Any]:
            return lambda: [product(x, p) for layer in layers for p in layer]

        for rows in (1, 8, 80):
            x = torch.randn(rows, HIDDEN)
            ms = {"separate_ms": best_ms(step(x, separate), 5), "stacked_ms": best_ms(step(x, stacked), 5)}
            ms["ratio"] = round(ms["separate_ms"] / ms["stacked_ms"], 2)
            out[f"{rows} row" + ("s" if rows > 1 else "")] = ms
        x, one = torch.randn(80, HIDDEN), pack(HIDDEN)
        torch.set_num_threads(1)
        single = best_ms(lambda: product(x, one), 500)
        torch.set_num_threads(threads)
        both = best_ms(lambda: product(x, one), 500)
    out["one_product_80_rows_us"] = {"1 thread": round(single * 1e3), f"{threads} threads": round(both * 1e3)}
    return out


def job(backend: Any, prompts: list[str], k: int, params: Any, pairs: int) -> dict[str, Any]:
    """Alternating runs with the lean step and without it: medians, tokens/s, and whether outputs agree."""
    lean = backend.lean_step
    if lean is None:
        raise SystemExit("this torch build or model has no lean decode step: nothing to compare")

    def use(step: Any) -> Callable[[], None]:
        return lambda: setattr(backend, "lean_step", step)

    try:
        result = race_generate(
            backend, prompts, k, params, pairs, {"transformers_forward": use(None), "lean_step": use(lean)}
        )
    finally:
        backend.lean_step = lean
    for arm in ("transformers_forward", "lean_step"):
        result[arm]["tokens_per_second"] = round(result["generated_tokens"] / result[arm]["median_wall"], 1)
    result["lean_step_checked"] = lean.checked
    return result


def main() -> None:
    args = race_parser(__doc__.split("\n")[0], questions=64, pairs=5, out=RESULTS).parse_args()

    import torch

    from candor.backends.hf import HFBackend

    load_before = os.getloadavg()
    products = wakes(args.threads)
    torch.set_num_threads(args.threads)
    backend = HFBackend.from_pretrained(MODEL, batch_size=16)
    backend.split_prefix = False  # the lean step alone (see the module docstring)
    params = sampling_params()
    backend.generate(prompts_for(load_items(2), backend), 1, params)  # warm-up: packing, the lean step's check
    whole = job(backend, prompts_for(load_items(args.questions), backend), args.k, params, args.pairs)
    report = race_report(MODEL, args, load_before, "python -m benchmarks.decode_lean", wakes=products, job=whole)
    for rows in ("1 row", "8 rows", "80 rows"):
        r = products[rows]
        print(f"products at {rows}: separate {r['separate_ms']} ms, stacked {r['stacked_ms']} ms ({r['ratio']}x)")
    print(f"one product at 80 rows: {products['one_product_80_rows_us']} µs")
    print(
        f"job: lean {whole['lean_step']['median_wall']} s / {whole['lean_step']['median_cpu']} CPU s, "
        f"transformers {whole['transformers_forward']['median_wall']} / {whole['transformers_forward']['median_cpu']}: "
        f"{whole['speedup_wall']}x wall, {whole['speedup_cpu']}x CPU; outputs bit-equal: {whole['outputs_bit_equal']}"
    )
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
