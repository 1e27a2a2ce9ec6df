"""``self-consistency``: how often fresh samples agree with the answer (the ADVICE baseline, §4.5).

M answers (5 by default) are sampled for each question; the confidence in the
record's greedy answer is the fraction of them that agree with it.

- ``prompt="format"`` (default) samples with the §4.3 format prompt (the
  format's system text, an open assistant turn) and reads the ``Answer:`` line
  of each reply; ``prompt="qa"`` samples with the QA template that annotation
  uses for this model (``candor.prompts.resolve_template``).
- Agreement for multiple choice is the same option letter; for open QA it is
  the consistency judge (``lexical`` by default). An empty sample never agrees.
- Sampling follows DESIGN.md §4.1 (temperature 1.0, top-p 0.95, top-k 50),
  with one seed per record derived from ``seed`` and the record id, so a
  record's confidence does not depend on the batch it is scored in.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.backends.base import Backend, SamplingParams
from candor.errors import CandorError
from candor.estimators.answers import option_letter, record_answer
from candor.estimators.base import ESTIMATORS, Estimator
from candor.judges import get_consistency_judge
from candor.prompts import resolve_template
from candor.records import Record
from candor.verbal_formats import answer_prompt, get_format, parse_answer

PROMPTS = ("format", "qa")


@ESTIMATORS.register("self-consistency")
class SelfConsistency(Estimator):
    """Agreement rate of M fresh samples with the record's greedy answer."""

    name = "self-consistency"
    needs_backend = True
    level = "answer"

    def __init__(
        self,
        m: int = 5,
        prompt: str = "format",
        fmt: str = "number",
        judge: str = "lexical",
        max_new_tokens: int = 32,
        seed: int = 0,
    ) -> None:
        if m < 1:
            raise CandorError(f"self-consistency needs at least one sample, got m={m}")
        if prompt not in PROMPTS:
            raise CandorError(f"self-consistency prompt must be one of {', '.join(PROMPTS)}, got {prompt!r}")
        if judge == "llm":
            raise CandorError("self-consistency: use a lexical consistency judge (the llm judge needs its own model)")
        self.m = m
        self.prompt = prompt
        self.fmt = get_format(fmt)
        self.judge = get_consistency_judge(judge)
        self.seed = seed
        stop = ("Confidence",) if prompt == "format" else ()
        self.params = SamplingParams(max_new_tokens=max_new_tokens, stop=stop)

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        assert backend is not None  # checked by estimate()
        prompts, stops = self._prompts(records, backend)
        params = SamplingParams(**{**self.params.to_dict(), "stop": stops})
        seeds = [zlib.crc32(f"{self.seed}:{r.id}".encode()) for r in records]
        gens = backend.generate(prompts, self.m, params, greedy=False, seeds=seeds)
        return np.array([self._agreement(rec, [s.text for s in gen.samples])
                         for rec, gen in zip(records, gens, strict=True)])

    def _prompts(self, records: Sequence[Record], backend: Backend) -> tuple[list[str], tuple[str, ...]]:
        if self.prompt == "format":
            return [answer_prompt(backend, r.item, self.fmt) for r in records], self.params.stop
        template = resolve_template("auto", backend.model_name, backend)
        return [template(r.item, backend) for r in records], template.stop

    def _agreement(self, record: Record, samples: list[str]) -> float:
        answers = [parse_answer(s) if self.prompt == "format" else s.strip() for s in samples]
        target = record_answer(record)
        if record.item.is_multiple_choice:
            letters = [option_letter(a, record.item) for a in answers]
            return float(np.mean([letter is not None and letter == target for letter in letters]))
        verdicts = self.judge.judge(answers, [target] * len(answers), [record.item.question] * len(answers))
        return float(np.mean(verdicts))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "m": self.m, "prompt": self.prompt, "format": self.fmt.name,
                "judge": self.judge.describe(), "seed": self.seed}
