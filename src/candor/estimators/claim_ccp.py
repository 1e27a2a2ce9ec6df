"""``claim-ccp``: claim-conditioned probability (Fadeeva et al., 2024), docs/claims.md "CCP".

At each token of a claim, the greedy token ``w0`` and its top-k alternatives
``w1..wk`` (the record's ``top_logprobs``) are compared by a judge: an
alternative that means the same as ``w0`` is *entailed*, one that does not is
a *contradiction*. The token's CCP is

    P(entailed) / (P(entailed) + P(contradiction))

(``w0`` itself counted as entailed), and the claim's CCP is the product over
its tokens. A function word (:data:`FUNCTION_WORDS`) or a token with no word
characters has CCP 1, as in the paper. This is lm-polygraph's
``ClaimConditionedProbabilityClaim`` (``no_context`` mode) formula, which
``tests/test_claims_polygraph.py`` checks given the same decisions.

The judge (``judge``): ``llm`` (default) asks the model itself, through the
``llm`` consistency judge, once per direction (``w0``, ``wi``) and (``wi``,
``w0``), the two verdicts combined as lm-polygraph combines NLI: equal verdicts
stand, one "same" makes the pair entailed. Any other consistency judge name
(``lexical``, ``lexical-echo``, ``embedding``) is used the same way. Words that
are equal after stripping punctuation and case are entailed without asking;
an alternative with no word characters is neither (left out of both sums).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.annotation.claims import FUNCTION_WORDS
from candor.annotation.judges import get_consistency_judge
from candor.annotation.text_matching import normalize
from candor.backends.base import LOGPROBS, TOP_LOGPROBS, Backend, Completion
from candor.estimators.claim_base import CLAIM_ESTIMATORS, ClaimContext, ClaimEstimator
from candor.estimators.claim_methods import claim_token_values
from candor.util.errors import CandorError

ENTAIL, CONTRA, NEUTRAL = "entail", "contra", "neutral"


def strip_word(token: str) -> str:
    """A token's word: surrounding spaces and punctuation removed (as lm-polygraph strips before NLI)."""
    return token.strip(string.punctuation + " \n")


def is_functional(token: str) -> bool:
    """Whether a greedy token's alternatives are all counted as entailed (function word or no word)."""
    word = strip_word(token).lower()
    return not word or word in FUNCTION_WORDS


def token_alternatives(answer: Completion) -> list[list[tuple[str, float]]]:
    """Per answer token: the greedy token first, then its stored top-k alternatives, each with its log-prob."""
    if len(answer.top_logprobs) != len(answer.tokens):
        raise CandorError("claim-ccp needs the answer's top-k alternatives at every token (records with top_logprobs)")
    out = []
    for token, lp, top in zip(answer.tokens, answer.logprobs, answer.top_logprobs, strict=True):
        out.append([(token, float(lp))] + [(t, float(v)) for t, v in top.items() if t != token])
    return out


def combine(forward: str, backward: str) -> str:
    """Two directional verdicts into one (lm-polygraph's rule)."""
    if forward == backward:
        return forward
    if {forward, backward} == {ENTAIL, CONTRA}:
        return NEUTRAL
    return ENTAIL if ENTAIL in (forward, backward) else (CONTRA if CONTRA in (forward, backward) else NEUTRAL)


def token_ccp_log(alternatives: Sequence[tuple[str, float]], decisions: Sequence[str]) -> float:
    """log CCP of one token: ``decisions[i]`` for alternative i (``decisions[0]``, the greedy token, is entailed)."""
    entail = [lp for (_, lp), d in zip(alternatives, decisions, strict=True) if d == ENTAIL]
    contra = [lp for (_, lp), d in zip(alternatives, decisions, strict=True) if d == CONTRA]
    return float(np.logaddexp.reduce(entail) - np.logaddexp.reduce(entail + contra))


@CLAIM_ESTIMATORS.register("claim-ccp")
class ClaimCCP(ClaimEstimator):
    """Product over the claim's tokens of P(entailed) / (P(entailed) + P(contradiction))."""

    name = "claim-ccp"
    requires = frozenset({LOGPROBS, TOP_LOGPROBS})

    def __init__(
        self, judge: str = "llm", backend: Backend | None = None, judge_backend: Backend | None = None
    ) -> None:
        judge_backend = judge_backend or backend
        if judge == "llm" and judge_backend is None:
            raise CandorError("claim-ccp's default judge is the model itself: pass backend= (or judge='lexical')")
        options: dict[str, Any] = {"backend": judge_backend, "style": "candor"} if judge == "llm" else {}
        self.judge = get_consistency_judge(judge, **options)
        self.judge_name = judge
        self.asked = 0  # pairs sent to the judge (for cost reports)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "judge": self.judge.describe()}

    def decisions(self, contexts: Sequence[ClaimContext]) -> list[list[list[str]]]:
        """Per context, per answer token, the decision for each alternative (index 0: the greedy token)."""
        alts = [token_alternatives(ctx.answer) for ctx in contexts]
        wanted = [sorted({t for c in ctx.claims for t in c.tokens}) for ctx in contexts]
        pairs: dict[tuple[str, str], str] = {}
        for ctx_alts, positions in zip(alts, wanted, strict=True):
            for t in positions:
                if t < len(ctx_alts) and not is_functional(ctx_alts[t][0][0]):
                    w0 = strip_word(ctx_alts[t][0][0])
                    for w, _ in ctx_alts[t][1:]:
                        wi = strip_word(w)
                        if wi and normalize(wi) != normalize(w0):
                            pairs.setdefault((w0, wi), "")
                            pairs.setdefault((wi, w0), "")
        keys = list(pairs)
        verdicts = self.judge.judge([a for a, _ in keys], [b for _, b in keys]) if keys else []
        self.asked += len(keys)
        verdict = {k: (ENTAIL if v else CONTRA) for k, v in zip(keys, verdicts, strict=True)}
        return [[self._token_decisions(a, verdict) for a in ctx_alts] for ctx_alts in alts]

    @staticmethod
    def _token_decisions(alternatives: Sequence[tuple[str, float]], verdict: dict[tuple[str, str], str]) -> list[str]:
        if is_functional(alternatives[0][0]):
            return [ENTAIL] * len(alternatives)
        w0 = strip_word(alternatives[0][0])
        out = [ENTAIL]
        for w, _ in alternatives[1:]:
            wi = strip_word(w)
            if not wi:
                out.append(NEUTRAL)
            elif normalize(wi) == normalize(w0):
                out.append(ENTAIL)
            else:
                out.append(combine(verdict.get((w0, wi), NEUTRAL), verdict.get((wi, w0), NEUTRAL)))
        return out

    def _estimate(self, contexts: Sequence[ClaimContext], backend: Backend | None) -> list[np.ndarray]:
        decisions = self.decisions(contexts)
        out = []
        for ctx, ctx_decisions in zip(contexts, decisions, strict=True):
            alts = token_alternatives(ctx.answer)
            logs = [token_ccp_log(a, d) if a else 0.0 for a, d in zip(alts, ctx_decisions, strict=True)]
            out.append(np.array([np.exp(np.sum(v)) for v in claim_token_values(ctx, logs, "CCP")]))
        return out
