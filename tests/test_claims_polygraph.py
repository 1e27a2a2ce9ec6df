"""candor's claim estimators equal lm-polygraph's on the same answers and claims (its own venv).

lm-polygraph runs in its own virtual environment (``make polygraph-venv`` builds it; the
environment variable ``CANDOR_POLYGRAPH_PYTHON`` names its python, see benchmarks/polygraph.py)
through benchmarks/polygraph_claims.py; the test skips, naming the make target, when that venv is absent.
The answers come from
the tiny random Llama (its lively variant); lm-polygraph recomputes the entropies with that model in
its venv, and gets CCP's entailment decisions from candor (the formula is compared
given the same decisions).
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.polygraph import ABSENT, polygraph_python, run_polygraph
from candor.annotation.claims import Claim
from candor.backends.base import SamplingParams
from candor.estimators.claim_base import ClaimContext
from candor.estimators.claim_ccp import ClaimCCP, is_functional, token_alternatives
from candor.estimators.claim_scoring import get_claim_estimator

PYTHON = polygraph_python()
pytestmark = pytest.mark.skipif(PYTHON is None, reason=ABSENT)


@pytest.fixture(scope="module")
def lively_dir(lively_model, tokenizer, tmp_path_factory) -> str:
    """The lively tiny Llama (varied, peaked next-token distributions) saved for lm-polygraph's venv to load."""
    folder = tmp_path_factory.mktemp("lively-llama")
    lively_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def contexts(lively_model, tokenizer):
    from candor.backends.hf import HFBackend

    backend = HFBackend(lively_model, tokenizer, batch_size=4)
    prompts = ["Question: who wrote Hamlet?\nAnswer:", "Question: where is Rome?\nAnswer:"]
    gens = backend.generate(prompts, 0, SamplingParams(max_new_tokens=12), greedy=True)
    out = []
    for prompt, gen in zip(prompts, gens, strict=True):
        answer = gen.greedy
        n = len(answer.token_ids)
        assert n >= 6 and len(answer.top_logprobs) == n
        claims = [
            Claim(text="a", start=0, end=1, tokens=list(range(0, n // 2))),
            Claim(text="b", start=1, end=2, tokens=list(range(n // 2, n))),
            Claim(text="c", start=0, end=2, tokens=[1, n - 1]),
        ]
        out.append(ClaimContext(prompt=prompt, question="", answer=answer, claims=claims))
    return backend, out


def test_claim_estimators_equal_lm_polygraph(contexts, lively_dir):
    backend, ctxs = contexts
    ccp = ClaimCCP(judge="lexical")
    decisions = ccp.decisions(ctxs)
    job = {
        "model_path": lively_dir,
        "answers": [
            {
                "prompt_ids": backend.encode([c.prompt])[0],
                "answer_ids": list(c.answer.token_ids),
                "logprobs": list(c.answer.logprobs),
                "claims": [cl.tokens for cl in c.claims],
                "alternatives": token_alternatives(c.answer),
                "decisions": d,
                "functional": [is_functional(t) for t in c.answer.tokens],
            }
            for c, d in zip(ctxs, decisions, strict=True)
        ],
    }
    theirs = run_polygraph(PYTHON, job)

    def mine(name: str, **kw) -> np.ndarray:
        est = ccp if name == "claim-ccp" else get_claim_estimator(name, **kw)
        return np.concatenate(est.estimate(ctxs, backend))

    def flat(name: str) -> np.ndarray:
        return np.concatenate([np.asarray(v, dtype=float) for v in theirs[name]])

    # lm-polygraph's uncertainties against candor's confidences taken back to them (-log for the
    # exponentiated ones: claim probabilities of a random model are ~1e-26, so compare where they differ).
    assert np.max(np.abs(-np.log(mine("claim-prob")) - flat("MaximumClaimProbability"))) <= 1e-6
    assert np.max(np.abs(-np.log(mine("claim-perplexity")) - flat("PerplexityClaim"))) <= 1e-6
    assert np.max(np.abs(-np.log(mine("claim-max-entropy")) - flat("MaxTokenEntropyClaim"))) <= 1e-6
    assert np.max(np.abs(mine("claim-ccp") - (-flat("ClaimConditionedProbabilityClaim")))) <= 1e-6
    assert np.ptp(flat("ClaimConditionedProbabilityClaim")) > 0  # not all 1: some alternatives contradicted
    # and the comparison can fail: a claim shifted by one token no longer matches
    shifted = [
        ClaimContext(
            prompt=c.prompt,
            question="",
            answer=c.answer,
            claims=[Claim(text="a", start=0, end=1, tokens=[t + 1 for t in c.claims[0].tokens])],
        )
        for c in ctxs
    ]
    moved = np.concatenate(get_claim_estimator("claim-prob").estimate(shifted))
    assert np.max(np.abs(-np.log(moved) - flat("MaximumClaimProbability")[[0, 3]])) > 1e-3
