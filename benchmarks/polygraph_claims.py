"""lm-polygraph's claim estimators on claims candor made: run under lm-polygraph's own venv.

Reads a JSON job on stdin, writes lm-polygraph's values on stdout. Imports nothing
from candor. Per answer the job gives the model input (prompt and answer token
ids), the answer's token log-probs, each claim's token positions, and for CCP the
token alternatives with the entailment decisions candor's judge made (so the
formula is compared given the same decisions). lm-polygraph computes:

- ``MaximumClaimProbability``, ``PerplexityClaim`` from the log-probs;
- ``MaxTokenEntropyClaim`` from the entropies its own ``EntropyCalculator``
  derives from full-vocabulary log-probs, which this script computes with the
  model in this venv (one teacher-forced pass of the float32 model; log-probs in
  float64, as candor's, since float32 log-probs alone drift by ~5e-6 nats);
- ``ClaimConditionedProbabilityClaim`` (``no_context``) from the alternatives and
  the decisions, its stopword test given candor's functional-token flags.

    $CANDOR_POLYGRAPH_PYTHON -m benchmarks.polygraph_claims < job.json > out.json

(from the repository root; :func:`benchmarks.polygraph.run_polygraph` runs it so from candor's side).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def entropies(job: dict[str, Any]) -> list[list[float]]:
    """Per answer, lm-polygraph's entropy at each answer token from this venv's model."""
    import torch
    from lm_polygraph.stat_calculators.entropy import EntropyCalculator
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(int(job.get("threads", 1)))
    model = AutoModelForCausalLM.from_pretrained(job["model_path"], dtype=torch.float32).eval()
    log_probs = []
    with torch.no_grad():
        for answer in job["answers"]:
            ids = torch.tensor([answer["prompt_ids"] + answer["answer_ids"]])
            logits = model(ids).logits[0]
            n = len(answer["answer_ids"])
            start = len(answer["prompt_ids"]) - 1
            # float64, as candor computes them: lm-polygraph's float32 log-probs drift by ~5e-6 nats
            # (measured) in its float32 sum over the vocabulary, which is rounding, not the estimator.
            log_probs.append(logits[start : start + n].double().log_softmax(-1).numpy())
    return EntropyCalculator()({"greedy_log_probs": log_probs})["entropy"]


def main() -> None:
    from lm_polygraph.estimators import (
        ClaimConditionedProbabilityClaim,
        MaximumClaimProbability,
        MaxTokenEntropyClaim,
        PerplexityClaim,
    )
    from lm_polygraph.stat_calculators.extract_claims import Claim

    job = json.load(sys.stdin)
    answers = job["answers"]
    claims = [[Claim(claim_text="", sentence="", aligned_token_ids=list(t)) for t in a["claims"]] for a in answers]
    stats: dict[str, Any] = {"claims": claims, "greedy_log_likelihoods": [a["logprobs"] for a in answers]}
    out: dict[str, Any] = {
        "MaximumClaimProbability": MaximumClaimProbability()(stats),
        "PerplexityClaim": PerplexityClaim()(stats),
    }
    if job.get("model_path"):
        stats["entropy"] = entropies(job)
        out["MaxTokenEntropyClaim"] = MaxTokenEntropyClaim()(stats)
    if all("alternatives" in a for a in answers):
        functional = {(i, t) for i, a in enumerate(answers) for t, f in enumerate(a["functional"]) if f}
        # lm-polygraph asks its stopword test about the greedy token's text; the texts are made unique
        # per (answer, position) so the test can answer with candor's flag for that token.
        alternatives, nli = [], []
        for i, a in enumerate(answers):
            alternatives.append(
                [
                    [(f"{i}:{t}:{w}" if k == 0 else w, lp) for k, (w, lp) in enumerate(alts)]
                    for t, alts in enumerate(a["alternatives"])
                ]
            )
            nli.append([square(d) for d in a["decisions"]])

        def is_stopword(text: str) -> bool:
            i, t, _ = text.split(":", 2)
            return (int(i), int(t)) in functional

        ccp = ClaimConditionedProbabilityClaim(nli_context="no_context", is_stopword=is_stopword)
        stats["greedy_tokens_alternatives"] = alternatives
        stats["greedy_tokens_alternatives_nli"] = nli
        out["ClaimConditionedProbabilityClaim"] = ccp(stats)
    json.dump({k: [[float(x) for x in row] for row in v] for k, v in out.items()}, sys.stdout)


def square(decisions: list[str]) -> list[list[str]]:
    """The NLI matrix lm-polygraph reads: row 0 and column 0 hold each alternative's decision."""
    n = len(decisions)
    matrix = [["" for _ in range(n)] for _ in range(n)]
    for i, d in enumerate(decisions):
        matrix[0][i] = d
        matrix[i][0] = d
    return matrix


if __name__ == "__main__":
    main()
