"""Phase one of benchmarks/claims.py: generate the compound answers and the questions asked alone.

    python -m benchmarks.claims_generate --prompts 500 --k 3 [--threads 2]

Resumable (see claims_data.py); run it under ``nohup nice -n 10`` on a shared machine.
``--snapshot DIR`` copies the cache out as gzip files (a folder outside the repository) and exits;
``--restore DIR`` first adds to the cache what such a copy has and it lacks, so a run on another
machine resumes where this one stopped.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.claims_data import (
    SOURCES,
    compound_items,
    generate_alone,
    generate_compound,
    interleaved,
    restore_snapshot,
    save_snapshot,
    source_questions,
)
from benchmarks.common import logger, setup_logging
from candor.backends import load_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--prompts", type=int, default=500, help="compound prompts in all, an equal share from each domain"
    )
    parser.add_argument("--k", type=int, default=3, help="sampled answers per prompt (claim self-consistency)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--snapshot", type=Path, default=None, help="only gzip the cache into this folder and exit")
    parser.add_argument("--restore", type=Path, default=None, help="first add the generations of this folder's copy")
    args = parser.parse_args()
    setup_logging()
    if args.snapshot is not None:
        for path in save_snapshot(args.snapshot):
            logger.info("wrote %s", path)
        return
    if args.restore is not None:
        logger.info("restored %d generations from %s", restore_snapshot(args.restore), args.restore)
    torch.set_num_threads(args.threads)
    backend = load_backend("smollm2-135m", "hf")
    per_source = args.prompts // len(SOURCES)
    groups = [compound_items(s, source_questions(s, args.data_dir), per_source) for s in SOURCES]
    items = interleaved(groups)
    generate_compound(items, backend, args.k, args.batch_size)
    logger.info("compound done; the questions alone next")
    generate_alone(items, backend, args.k, 16)
    logger.info("done")


if __name__ == "__main__":
    main()
