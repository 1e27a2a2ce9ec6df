"""Cost of a question-level confidence (the EliCal head) against the cost of annotating the question.

One run, one process, the same questions for every path (embedded default
model, ``fewshot`` template, NQ questions from HonestyBench-mini's *training
pool*, never its test part):

1. annotate: ``candor.annotate.annotate`` with k=5 samples (greedy + 5,
   temperature 1, top-p 0.95, top-k 50, at most 32 new tokens, cut at the
   newline), judges included: the per-question cost of answering.
2. a head-mode EliCal head is trained on those annotated training-pool
   records (untimed; its quality is not what this measures, only its cost).
3. head: the ``elical`` estimator scoring the same records (the shared
   few-shot prefix computed once, prompts bucketed by length), timed.
4. head-left: the head on plain left-padded batches of 16 in input order, the
   path before the shared prefix (``ConfidenceHead.features``), timed, and its
   confidences and features compared with (3).
5. head-bf16: the same head reloaded with ``dtype="bfloat16"`` (the estimator's
   opt-in ``-O elical.dtype=bfloat16``), timed; its confidences are compared
   with float32's (largest difference, rank correlation).

Model loading is outside every timed region. Wall and process CPU time are
both reported; on a shared machine the ratios (measured in the same run) are
the numbers to read, not the absolute seconds.

    python -m benchmarks.elical_cost [--questions 100] [--threads 2]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from benchmarks.common import RESULTS, setup_logging, write_json
from benchmarks.measure import Timer
from benchmarks.mini import load_mini_or_exit

logger = logging.getLogger("benchmarks.elical_cost")
MODEL = "smollm2-135m"
OUT = RESULTS / "elical_cost.json"


def left_padded_head(head: Any, records: list[Any], batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Confidences and features the way the head computed them before: every prompt in full, input order."""
    import torch

    from candor.backends.engine import packed_linears_of
    from candor.backends.tokens import encode, pad_batch

    prompts = head.prompts(records)
    confidences, features = [], []
    # The same prepacked kernels as ``predict``, so the comparison is the shared prefix's alone.
    with torch.no_grad(), packed_linears_of(head.backbone):
        for start in range(0, len(prompts), batch_size):
            seqs = encode(head.tokenizer, prompts[start : start + batch_size])
            ids, mask = pad_batch(seqs, int(head.tokenizer.pad_token_id))
            feats = head.features(ids, mask)
            features.append(feats.numpy())
            confidences.append(head.head(feats).numpy())
    return np.concatenate(confidences).astype(float), np.concatenate(features)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16, help="annotation batch size")
    parser.add_argument("--head-batch-size", type=int, default=16, help="the elical estimator's batch size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    setup_logging()

    import torch

    from candor.annotation.builder import AnnotateConfig, annotate
    from candor.annotation.prompts import TEMPLATES
    from candor.annotation.records import read_records
    from candor.backends.base import SamplingParams
    from candor.backends.hf import HFBackend
    from candor.estimators import get_estimator
    from candor.train.elical import EliCalConfig, train_elical

    torch.set_num_threads(args.threads)
    bench = load_mini_or_exit(args.data_dir, test_size=0, train_pool=max(args.questions + 20, 120))
    items = bench.train["nq"][: args.questions]  # training pool only
    dev_items = bench.dev["nq"][:20]
    backend = HFBackend.from_pretrained(MODEL, batch_size=args.batch_size)
    template = TEMPLATES.get("fewshot")
    config = AnnotateConfig(k=args.k, params=SamplingParams(), batch_size=args.batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        annotate(items[:1], backend, Path(tmp) / "warm.jsonl", template, config, progress=False)  # warm-up
        with Timer() as annotate_time:
            annotate(items, backend, Path(tmp) / "records.jsonl", template, config, progress=False)
        annotate(dev_items, backend, Path(tmp) / "dev.jsonl", template, config, progress=False)  # untimed
        records = list(read_records(Path(tmp) / "records.jsonl"))
        dev = list(read_records(Path(tmp) / "dev.jsonl"))
        logger.info("training a head-mode head on %d training-pool records (dev %d)", len(records), len(dev))
        trained = train_elical(
            records,
            dev,
            method="cal-only",
            config=EliCalConfig(mode="head", max_epochs=20),
            out_dir=Path(tmp) / "head",
            model=backend.model,
            tokenizer=backend.tokenizer,
        )
        estimator = get_estimator("elical", head=trained.model, batch_size=args.head_batch_size)
        estimator.estimate(records[:2])  # warm-up
        with Timer() as head_time:
            confidences = np.asarray(estimator.estimate(records))
        half = get_estimator("elical", head=str(Path(tmp) / "head"), batch_size=args.head_batch_size, dtype="bfloat16")
        half.estimate(records[:2])  # loads the bf16 backbone; warm-up
        with Timer() as half_time:
            half_confidences = np.asarray(half.estimate(records))
        with Timer() as left_time:
            left_confidences, left_features = left_padded_head(trained.model, records, 16)
        features = trained.model.prompt_features(trained.model.prompts(records), batch_size=args.head_batch_size)

    n = len(records)
    per_q = {
        "annotate_k5": annotate_time.wall / n,
        "head_shared_prefix": head_time.wall / n,
        "head_left_padded": left_time.wall / n,
        "head_bf16": half_time.wall / n,
    }
    result = {
        "model": MODEL,
        "questions": n,
        "source": "HonestyBench-mini NQ training pool (no test questions)",
        "k": args.k,
        "template": "fewshot",
        "settings": {
            **SamplingParams().to_dict(),
            "stop": ["\n"],
            "annotate_batch_size": args.batch_size,
            "head_batch_size": args.head_batch_size,
            "torch_threads": args.threads,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        },
        "seconds_per_question": {k: round(v, 4) for k, v in per_q.items()},
        "cpu_seconds_per_question": {
            "annotate_k5": round(annotate_time.cpu / n, 4),
            "head_shared_prefix": round(head_time.cpu / n, 4),
            "head_left_padded": round(left_time.cpu / n, 4),
            "head_bf16": round(half_time.cpu / n, 4),
        },
        "ratio_head_to_annotate": round(head_time.wall / annotate_time.wall, 4),
        "ratio_head_to_annotate_cpu": round(head_time.cpu / annotate_time.cpu, 4),
        "ratio_left_padded_head_to_annotate": round(left_time.wall / annotate_time.wall, 4),
        "speedup_shared_prefix_over_left_padded": round(left_time.wall / head_time.wall, 2),
        "ratio_head_bf16_to_annotate": round(half_time.wall / annotate_time.wall, 4),
        "ratio_head_bf16_to_annotate_cpu": round(half_time.cpu / annotate_time.cpu, 4),
        "bf16_vs_float32": {
            "max_abs_confidence_difference": float(np.max(np.abs(half_confidences - confidences))),
            "mean_abs_confidence_difference": float(np.mean(np.abs(half_confidences - confidences))),
            "spearman": float(spearmanr(half_confidences, confidences).statistic),
        },
        "max_abs_confidence_difference": float(np.max(np.abs(confidences - left_confidences))),
        "max_abs_feature_difference": float(np.max(np.abs(features - left_features))),
        "goal": "ratio_head_to_annotate <= 0.1",
        "note": "measured on a 2-core machine shared with other jobs: read the ratios (same run), not the seconds",
        "head_training": {"method": "cal-only", "mode": "head", "train_records": n, "dev_records": len(dev)},
    }
    write_json(args.out, result)
    print(
        f"annotate k={args.k}: {per_q['annotate_k5']:.3f} s/question; head: {per_q['head_shared_prefix']:.4f} "
        f"s/question (ratio {result['ratio_head_to_annotate']}, CPU ratio {result['ratio_head_to_annotate_cpu']}); "
        f"left-padded head: {per_q['head_left_padded']:.4f} s/question "
        f"(ratio {result['ratio_left_padded_head_to_annotate']}); bf16 head: {per_q['head_bf16']:.4f} s/question "
        f"(ratio {result['ratio_head_bf16_to_annotate']}, CPU ratio {result['ratio_head_bf16_to_annotate_cpu']}, "
        f"max |Δconfidence| vs fp32 {result['bf16_vs_float32']['max_abs_confidence_difference']:.2e}); "
        "max |Δconfidence| "
        f"{result['max_abs_confidence_difference']:.2e}, max |Δfeature| {result['max_abs_feature_difference']:.2e}"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
