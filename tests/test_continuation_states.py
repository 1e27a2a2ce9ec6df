"""``continuation_hidden_states``: a prompt's continuations share one run of the prompt, same numbers as before.

The reference is the computation EigenScore used before (``hidden_states`` on
every joined ``prompt + sample`` text, :func:`hidden_states_one_by_one`).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import BlackBox

from candor.annotation.prompts import TEMPLATES, record_prompts
from candor.annotation.records import Record
from candor.backends.base import (
    CONTINUATION_STATES,
    backend_capabilities,
    continuation_hidden_states,
    hidden_states_one_by_one,
)
from candor.backends.engine import continuation_states
from candor.data.items import QAItem
from candor.estimators.eigenscore import eigenscore
from candor.util.errors import CandorError

FEWSHOT = TEMPLATES.get("fewshot")

# Tails of every shape: equal, different lengths, one merging with the prompt's last token
# (no leading space), an empty one, a multi-line one.
SAMPLES = [
    ["Paris", "Paris", "Paris"],
    ["Paris", "Rome", "a long and different answer with more tokens"],
    ["Paris"],
    ["s", "", "x\ny"],
]


def prompts_for(backend, n: int) -> list[str]:
    items = [
        QAItem(id=f"q{i}", dataset="toy", split="test", question=f"What is fact number {i}?", answers=("Paris",))
        for i in range(n)
    ]
    return [FEWSHOT(item, backend) for item in items]


def assert_same_states(got, want, atol):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=atol, rtol=0)


@pytest.mark.parametrize("layer", [0, 1, -1])
def test_states_equal_the_joined_texts_on_the_tiny_model(tiny_backend, layer):
    prompts = prompts_for(tiny_backend, len(SAMPLES))
    assert CONTINUATION_STATES in backend_capabilities(tiny_backend)
    got = continuation_hidden_states(tiny_backend, prompts, SAMPLES, layer=layer)
    want = hidden_states_one_by_one(tiny_backend, prompts, SAMPLES, layer=layer)
    assert_same_states(got, want, atol=1e-5)
    # The path for attention kernels without 4-D masks.
    repeated = continuation_states.continuation_hidden_states(tiny_backend, prompts, SAMPLES, layer, strategy="repeat")
    assert_same_states(repeated, want, atol=1e-5)
    # A black box with hidden states goes through hidden_states itself: same numbers exactly.
    fallback = continuation_hidden_states(BlackBox(tiny_backend), prompts, SAMPLES, layer=layer)
    assert_same_states(fallback, want, atol=0)


def test_prompts_split_over_several_packed_batches(tiny_backend, monkeypatch):
    monkeypatch.setattr(continuation_states, "MAX_BATCH_TOKENS", 40)  # a row or two per pass
    prompts = prompts_for(tiny_backend, len(SAMPLES))
    got = continuation_hidden_states(tiny_backend, prompts, SAMPLES, layer=1)
    assert_same_states(got, hidden_states_one_by_one(tiny_backend, prompts, SAMPLES, layer=1), atol=1e-5)


def test_a_single_prompt_and_prompts_without_a_shared_prefix(tiny_backend):
    prompts = ["Hello there, what is the capital of France? Answer:", "Name a colour:"]
    samples = [[" Paris", " Lyon"], [" red", " a very deep blue", " red"]]
    for ps, ss in ((prompts[:1], samples[:1]), (prompts, samples)):
        got = continuation_hidden_states(tiny_backend, ps, ss, layer=1)
        assert_same_states(got, hidden_states_one_by_one(tiny_backend, ps, ss, layer=1), atol=1e-5)


def test_a_prompt_without_continuations_and_bad_input(tiny_backend):
    prompts = prompts_for(tiny_backend, 2)
    got = continuation_hidden_states(tiny_backend, prompts, [[], ["Paris", "Rome"]], layer=1)
    assert got[0].shape == (0, tiny_backend.model.config.hidden_size) and got[1].shape[0] == 2
    with pytest.raises(CandorError, match="2 prompts but 1 lists"):
        continuation_hidden_states(tiny_backend, prompts, [["Paris"]])
    with pytest.raises(CandorError, match="layer 7 is out of range"):
        continuation_hidden_states(tiny_backend, prompts, [["Paris"], ["Rome"]], layer=7)
    with pytest.raises(CandorError, match="unknown strategy 'tree'"):
        continuation_states.continuation_hidden_states(tiny_backend, prompts, [["Paris"], ["Rome"]], strategy="tree")


def eigenscore_confidences(states) -> np.ndarray:
    return np.array([1 / (1 + np.exp(eigenscore(s))) for s in states])


def test_eigenscore_equals_the_old_computation_on_real_records(shared_data, smollm_dir, tmp_path):
    """Real HonestyBench questions, samples drawn by the embedded model: confidences within 1e-5."""
    from candor.annotation.builder import AnnotateConfig, annotate
    from candor.annotation.records import read_records
    from candor.backends.base import SamplingParams
    from candor.backends.hf import HFBackend
    from candor.data.loaders import load_items
    from candor.estimators import get_estimator

    backend = HFBackend.from_pretrained(str(smollm_dir), batch_size=8)
    items = load_items("nq", data_dir=shared_data / "honestybench", limit=4)
    path = tmp_path / "nq.jsonl"
    annotate(
        items, backend, path, FEWSHOT, AnnotateConfig(k=5, params=SamplingParams(max_new_tokens=12)), progress=False
    )
    records: list[Record] = read_records(path)
    layer = (backend.model.config.num_hidden_layers + 1) // 2
    prompts, _ = record_prompts(records, backend)
    samples = [[s.text for s in r.samples] for r in records]
    old = eigenscore_confidences(hidden_states_one_by_one(backend, prompts, samples, layer=layer))
    new = get_estimator("eigenscore").estimate(records, backend)
    np.testing.assert_allclose(new, old, atol=1e-5, rtol=0)
    assert len({round(float(v), 6) for v in new}) > 1  # real, differing values, not a constant
