"""Two parts of a decode step, each against the way it was done before, at the embedded model's sizes.

- **Picking tokens** (``candor.backends.engine.sampling.pick_tokens``): one partial
  sort of the top 64 logits per row serves the greedy choice, the top-k draw
  and the top log-probs; before, ``argmax``, the samplers' own ``topk`` and a
  second ``topk`` for the log-probs each passed over the vocabulary. The
  baseline is that code, written out here. 96 rows (16 prompts, a greedy
  answer and 5 samples each: 80 sample at top-k 50, top-p 0.95), a
  49,152-token vocabulary, 5 top log-probs. Random logits, so no two tie,
  and both must pick the same tokens with the same log-probs.
- **Copying rows' KV windows** (``candor.backends.engine.kv_slots.copy_rows``),
  which admission and compaction do for every layer's keys and values:
  ``index_select`` then ``index_copy_``, against advanced-index assignment
  (``dst[rows, :, cols] = src[source_rows, :, cols]``). Admission: 96 rows
  from a 16-prompt prefill of 75 columns into buffers of 96 slots x 139
  columns; compaction: 15 rows moved over a 75-column window. 30 layers x
  keys and values, as the embedded model. Both must write the same bytes.

The arms alternate, the medians of wall and CPU time are kept, and the
ratios are baseline / new. Torch runs on ``--threads`` threads with
``OMP_WAIT_POLICY=PASSIVE``, as candor's CLI sets it.

    python -m benchmarks.decode_step_parts [--rounds 10] [--threads 2]

Writes ``benchmarks/results/decode_step_parts.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import write_json
from benchmarks.measure import Timer
from candor.backends.base import SamplingParams
from candor.backends.engine.kv_slots import copy_rows
from candor.backends.engine.sampling import pick_tokens, sample_tokens
from candor.util.cpu import describe

RESULTS = Path(__file__).resolve().parent / "results" / "decode_step_parts.json"
VOCAB, ROWS, PROMPTS, TOP_LOGPROBS = 49152, 96, 16, 5
LAYER_TENSORS, KV_HEADS, HEAD_DIM = 60, 3, 64  # 30 layers x (keys, values) of SmolLM2-135M
PARAMS = SamplingParams(max_new_tokens=32, temperature=1.0, top_p=0.95, top_k=50, stop=())


def separate_passes(logits: torch.Tensor, samplers: list[Any], top_logprobs: int) -> tuple[Any, Any, Any]:
    """``pick_tokens`` as it was: a pass over the vocabulary for each of argmax, sampling and top log-probs."""
    tokens = logits.argmax(dim=-1)
    for params, rows, uniforms in samplers:
        index = torch.tensor(rows)
        tokens[index] = sample_tokens(logits[index], torch.tensor(uniforms, dtype=torch.float32), params)
    chosen = logits.gather(1, tokens.unsqueeze(1)).squeeze(1)
    log_z = torch.logsumexp(logits, dim=-1)
    values, ids = logits.topk(top_logprobs, dim=-1)
    return tokens, chosen - log_z, (ids.tolist(), (values - log_z.unsqueeze(1)).tolist())


def race(arms: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, Any]:
    """Alternating timed rounds of each arm (``calls`` calls each); medians in ms per call."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    for i in range(rounds):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))
        for name in order:
            with Timer() as timer:
                for _ in range(calls):
                    arms[name]()
            times[name].append((timer.wall / calls, timer.cpu / calls))
    out: dict[str, Any] = {}
    for name, runs in times.items():
        out[name] = {
            "wall_ms": round(1000 * statistics.median(w for w, _ in runs), 2),
            "cpu_ms": round(1000 * statistics.median(c for _, c in runs), 2),
        }
    return out


def with_ratios(timed: dict[str, Any], baseline: str, new: str) -> dict[str, Any]:
    timed["wall_ratio"] = round(timed[baseline]["wall_ms"] / timed[new]["wall_ms"], 2)
    timed["cpu_ratio"] = round(timed[baseline]["cpu_ms"] / timed[new]["cpu_ms"], 2)
    return timed


