"""What every benchmark run shares: its folders, the benchmark data's default place, its log and its results file."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from candor.util.files import atomic_write_json

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
CACHE = ROOT / "cache"
# Developers and CI keep the benchmark data beside the checkout; a run without it skips (mini.load_mini_or_exit).
SHARED_DATA = ROOT.parent.parent / "shared" / "data" / "honestybench"
if SHARED_DATA.is_dir():
    os.environ.setdefault("CANDOR_DATA_DIR", str(SHARED_DATA))

logger = logging.getLogger("benchmarks")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "httpx", "datasets", "filelock", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    atomic_write_json(path, payload)
