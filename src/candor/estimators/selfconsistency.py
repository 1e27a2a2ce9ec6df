"""``self-consistency``: how often fresh samples agree with the answer (the ADVICE baseline, §4.5).

M answers (5 by default) are sampled for each question; the confidence in the
record's greedy answer is the fraction of them that agree with it.

- ``prompt="format"`` (default) samples with the §4.3 format prompt (the
  format's system text, an open assistant turn) and reads the ``Answer:`` line
  of each reply; ``prompt="qa"`` samples with the QA template that annotation
  uses for this model (``candor.annotation.prompts.resolve_template``).
- Agreement for multiple choice is the same option letter; for open QA it is
  the consistency judge (``lexical`` by default). An empty sample never agrees.
- Sampling follows docs/methods.md "Generation and judging" (temperature 1.0, top-p 0.95, top-k 50),
  with one seed per record derived from ``seed`` and the record id, so a
  record's confidence does not depend on the batch it is scored in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.annotation.judges import CONSISTENCY_JUDGES, get_consistency_judge
from candor.annotation.prompts import resolve_template
from candor.annotation.records import Record
from candor.backends.base import Backend, SamplingParams
from candor.estimators.answers import option_letter, record_answer
from candor.estimators.base import ESTIMATORS, Estimator
from candor.util.errors import CandorError
from candor.util.seeds import item_seed
from candor.verbal.formats import answer_prompt, get_format, parse_answer

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
        self.m = m
        self.prompt = prompt
        self.fmt = get_format(fmt)
        CONSISTENCY_JUDGES.get(judge)  # an unknown judge fails here
        self.judge_name = judge
        self.seed = seed
        stop = ("Confidence",) if prompt == "format" else ()
        self.params = SamplingParams(max_new_tokens=max_new_tokens, stop=stop)

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        assert backend is not None  # checked by estimate()
        prompts, stops = self._prompts(records, backend)
        params = dataclasses.replace(self.params, stop=stops)
        seeds = [item_seed("self-consistency", self.seed, r.id) for r in records]  # not the annotation's draws
        gens = backend.generate(prompts, self.m, params, greedy=False, seeds=seeds)
        answers = [[self._answer(s.text) for s in gen.samples] for gen in gens]
        return self.agreement(records, answers, backend)

    def _prompts(self, records: Sequence[Record], backend: Backend) -> tuple[list[str], tuple[str, ...]]:
        if self.prompt == "format":
            return [answer_prompt(backend, r.item, self.fmt) for r in records], self.params.stop
        template = resolve_template("auto", backend.model_name, backend)
        return [template(r.item, backend) for r in records], template.stop

    def _answer(self, sample: str) -> str:
        return parse_answer(sample) if self.prompt == "format" else sample.strip()

    def agreement(
        self, records: Sequence[Record], answers: Sequence[Sequence[str]], backend: Backend | None = None
    ) -> np.ndarray:
        """Fraction of each record's sampled answers that agree with its greedy answer."""
        agree = [[0] * len(a) for a in answers]
        pairs = []  # (record, sample) pairs for the consistency judge, judged in one batch
        for i, (rec, sampled) in enumerate(zip(records, answers, strict=True)):
            target = record_answer(rec)
            for j, ans in enumerate(sampled):
                if rec.item.is_multiple_choice:
                    agree[i][j] = int(option_letter(ans, rec.item) == target)
                else:
                    pairs.append((i, j, ans, target, rec.item.question))
        if pairs:
            options = {"backend": backend} if self.judge_name == "llm" else {}
            judge = get_consistency_judge(self.judge_name, **options)
            _, _, a, b, q = zip(*pairs, strict=True)
            for (i, j, *_), v in zip(pairs, judge.judge(list(a), list(b), list(q)), strict=True):
                agree[i][j] = int(v)
        return np.array([float(np.mean(a)) if a else 0.0 for a in agree])

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "m": self.m,
            "prompt": self.prompt,
            "format": self.fmt.name,
            "judge": self.judge_name,
            "seed": self.seed,
        }
