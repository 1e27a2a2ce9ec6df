"""candor's issue-14 estimators against lm-polygraph's implementations, on the same inputs.

lm-polygraph is heavy (spacy, sentence-transformers, ...), so it lives in its
own virtual environment (``--venv``, default ``.polygraph-venv``, as ``make polygraph-venv`` builds it), created
on first use (:mod:`benchmarks.polygraph`: ``python -m venv``, then ``torch==2.13.0``,
the CPU wheel candor uses, so pip does not pull a CUDA build, and ``lm-polygraph==0.7.0``).

The run has three steps, in one file:

1. (candor's venv) read ``--n`` annotated records, score them with candor's
   estimators, and export the exact inputs lm-polygraph's estimators take:
   sample texts and sequence log-probs, candor's similarity matrices and
   directed judge verdicts, the semantic clusters, the greedy answer's
   log-probs and its similarity to each sample, the samples' middle-layer
   embeddings, and the prompt and answer token ids;
2. (lm-polygraph's venv, ``--peer-side``) run lm-polygraph's estimator classes
   on those inputs; for token entropies it runs its own teacher-forced pass
   of the same model with plain transformers and lm-polygraph's
   ``EntropyCalculator``;
3. (candor's venv) map each lm-polygraph uncertainty to a confidence with the
   map candor documents for that estimator and compare, max |difference|
   against a 1e-6 tolerance.

Deliberate differences (reported, not compared within 1e-6):

- ``semantic-entropy``: candor follows Farquhar et al. (2024): length-normalized
  sequence probabilities, cluster masses normalized over the clusters, entropy
  over clusters; lm-polygraph's default is Kuhn et al.'s (2023) Monte Carlo
  estimate -mean_j log Σ_{i in c(j)} p_i with unnormalized sequence
  probabilities. Both run on the same clusters; the rank correlation is reported.
- ``num-sem-sets``: candor counts Kuhn et al.'s greedy clusters (the ones
  semantic entropy uses); lm-polygraph counts connected components of the
  bidirectional-equivalence graph. They differ only where equivalence is not
  transitive; the number of such records is reported.
- token entropies come from two forward passes of the same float32 model (candor's
  backend, one sequence per batch so there is no padding, and plain transformers
  on lm-polygraph's side); their float32 round-off is compared as it is.
- ``token-entropy-max`` and ``prob-margin`` have no sequence-level
  lm-polygraph estimator; the max is checked on lm-polygraph's entropy
  statistic, the margin is not compared.

    PYTHONPATH=src OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m benchmarks.peer_estimators

Writes benchmarks/results/peer_estimators.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from benchmarks.children import script_command, script_env
from benchmarks.polygraph import DEFAULT_VENV, ensure_venv

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-6


# ---------------------------------------------------------------- step 2: lm-polygraph's side


def peer_side(inputs_path: str, out_path: str) -> None:
    """Runs in lm-polygraph's venv: only numpy, transformers and lm_polygraph here."""
    import numpy as np
    import torch
    from lm_polygraph.estimators import (
        CocoaMSP,
        DegMat,
        Eccentricity,
        EigenScore,
        EigValLaplacian,
        KernelLanguageEntropy,
        MeanTokenEntropy,
        MonteCarloSequenceEntropy,
        NumSemSets,
        Perplexity,
        SemanticEntropy,
    )
    from lm_polygraph.stat_calculators.entropy import EntropyCalculator
    from transformers import AutoModelForCausalLM

    data = json.loads(Path(inputs_path).read_text())
    model = AutoModelForCausalLM.from_pretrained(data["model_dir"], dtype=torch.float32).eval()
    out: dict[str, list[float]] = {}

    def put(name: str, value: float) -> None:
        out.setdefault(name, []).append(float(value))

    for rec in data["records"]:
        texts = rec["sample_texts"]
        k = len(texts)
        put("mc-entropy", MonteCarloSequenceEntropy()({"sample_log_probs": [rec["sample_logprobs"]]})[0])
        classes = rec["clusters"]
        class_to_sample = [[j for j in range(k) if classes[j] == c] for c in range(max(classes) + 1)]
        sem = {"class_to_sample": {0: class_to_sample}, "sample_to_class": {0: dict(enumerate(classes))}}
        stats = {"sample_log_probs": [rec["sample_logprobs"]], "sample_texts": [texts], "semantic_classes_entail": sem}
        put("semantic-entropy", SemanticEntropy()(stats)[0])
        put("semantic-entropy-discrete", SemanticEntropy(class_probability_estimation="frequency")(stats)[0])
        verdicts = np.array(rec["verdicts"], dtype=float)
        put(
            "num-sem-sets",
            NumSemSets()(
                {
                    "semantic_matrix_entail": verdicts[None],
                    "semantic_matrix_contra": 1 - verdicts[None],
                    "sample_texts": [texts],
                }
            )[0],
        )
        for sim in ("lexical", "judge"):
            w = np.array(rec["similarity"][sim], dtype=float)
            spectral = {"semantic_matrix_entail": w[None], "sample_texts": [texts]}
            put(f"eigv[{sim}]", EigValLaplacian()(spectral)[0])
            put(f"degree[{sim}]", DegMat()(spectral)[0])
            put(f"eccentricity[{sim}]", Eccentricity()(spectral)[0])
            # entail = W/2 and contra = 1 - W/2 make lm-polygraph's weighted graph E + N/2 exactly W.
            kle = {"semantic_matrix_entail": (w / 2)[None], "semantic_matrix_contra": (1 - w / 2)[None]}
            put(f"kle[{sim}]", KernelLanguageEntropy(scale=False)(kle)[0])
        put(
            "cocoa",
            CocoaMSP()(
                {
                    "greedy_sentence_similarity": [np.array(rec["greedy_similarity"])],
                    "greedy_log_likelihoods": [rec["greedy_logprobs"]],
                }
            )[0],
        )
        put("perplexity", Perplexity()({"greedy_log_likelihoods": [rec["greedy_logprobs"]]})[0])
        put("eigenscore", EigenScore()({"sample_embeddings": [np.array(rec["sample_embeddings"])]})[0])
        ids = torch.tensor([rec["prompt_ids"] + rec["greedy_ids"]])
        n = len(rec["greedy_ids"])
        # The forward candor's backend makes for one unpadded sequence: explicit mask and positions,
        # logits for the last n + 1 positions only; log-softmax in float64 as candor's backend.
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                position_ids=torch.arange(ids.shape[1])[None],
                logits_to_keep=n + 1,
            ).logits[0]
        logp = torch.log_softmax(logits.double(), -1).numpy()
        entropy = EntropyCalculator()({"greedy_log_probs": [logp[:n]]})["entropy"]
        put("token-entropy-mean", MeanTokenEntropy()({"entropy": entropy})[0])
        put("token-entropy-max[entropy stat]", max(entropy[0]))
    Path(out_path).write_text(json.dumps(out))


