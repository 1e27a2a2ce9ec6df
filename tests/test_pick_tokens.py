"""``pick_tokens``' one shared partial sort: the numbers of separate passes, and a row's own whatever its neighbours."""

from __future__ import annotations

import pytest
import torch

from candor.backends.base import SamplingParams
from candor.backends.engine.sampling import SHARED_TOP, pick_tokens, sample_tokens

VOCAB = 3000


def separate_passes(logits, samplers, top_logprobs):
    """The reference: argmax for greedy rows, each sampler's own top-k, a separate top-k for the log-probs."""
    tokens = logits.argmax(dim=-1)
    for params, rows, uniforms in samplers:
        index = torch.tensor(rows)
        tokens[index] = sample_tokens(logits[index], torch.tensor(uniforms), params)
    log_z = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(1, tokens.unsqueeze(1)).squeeze(1) - log_z
    top = None
    if top_logprobs:
        values, ids = logits.topk(top_logprobs, dim=-1)
        top = (ids.tolist(), (values - log_z.unsqueeze(1)).tolist())
    return tokens, chosen, top


def random_logits(seed: int, rows: int = 24) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=generator) * 3


def uniforms_for(rows: list[int], seed: int) -> list[float]:
    return torch.rand(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()


SETTINGS = [
    SamplingParams(temperature=1.0, top_p=0.95, top_k=50),
    SamplingParams(temperature=0.7, top_p=1.0, top_k=5),
    SamplingParams(temperature=1.0, top_p=0.9, top_k=0),  # the whole vocabulary: its rows sort apart
    SamplingParams(temperature=1.0, top_p=1.0, top_k=SHARED_TOP + 1),  # above the shared sort
]


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"top_k={p.top_k}")
@pytest.mark.parametrize("top_logprobs", [0, 5, SHARED_TOP + 6])
def test_equal_to_separate_passes(params, top_logprobs):
    rows = list(range(4, 24))
    for seed in range(5):
        logits = random_logits(seed)
        got = pick_tokens(logits, [(params, rows, uniforms_for(rows, seed))], top_logprobs)
        want = separate_passes(logits, [(params, rows, uniforms_for(rows, seed))], top_logprobs)
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[1], want[1])
        assert got[2] == want[2]


def test_two_settings_in_one_step():
    logits = random_logits(7)
    samplers = [(SETTINGS[0], [2, 3, 5], [0.1, 0.5, 0.9]), (SETTINGS[2], [7, 8], [0.3, 0.99])]
    got, want = pick_tokens(logits, samplers, 5), separate_passes(logits, samplers, 5)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == want[2]


def tied_logits(seed: int) -> torch.Tensor:
    return random_logits(seed).round()  # hundreds of equal logits per row, inside and across every top-k


def test_a_rows_tokens_do_not_depend_on_its_neighbours_settings_even_with_ties():
    # The order a sort gives equal logits depends on how many it keeps: a sort sized by
    # the settings in the batch would let a request's samples depend on the others'.
    rows = list(range(0, 12))
    for seed in range(4):
        logits = tied_logits(seed)
        alone = pick_tokens(logits, [(SETTINGS[0], rows, uniforms_for(rows, seed))], 5)
        others = [(SETTINGS[1], [12, 13], [0.2, 0.7]), (SETTINGS[3], [14, 15], [0.4, 0.6])]
        mixed = pick_tokens(logits, [(SETTINGS[0], rows, uniforms_for(rows, seed)), *others], 20)
        assert torch.equal(alone[0][:12], mixed[0][:12])
        assert torch.equal(alone[1][:12], mixed[1][:12])
        assert [ids[:5] for ids in mixed[2][0][:12]] == alone[2][0][:12]


def test_tied_best_logits_take_argmax_first_index():
    logits = random_logits(3)
    best = logits.max(dim=-1).values
    for row in range(logits.shape[0]):  # the best logit also at a later and an earlier index
        logits[row, 2900] = best[row]
        logits[row, 10] = best[row]
    tokens, _, _ = pick_tokens(logits, [], 5)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    assert (tokens <= 10).all()  # the first index holding the best value
    top_first = logits.topk(SHARED_TOP, dim=-1).indices[:, 0]
    assert not torch.equal(top_first, tokens)  # the sort alone would pick differently
