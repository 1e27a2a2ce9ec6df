"""Runs the vllm backend on the embedded model and writes what it produced as JSON (for test_backend_vllm.py).

vLLM starts worker processes, so its engine must be built under ``__main__``:
the test runs this file in a subprocess. Usage: python tests/vllm_worker.py OUT.json [LAYERS]

With ``LAYERS`` (comma-separated, transformers' numbering) the engine also writes those layers' prompt
states from its pass (``prompt_state_layers``); the same calls are made, the greedy call asking for the
states, which are written too, with what the states folder holds after the calls and after ``close``.
"""

from __future__ import annotations

import json
import sys

from candor.backends.base import SamplingParams

PROMPTS = [
    "Question: What is the largest planet in the solar system?\nAnswer: Jupiter\nQuestion: Who wrote Hamlet?\nAnswer:",
    "Question: What is the capital of Italy?\nAnswer:",
    "The capital of France is",
]
CONTINUATIONS = [" William Shakespeare", " Rome", " Paris."]
TOKENS = ["A", " A", "B", " B"]
LABELS = ["0", "5", "9", "10"]  # verbalized-format labels; " 10" is two tokens, so scored as continuations


def main(out: str, layers: str | None = None) -> None:
    from candor.backends.vllm import VLLMBackend
    from candor.verbal.distribution import candidate_distribution

    state_layers = tuple(int(x) for x in layers.split(",")) if layers else None
    backend = VLLMBackend.from_pretrained(
        "smollm2-135m", max_model_len=512, engine_args={"enforce_eager": True}, prompt_state_layers=state_layers
    )
    # Samples at temperature 1 without top-k/top-p: with extraction on, vLLM's CPU engine dies on those
    # (the backend refuses them; docs/backends.md "vLLM's pass on a CPU").
    params = SamplingParams(max_new_tokens=8, top_k=0, top_p=1.0, stop=("\n",))
    gens = backend.generate(PROMPTS, 3, params, greedy=True, seeds=[1, 2, 3], prompt_states=bool(state_layers))
    token_ids = [backend.tokenize(t)[0] for t in TOKENS]
    result = {
        "greedy": [g.greedy.to_dict() for g in gens],
        "samples": [[s.to_dict() for s in g.samples] for g in gens],
        "score": backend.score(PROMPTS, CONTINUATIONS),
        "token_ids": token_ids,
        "next": backend.next_token_logprobs(PROMPTS, token_ids).tolist(),
        "labels": candidate_distribution(backend, PROMPTS, LABELS).tolist(),
    }
    # The same seeds in another batch (reversed, and each prompt alone), and other seeds: per-request seeds.
    reordered = backend.generate(PROMPTS[::-1], 3, params, greedy=False, seeds=[3, 2, 1])[::-1]
    alone = [
        backend.generate([p], 3, params, greedy=False, seeds=[s])[0] for p, s in zip(PROMPTS, [1, 2, 3], strict=True)
    ]
    reseeded = backend.generate(PROMPTS, 3, params, greedy=False, seeds=[101, 102, 103])
    for key, found in (("samples_reordered", reordered), ("samples_alone", alone), ("samples_reseeded", reseeded)):
        result[key] = [[s.to_dict() for s in g.samples] for g in found]
    if state_layers:
        folder = backend.extraction.files.path
        result["states"] = [{str(k): v.tolist() for k, v in g.prompt_states.items()} for g in gens]
        result["left_after_calls"] = sorted(p.name for p in folder.iterdir())
        backend.close()
        result["folder_after_close"] = folder.exists()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