# ---------------------------------------------------------------- steps 1 and 3: candor's side


# candor's confidence as a function of lm-polygraph's uncertainty (each estimator's documented map).
def _maps():
    import numpy as np

    exp_neg = lambda u: np.exp(-u)  # noqa: E731
    return {
        "mc-entropy": exp_neg,
        "semantic-entropy-discrete": exp_neg,
        "num-sem-sets": lambda u: 1 / u,
        "eigv": lambda u: 1 / u,
        "degree": lambda u: 1 - u,
        "eccentricity": lambda u: 1 / (1 + u),
        "kle": exp_neg,
        "cocoa": exp_neg,
        "perplexity": exp_neg,
        "eigenscore": lambda u: 1 / (1 + np.exp(u)),
        "token-entropy-mean": exp_neg,
        "token-entropy-max": exp_neg,
    }


def export_inputs(records, backend) -> tuple[dict, dict]:
    """lm-polygraph's inputs from candor's machinery, and candor's own confidences."""
    import numpy as np

    from candor.annotation.prompts import record_prompts
    from candor.backends.default_model import resolve_embedded
    from candor.estimators import get_estimator
    from candor.estimators.hidden_layers import middle_layer
    from candor.estimators.semantic import (
        consistency_judge,
        cross_similarities,
        get_similarity,
        semantic_clusters,
        sequence_logprob,
        similarity_matrices,
    )

    groups = [[s.text for s in r.samples] for r in records]
    questions = [r.item.question for r in records]
    judge = consistency_judge("lexical", None)
    sims = {s: similarity_matrices(groups, questions, get_similarity(s)) for s in ("lexical", "judge")}
    clusters = semantic_clusters(groups, questions, judge)
    greedy_sims = cross_similarities([r.greedy.text for r in records], groups, questions, get_similarity("lexical"))
    prompts, _ = record_prompts(records, backend)
    layer = middle_layer(backend)
    exported = []
    for i, rec in enumerate(records):
        texts = groups[i]
        k = len(texts)
        directed = np.eye(k)
        pairs = [(a, b) for a in range(k) for b in range(k) if a != b]
        for (a, b), v in zip(
            pairs, judge.judge([texts[a] for a, _ in pairs], [texts[b] for _, b in pairs]), strict=True
        ):
            directed[a, b] = v
        embeddings = backend.hidden_states([prompts[i] + t for t in texts], layer=layer)
        exported.append(
            {
                "id": rec.id,
                "sample_texts": texts,
                "sample_logprobs": [sequence_logprob(rec, j) for j in range(k)],
                "clusters": clusters[i],
                "verdicts": directed.tolist(),
                "similarity": {s: m[i].tolist() for s, m in sims.items()},
                "greedy_similarity": greedy_sims[i].tolist(),
                "greedy_logprobs": list(rec.greedy.logprobs),
                "sample_embeddings": embeddings.tolist(),
                "prompt_ids": backend.tokenizer(prompts[i])["input_ids"],
                "greedy_ids": list(rec.greedy.token_ids),
            }
        )
    ours: dict[str, list[float]] = {}
    plain = [
        "mc-entropy",
        "semantic-entropy",
        "semantic-entropy-discrete",
        "num-sem-sets",
        "cocoa",
        "perplexity",
        "eigenscore",
        "token-entropy-mean",
        "token-entropy-max",
        "prob-margin",
    ]
    for name in plain:
        est = get_estimator(name)
        ours[name] = est.estimate(records, backend if est.needs_backend else None).tolist()
    for name in ("eigv", "degree", "eccentricity", "kle"):
        for sim in ("lexical", "judge"):
            ours[f"{name}[{sim}]"] = get_estimator(name, similarity=sim).estimate(records).tolist()
    model_dir = str(resolve_embedded(backend.model_name))
    return {"model_dir": model_dir, "records": exported}, ours


