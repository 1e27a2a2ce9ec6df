"""Claims of list-shaped answers (issue 54 part 6): are list markers ever claims, and does refinement leak?

The embedded model (SmolLM2-135M, its chat template, greedy) answers ten list-shaped prompts
(numbered facts, bullet points, a Markdown list with a heading) as ``candor serve --claims
claim-prob --refine remove`` does (``HonestModel.serve_claims``). For each answer:

- the claims the ``sentence`` decomposer makes, and how many of them are only a list marker,
  numbering, bullet or heading (``marker_only``, must be 0) by a marker grammar written here,
  independent of the splitter's;
- the list items the answer holds (a marker opening a line or a sentence), and claims per item;
- refinement, twice: at the serve default ``--claim-threshold 0.5``, and at each answer's
  median claim value (a fixed rule that removes about half the claims, to exercise partial
  removal; not a recommended threshold): claims kept and removed, removed claims whose words are
  still in the returned text (``leaked``, must be 0; a removed sentence repeated word for word
  in a kept one is counted apart as ``repeated``), lines left holding only markers
  (``orphan_lines``, must be 0), and whether the confidence object the client gets holds any
  claim's text (``text_in_confidence``, must be false).

Before-vs-after the splitter change cannot be measured in one run; the counts above are what the
current splitter does. About 2-4 minutes on 2 CPU cores:

    PYTHONPATH=src python -m benchmarks.claims_lists

Writes benchmarks/results/claims_lists.json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, logger, setup_logging, write_json
from candor.annotation.claim_split import split_claims
from candor.annotation.claims import Claim, refine
from candor.backends import load_backend
from candor.backends.default_model import resolve_embedded
from candor.serve import Decoding, HonestModel
from candor.serve.claim_answers import ClaimPolicy
from candor.util.cpu import describe

MODEL = "smollm2-135m"
OUT = RESULTS / "claims_lists.json"
METHOD = "claim-prob"
SERVE_THRESHOLD = 0.5  # candor serve's default --claim-threshold
PROMPTS = [
    "Tell me three facts about Paris, one per sentence.",
    "List three rivers in Europe as bullet points.",
    "Give me two numbered facts about the Moon.",
    "List four planets of the solar system, one per line, numbered.",
    "Name three famous painters as a bulleted list.",
    "Give three tips for learning a language as a numbered list.",
    "List the three primary colors with a short fact about each.",
    "Write a short Markdown list of three fruits under a heading.",
    "What are three facts about the Great Wall of China? Use bullet points.",
    "List two inventions of the 19th century and who made them, numbered.",
]
# An independent grammar of what is not a claim: markers, numbering, bullets, heading hashes, rules.
MARKER = r"(?:\(?(?:\d{1,3}|[A-Za-z]|[ivxIVX]{2,5})[.)]\)?|[-*+\u2022])"
NOT_A_CLAIM = re.compile(rf"[\s#=*_.;:-]*(?:{MARKER}[\s.;:]*)*")
ITEM = re.compile(rf"(?:^|(?<=[.!?:])[ \t]+)[ \t]*{MARKER}[ \t]+\S", re.M)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args()


def refinement(text: str, claims: list[Claim], values: list[float], threshold: float) -> dict[str, Any]:
    """What ``--refine remove`` at ``threshold`` returns of an answer, and what of it would leak."""
    refined = refine(text, claims, values, threshold, "remove")
    kept_texts = [c.text for c, span in zip(claims, refined.spans, strict=True) if span is not None]
    leaked = repeated = 0
    for claim in refined.removed:
        if claim.text in refined.text:
            if any(claim.text in kept for kept in kept_texts):
                repeated += 1
            else:
                leaked += 1
    orphans = [
        line for line in refined.text.split("\n") if line.split() and all(re.fullmatch(MARKER, t) for t in line.split())
    ]
    return {
        "threshold": threshold,
        "kept": len(claims) - len(refined.removed),
        "removed": len(refined.removed),
        "leaked": leaked,
        "repeated": repeated,
        "orphan_lines": len(orphans),
        "returned": refined.text,
    }


def main() -> int:
    args = parse_args()
    setup_logging()
    backend = load_backend(str(resolve_embedded(MODEL)), "hf", batch_size=4)
    model = HonestModel(
        backend, confidence="n-prob", template="chat", decoding=Decoding(max_new_tokens=args.max_new_tokens)
    )
    model.serve_claims(ClaimPolicy(method=METHOD, refine="remove", threshold=SERVE_THRESHOLD))
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for question in PROMPTS:
        t0 = time.perf_counter()
        served = model.answer(question)
        seconds = time.perf_counter() - t0
        completion = served.completion
        assert completion is not None, f"{question!r}: abstained; the list benchmark needs an answer"
        verdict = served.claims
        if verdict is not None:
            claims, values = verdict.claims, list(verdict.values)
            described = verdict.describe()
            confidence_has_text = any("text" in c for c in [*described["claims"], *described["removed_claims"]])
            confidence_has_text |= any(c.text in json.dumps(described, ensure_ascii=False) for c in claims)
        else:  # one claim or none: served as generated, no claims in the confidence object
            claims = split_claims(completion.text, completion, decode=backend.decode)
            values, confidence_has_text = [], False
        marker_only = [c.text for c in claims if NOT_A_CLAIM.fullmatch(c.text)]
        items = len(ITEM.findall(completion.text))
        row: dict[str, Any] = {
            "question": question,
            "answer": completion.text,
            "list_items": items,
            "claims": [c.text for c in claims],
            "values": values,
            "marker_only": marker_only,
            "text_in_confidence": confidence_has_text,
            "scores_returned_text": served.scores_returned_text,
            "seconds": round(seconds, 2),
        }
        if values:
            row["serve_default"] = refinement(completion.text, claims, values, SERVE_THRESHOLD)
            row["median_rule"] = refinement(completion.text, claims, values, float(np.median(values)))
            row["serve_default"]["served_text_matches"] = served.answer == row["serve_default"]["returned"]
        rows.append(row)
        logger.info("%s: %d items, %d claims, %d marker-only", question, items, len(claims), len(marker_only))
    n_claims = [len(r["claims"]) for r in rows]
    with_items = [r for r in rows if r["list_items"]]
    refined = [r for r in rows if "serve_default" in r]

    def total(rule: str, key: str) -> int:
        return int(sum(r[rule][key] for r in refined))

    summary = {
        "answers": len(rows),
        "answers_with_list_items": len(with_items),
        "list_items": int(sum(r["list_items"] for r in rows)),
        "claims": int(sum(n_claims)),
        "claims_per_answer": round(float(np.mean(n_claims)), 2),
        "claims_per_list_item": round(
            sum(len(r["claims"]) for r in with_items) / sum(r["list_items"] for r in with_items), 2
        )
        if with_items
        else None,
        "marker_only_claims": int(sum(len(r["marker_only"]) for r in rows)),
        "answers_refined": len(refined),
        "text_in_confidence": any(r["text_in_confidence"] for r in rows),
        "scores_returned_text_after_refinement": sorted(
            {r["scores_returned_text"] for r in refined if r["serve_default"]["removed"]}
        ),
        **{
            f"{rule}_{key}": total(rule, key)
            for rule in ("serve_default", "median_rule")
            for key in ("kept", "removed", "leaked", "repeated", "orphan_lines")
        },
        "served_text_matches_refine": all(r["serve_default"]["served_text_matches"] for r in refined),
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_json(
        args.out,
        {
            "what": "claims of list-shaped answers: marker-only claims (must be 0), claims per answer, leaks",
            "command": "PYTHONPATH=src python -m benchmarks.claims_lists",
            "model": MODEL,
            "template": "chat",
            "max_new_tokens": args.max_new_tokens,
            "method": METHOD,
            "decomposer": "sentence",
            "cpu": describe(),
            "summary": summary,
            "answers": rows,
        },
    )
    logger.info("summary: %s", json.dumps(summary))
    return 0 if summary["marker_only_claims"] == 0 and summary["serve_default_leaked"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
