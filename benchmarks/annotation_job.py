"""The annotation job the speed benchmarks share: the first NQ test questions, the embedded model, greedy + k samples.

One greedy answer and k samples per question with the ``fewshot`` template (temperature 1, top-p 0.95,
top-k 50, at most 32 new tokens, cut at the first newline), every token's log-prob kept.
``annotate_throughput.py`` measures it; the other speed benchmarks run parts of it.

Candor is imported inside the functions only, so a script's parent process loads no torch
before its children, and lm-polygraph's venv (no candor) can import the scripts that use this.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
DATA = REPOSITORY.parent / "shared" / "data" / "honestybench" / "nq" / "test.jsonl"
RESULTS = REPOSITORY / "benchmarks" / "results" / "annotate_throughput.json"
MODEL = "smollm2-135m"
SETTINGS = {"max_new_tokens": 32, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "stop": ["\n"]}


def load_items(n: int, data: Path = DATA) -> list[Any]:
    """The first ``n`` questions of the NQ test file ``data``, as ``nq-<row>`` items."""
    from candor.data.items import QAItem

    items = []
    with Path(data).open() as f:
        for i, line in enumerate(f):
            if i == n:
                break
            row = json.loads(line)
            items.append(
                QAItem(id=f"nq-{i}", dataset="nq", split="test", question=row["question"], answers=tuple(row["answer"]))
            )
    return items


def sampling_params() -> Any:
    """The job's decoding settings as candor's ``SamplingParams``."""
    from candor.backends.base import SamplingParams

    return SamplingParams(**{**SETTINGS, "stop": tuple(SETTINGS["stop"])})


def generated_tokens(gens: list[Any], max_new_tokens: int) -> int:
    """Tokens generated for every answer, counting the stop token that ended one before the cap."""
    return sum(len(c.token_ids) + (len(c.token_ids) < max_new_tokens) for g in gens for c in [g.greedy, *g.samples])


def prompts_for(items: list[Any], backend: Any) -> list[str]:
    """The ``fewshot`` prompts of ``items`` (``backend`` may be a :class:`RenderOnly`)."""
    from candor.annotation.prompts import TEMPLATES

    template = TEMPLATES.get("fewshot")
    return [template(item, backend) for item in items]


class RenderOnly:
    """Stands in for a backend when only the few-shot template renders (it needs no model)."""

    model_name = MODEL

    def render_chat(self, messages: Any, add_generation_prompt: bool = True) -> str:
        raise NotImplementedError


def omp_wait_policy() -> str:
    """The OpenMP wait policy the job's children run with: the environment's, else ``PASSIVE``."""
    return os.environ.get("OMP_WAIT_POLICY", "PASSIVE")


def job_parser(description: str, questions: int = 64, out: Path = RESULTS) -> argparse.ArgumentParser:
    """The options of the annotation job these speed benchmarks share (questions, k, batch, threads, --out)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--questions", type=int, default=questions)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=out)
    return parser