def compare(ours: dict, theirs: dict, records: list[dict]) -> dict:
    import numpy as np
    from scipy.stats import spearmanr

    maps = _maps()
    rows = {}
    for key, values in theirs.items():
        name = key.split("[")[0]
        u = np.array(values)
        if key == "token-entropy-max[entropy stat]":
            mine, mapped = np.array(ours["token-entropy-max"]), maps["token-entropy-max"](u)
        elif key == "semantic-entropy":
            mine = np.array(ours[key])
            rho = spearmanr(-np.log(mine), u).statistic
            rows[key] = {
                "compared": False,
                "reason": "deliberate: Farquhar 2024 (length-normalized, normalized over "
                "clusters) vs lm-polygraph's default Kuhn 2023 Monte Carlo estimate",
                "spearman_uncertainty": float(rho),
                "n": len(u),
            }
            continue
        else:
            mine, mapped = np.array(ours[key]), maps[name](u)
        diff = np.abs(mine - mapped)
        row = {
            "compared": True,
            "max_abs_diff": float(diff.max()),
            "within_tolerance": bool(diff.max() <= TOLERANCE),
            "n": len(u),
        }
        if name.startswith("token-entropy"):
            row["max_abs_diff_entropy_nats"] = float(np.abs(-np.log(mine) - u).max())
        if name == "num-sem-sets":
            row["records_differing"] = int((diff > TOLERANCE).sum())
            row["note"] = "deliberate: greedy clusters vs connected components; differ only without transitivity"
        rows[key] = row
    rows["prob-margin"] = {"compared": False, "reason": "lm-polygraph has no sequence-level probability margin"}
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-side", nargs=2, metavar=("INPUTS", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--records", type=Path, default=HERE / "cache" / "mini" / "test" / "nq.jsonl")
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--work", type=Path, default=HERE / "cache" / "peer_estimators")
    p.add_argument("--out", type=Path, default=HERE / "results" / "peer_estimators.json")
    args = p.parse_args()
    if args.peer_side:
        peer_side(*args.peer_side)
        return

    from benchmarks.common import setup_logging, write_json  # here: the peer side runs in a venv without candor
    from candor.annotation.records import read_records
    from candor.backends import load_backend

    setup_logging()
    python = ensure_venv(args.venv)
    records = [r for r in read_records(args.records) if r.samples and r.greedy.token_ids][: args.n]
    backend = load_backend(args.model, batch_size=1)  # no padding: the same forward as lm-polygraph's side
    start = time.perf_counter()
    inputs, ours = export_inputs(records, backend)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "inputs.json").write_text(json.dumps(inputs))
    command = script_command(
        __spec__.name, "--peer-side", str(args.work / "inputs.json"), str(args.work / "theirs.json"), python=python
    )
    subprocess.run(command, check=True, env=script_env())
    theirs = json.loads((args.work / "theirs.json").read_text())
    rows = compare(ours, theirs, inputs["records"])
    version = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('lm-polygraph'))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    payload = {
        "lm_polygraph": version,
        "records": str(args.records),
        "n": len(records),
        "model": args.model,
        "tolerance": TOLERANCE,
        "seconds": time.perf_counter() - start,
        "methods": rows,
    }
    write_json(args.out, payload)
    for key, row in rows.items():
        status = (
            f"max|diff| {row['max_abs_diff']:.2e} {'ok' if row['within_tolerance'] else 'DIFFERS'}"
            if row["compared"]
            else "not compared: " + row["reason"]
        )
        print(f"{key:34s} {status}")


if __name__ == "__main__":
    main()