def picking(rounds: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(ROWS, VOCAB, generator=generator) * 3
    sample_rows = [r for r in range(ROWS) if r % 6 != 0]  # each prompt's first row is its greedy answer
    uniforms = torch.rand(len(sample_rows), generator=generator).tolist()
    samplers = [(PARAMS, sample_rows, uniforms)]
    new, old = pick_tokens(logits, samplers, TOP_LOGPROBS), separate_passes(logits, samplers, TOP_LOGPROBS)
    same = torch.equal(new[0], old[0]) and torch.equal(new[1], old[1]) and new[2] == old[2]
    timed = race(
        {
            "separate_passes": lambda: separate_passes(logits, samplers, TOP_LOGPROBS),
            "shared_sort": lambda: pick_tokens(logits, samplers, TOP_LOGPROBS),
        },
        rounds,
        calls=10,
    )
    return {
        "rows": ROWS,
        "vocab": VOCAB,
        "sampling_rows": len(sample_rows),
        "identical": same,
        **with_ratios(timed, "separate_passes", "shared_sort"),
    }


def copying(rows: list[int], source_rows: list[int], source_shape: tuple[int, ...], columns: int, rounds: int):
    """Both ways of writing ``rows`` of 60 slot buffers from ``source_rows`` of 60 source tensors."""
    generator = torch.Generator().manual_seed(1)
    slots = [torch.zeros(ROWS, KV_HEADS, 139, HEAD_DIM) for _ in range(LAYER_TENSORS)]
    sources = [torch.randn(*source_shape, generator=generator) for _ in range(LAYER_TENSORS)]
    index, source_index = torch.tensor(rows), torch.tensor(source_rows)
    target, window = slice(139 - columns - 4, 139 - 4), slice(source_shape[2] - columns, source_shape[2])

    def advanced_index() -> None:
        for mine, theirs in zip(slots, sources, strict=True):
            mine[index, :, target] = theirs[source_index, :, window]

    def index_copy() -> None:
        for mine, theirs in zip(slots, sources, strict=True):
            copy_rows(mine[:, :, target], index, theirs[:, :, window], source_index)

    advanced_index()
    want = [s.clone() for s in slots]
    for s in slots:
        s.zero_()
    index_copy()
    same = all(torch.equal(a, b) for a, b in zip(want, slots, strict=True))
    timed = race({"advanced_index": advanced_index, "index_copy": index_copy}, rounds, calls=3)
    return {
        "rows_written": len(rows),
        "columns": columns,
        "identical": same,
        **with_ratios(timed, "advanced_index", "index_copy"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    slots = list(range(ROWS))
    shuffled = slots[::2] + slots[1::2]  # joining rows land in free slots all over the buffer
    with torch.inference_mode():
        result = {
            "command": "python -m benchmarks.decode_step_parts",
            "settings": {
                "threads": args.threads,
                "rounds": args.rounds,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                "cpu": platform.machine(),
                "cpu_count": os.cpu_count(),
                "machine": describe(),
            },
            "pick_tokens": picking(args.rounds),
            "admission_copy": copying(
                shuffled, [r // 6 for r in slots], (PROMPTS, KV_HEADS, 75, HEAD_DIM), 75, args.rounds
            ),
            "compaction_copy": copying(
                list(range(0, 60, 4)), list(range(81, 96)), (ROWS, KV_HEADS, 139, HEAD_DIM), 75, args.rounds
            ),
            "load_average": list(os.getloadavg()[:2]),
        }
    for part in ("pick_tokens", "admission_copy", "compaction_copy"):
        r = result[part]
        arms = [k for k in r if isinstance(r[k], dict)]
        print(
            f"{part}: "
            + ", ".join(f"{a} {r[a]['wall_ms']} ms ({r[a]['cpu_ms']} CPU)" for a in arms)
            + f"; {r['wall_ratio']}x wall, {r['cpu_ratio']}x CPU; identical: {r['identical']}"
        )
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
