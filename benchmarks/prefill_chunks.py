"""What one chunk of a long prompt's prefill costs, against the whole prompt in one piece (issue 42).

A short question beside a long prompt waits for at most one chunk (the live
engine runs a chunk between two decode steps), so the chunk's time is the
floor of what a long prompt adds to a short question's latency. In process,
embedded default, one prompt of about ``--tokens`` tokens, prefilled in chunks
of ``--chunk`` tokens (as the live engine does) and in one piece, alternating
``--rounds`` times; per chunk position, the median time.

    PYTHONPATH=src python -m benchmarks.prefill_chunks [--tokens 4000] [--chunk 64] [--rounds 2]

Results: ``benchmarks/results/prefill_chunks.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from benchmarks.common import RESULTS, setup_logging, write_json
from candor.backends.engine.chunked_prefill import ChunkedPrefill
from candor.backends.hf import HFBackend
from candor.util.cpu import describe

EMOJI = "\U0001f600"  # 3 of SmolLM2's tokens


def chunk_times(backend: HFBackend, ids: list[int], chunk: int) -> list[tuple[int, float]]:
    """(tokens done after the chunk, seconds) for each chunk of one chunked prefill."""
    prefill = ChunkedPrefill.start(backend, ids, chunk)
    out = []
    while True:
        start = time.perf_counter()
        finished = prefill.step()
        out.append((prefill.cache.done, time.perf_counter() - start))
        if finished:
            return out


def one_piece(backend: HFBackend, ids: list[int]) -> float:
    tensor = torch.tensor([ids], dtype=torch.long)
    start = time.perf_counter()
    backend.forward(tensor, torch.ones_like(tensor), backend.new_cache(), torch.arange(len(ids))[None])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    setup_logging()
    torch.set_num_threads(args.threads)
    backend = HFBackend.from_pretrained(args.model)
    ids = backend.encode([EMOJI * (args.tokens // 3) + "\nWhich face is this?"])[0]
    chunked: list[list[tuple[int, float]]] = []
    whole: list[float] = []
    with torch.inference_mode(), backend.packed_linears:
        for _ in range(args.rounds):  # alternating, so a slower moment of a shared machine hits both arms
            chunked.append(chunk_times(backend, ids, args.chunk))
            whole.append(one_piece(backend, ids))
    ends = [end for end, _ in chunked[0]]
    per_chunk = [statistics.median(run[i][1] for run in chunked) for i in range(len(ends))]
    body = per_chunk[:-1]
    result = {
        "command": " ".join(["PYTHONPATH=src python -m benchmarks.prefill_chunks", *sys.argv[1:]]),
        "model": args.model,
        "threads": args.threads,
        "machine": describe(),
        "prompt_tokens": len(ids),
        "chunk": args.chunk,
        "rounds": args.rounds,
        "chunk_s": {
            "first": round(body[0], 3),
            "median": round(statistics.median(body), 3),
            "max_before_last": round(max(body), 3),
            "last": round(per_chunk[-1], 3),
            "last_rows": ends[-1] - ends[-2],
        },
        "chunked_total_s": round(statistics.median(sum(s for _, s in run) for run in chunked), 2),
        "one_piece_s": round(statistics.median(whole), 2),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    result["chunked_over_one_piece"] = round(result["chunked_total_s"] / result["one_piece_s"], 2)
    print(result)
    write_json(RESULTS / "prefill_chunks.json", result)


if __name__ == "__main__":
    main()
