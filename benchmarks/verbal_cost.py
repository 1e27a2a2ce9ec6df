"""Cost of verbal-percent (101 multi-token labels) against a single-token format (verbal-number), one run.

Both estimators score the same annotated records (HonestyBench-mini NQ dev
records from the benchmark cache, or any records file via ``--records``) with
the embedded default model; the time of ``estimate`` is measured for each, a
warm-up call first, model loading outside. Besides the wall and CPU ratio it
reports why the ratio is what it is: the work each format needs per record,
counted in tokens fed through the backbone (the prompt's own suffix past the
prefix all prompts share, plus the candidate trie's nodes, see
:mod:`candor.backends.engine.prefix_scoring`), and the FLOP floor that follows from
it. Results: ``benchmarks/results/verbal_cost.json``.

    python -m benchmarks.verbal_cost [--records benchmarks/cache/mini/dev/nq.jsonl] [--n 24]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CACHE, RESULTS, write_json

MODEL = "smollm2-135m"
OUT = RESULTS / "verbal_cost.json"
FORMATS = ("number", "percent")


def repo_relative(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (results name no machine paths)."""
    root, full = Path(__file__).resolve().parents[1], path.resolve()
    return str(full.relative_to(root) if full.is_relative_to(root) else full)


def work(backend: Any, records: list[Any], fmt: str) -> dict[str, Any]:
    """Tokens per record the scorer feeds: prompt suffix past the shared prefix, and trie nodes."""
    from candor.backends.engine.prefix_scoring import scoring_work
    from candor.estimators.answers import record_answer
    from candor.verbal.distribution import surface_forms
    from candor.verbal.formats import format_prompt, get_format

    prompts = [format_prompt(backend, r.item, record_answer(r), fmt) for r in records]
    forms = [text for _, text in surface_forms(get_format(fmt).labels)]
    plan = scoring_work(backend, prompts, forms)
    prefix, suffix, nodes = plan["shared_prefix"], plan["suffix"], plan["trie_nodes"]
    return {
        "surface_forms": len(forms),
        "shared_prefix_tokens": prefix,
        "suffix_tokens_mean": float(np.mean(suffix)),
        "trie_nodes_mean": float(np.mean(nodes)),
        "logit_positions_mean": float(np.mean(nodes)) + 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=Path, default=CACHE / "mini" / "dev" / "nq.jsonl")
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if not args.records.exists():
        print(f"skipped: no records at {args.records} (run `python -m benchmarks.baselines` first)")
        return

    import torch

    from candor.annotation.records import read_records
    from candor.backends.hf import HFBackend
    from candor.estimators import get_estimator

    torch.set_num_threads(args.threads)
    records = list(read_records(args.records))[: args.n]
    backend = HFBackend.from_pretrained(MODEL)
    config = backend.model.config
    # FLOPs per token fed: 2 x the decoder's weights; per logit position: 2 x hidden x vocab.
    decoder_params = sum(p.numel() for p in backend.model.model.parameters()) - config.vocab_size * config.hidden_size
    head_flops = 2 * config.hidden_size * config.vocab_size
    runs: dict[str, Any] = {}
    for fmt in FORMATS:
        estimator = get_estimator(f"verbal-{fmt}")
        estimator.estimate(records[:2], backend)  # warm-up
        start, cpu = time.perf_counter(), time.process_time()
        values = estimator.estimate(records, backend)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        shape = work(backend, records, fmt)
        flops = (shape["suffix_tokens_mean"] + shape["trie_nodes_mean"]) * 2 * decoder_params + shape[
            "logit_positions_mean"
        ] * head_flops
        runs[fmt] = {
            "seconds_per_record": round(wall / len(records), 4),
            "cpu_seconds_per_record": round(cpu / len(records), 4),
            "gflop_per_record_floor": round(flops / 1e9, 2),
            "achieved_gflop_per_cpu_second": round(flops * len(records) / cpu / 1e9, 1),
            **shape,
            "confidences": [round(float(v), 6) for v in values],
        }
        print(f"verbal-{fmt}: {wall / len(records):.3f} s/record, {cpu / len(records):.3f} CPU s/record", flush=True)
    number, percent = runs["number"], runs["percent"]
    result = {
        "model": MODEL,
        "records": len(records),
        "source": repo_relative(args.records),
        "torch_threads": args.threads,
        "ratio_percent_to_number": round(percent["seconds_per_record"] / number["seconds_per_record"], 2),
        "cpu_ratio_percent_to_number": round(percent["cpu_seconds_per_record"] / number["cpu_seconds_per_record"], 2),
        "flop_floor_ratio_percent_to_number": round(
            percent["gflop_per_record_floor"] / number["gflop_per_record_floor"], 2
        ),
        "goal": "ratio_percent_to_number <= 2 with the same numbers within 1e-4",
        "note": "measured on a 2-core machine shared with other jobs: read the ratios (same run), not the seconds",
        "formats": runs,
    }
    write_json(args.out, result)
    print(
        f"percent/number: {result['ratio_percent_to_number']}x wall, {result['cpu_ratio_percent_to_number']}x CPU, "
        f"FLOP floor {result['flop_floor_ratio_percent_to_number']}x"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
