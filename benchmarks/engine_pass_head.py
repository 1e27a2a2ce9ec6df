"""The EliCal head read from vLLM's generation pass against the classify-server path (GPU check, issue 55 part 5).

Both paths score the same questions with the same head:

- classify: the exported head (``candor export HEAD --to seq-cls OUT``) served by ``vllm serve OUT --runner
  pooling`` at ``--classify-url`` and read by :class:`candor.serve.classify_client.ClassifySource`;
- engine pass: ``HonestModel`` on the ``vllm`` backend built with ``prompt_state_layers`` (vLLM's
  ``extract_hidden_states``), whose answers carry the head's input from the pass that generated them.

Writes one JSON object: the largest difference between the two paths' confidences (the check asks for 1e-4),
each path's seconds, and whether the engine-pass reader was in use (else why not). Run by
``benchmarks/gpu_check.sh`` on a GPU; it needs vLLM.

    python -m benchmarks.engine_pass_head --head H --export OUT --classify-url http://127.0.0.1:PORT \
        --data nq.jsonl --questions 200 --out result.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

TOLERANCE = 1e-4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", type=Path, required=True, help="a head-mode EliCal folder")
    parser.add_argument("--export", type=Path, required=True, help="its seq-cls export, served at --classify-url")
    parser.add_argument("--classify-url", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    from candor.backends import load_backend
    from candor.data.loaders import load_items
    from candor.serve import Decoding, HonestModel
    from candor.serve.classify_client import ClassifySource
    from candor.serve.confidence_sources import HeadSource
    from candor.train.elical.model import HeadConfig

    config = HeadConfig.read(args.head)
    questions = [item.question for item in load_items(args.data, limit=args.questions)]

    t0 = time.perf_counter()
    classify = ClassifySource(args.classify_url, args.export)
    remote = classify.score_questions(questions)
    t1 = time.perf_counter()

    backend = load_backend(
        config.backbone,
        "vllm",
        dtype="float32",
        prompt_state_layers=(config.layer,),
        engine_args={"gpu_memory_utilization": args.gpu_memory_utilization, "enforce_eager": True},
    )
    model = HonestModel(
        backend,
        HeadSource(args.head),
        template=config.template,
        decoding=Decoding(max_new_tokens=args.max_new_tokens),
        backend_name="vllm",
    )
    reader = model.prefill_reader
    t2 = time.perf_counter()
    answers = [a[0] for a in model.answer_batch(questions)]
    t3 = time.perf_counter()
    engine = np.array([a.confidence for a in answers])
    diff = float(np.max(np.abs(engine - remote))) if len(questions) else float("nan")
    result = {
        "questions": len(questions),
        "head": {"backbone": config.backbone, "layer": config.layer, "template": config.template},
        "engine_pass_in_use": bool(reader is not None and reader.from_engine_pass),
        "head_ran_its_own_pass": bool(model.source.ran_own_pass),  # type: ignore[attr-defined]
        "max_abs_diff": diff,
        "tolerance": TOLERANCE,
        "within_tolerance": bool(diff <= TOLERANCE),
        "classify_seconds": round(t1 - t0, 3),
        "engine_pass_seconds_with_generation": round(t3 - t2, 3),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
