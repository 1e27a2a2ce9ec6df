"""`candor adapt` on a new domain: HonestyBench-mini, leave one domain out (issue 43).

(first stage only so far: the annotation cache, shared with annotate_mini.py)
"""

from __future__ import annotations

import argparse

from common import CACHE, annotate_part, load_mini_or_exit, logger, setup_logging

from candor.annotation.builder import AnnotateConfig
from candor.annotation.prompts import resolve_template
from candor.backends import load_backend
from candor.backends.base import SamplingParams

MODEL = "smollm2-135m"


def annotate_mini(data_dir: str | None) -> None:
    """The in-domain pool (train + dev) and test parts, k = 5, in annotate_mini.py's cache and settings."""
    mini = load_mini_or_exit(data_dir, test_size=200, train_pool=500)
    backend = load_backend(MODEL)
    template = resolve_template("auto", MODEL, backend)
    # The test questions are scored by the head from the question alone: greedy correctness is all they need.
    greedy_only = AnnotateConfig(k=0, params=SamplingParams(max_new_tokens=32), batch_size=32)
    annotate_part(mini.test_id, "test", backend, template, greedy_only, CACHE / "adapt")
    config = AnnotateConfig(k=5, params=SamplingParams(max_new_tokens=32))
    for part in ("train", "dev"):
        annotate_part(getattr(mini, part), part, backend, template, config, CACHE / "mini")


if __name__ == "__main__":
    setup_logging()
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default=None)
    args = p.parse_args()
    annotate_mini(args.data_dir)
    logger.info("annotation done")
