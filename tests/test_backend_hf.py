"""The hf backend: its decode loop against transformers' own generate and forward passes."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from candor.backends import BACKENDS, load_backend
from candor.backends.base import SamplingParams
from candor.backends.engine import StopMatcher, sample_tokens
from candor.backends.hf import HFBackend
from candor.backends.tokens import pad_batch, positions_from_mask, shared_prefix_length
from candor.util.errors import CandorError

SHOTS = "Question: What is the largest planet?\nAnswer: Jupiter\nQuestion: Who painted the Mona Lisa?\nAnswer:"
PROMPTS = [
    f"{SHOTS} Leonardo\nQuestion: Why is the sky blue?\nAnswer:",
    f"{SHOTS} Leonardo\nQuestion: Name a prime number larger than one hundred and twenty?\nAnswer:",
    "Hello",
    f"{SHOTS} da Vinci\nQuestion: 2+2?\nAnswer:",
]
NO_STOP = SamplingParams(max_new_tokens=10, stop=())


@pytest.fixture()
def backend(lively_model, tokenizer):
    return HFBackend(lively_model, tokenizer, batch_size=4, model_name="lively")


def reference_greedy(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """transformers' own greedy decoding of a left-padded batch, cut at EOS."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    eos = model.generation_config.eos_token_id
    rows = []
    for row in out[:, batch["input_ids"].shape[1] :].tolist():
        rows.append(row[: row.index(eos)] if eos in row else row)
    return rows


def full_logprobs(model, tokenizer, text_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([text_ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


# ------------------------------------------------------------------- greedy


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_greedy_matches_transformers_generate_single(backend, lively_model, tokenizer, prompt):
    [gen] = backend.generate([prompt], 0, NO_STOP)
    [expected] = reference_greedy(lively_model, tokenizer, [prompt], NO_STOP.max_new_tokens)
    assert gen.greedy.token_ids == expected
    assert gen.samples == []


def test_greedy_matches_transformers_generate_batch(backend, lively_model, tokenizer):
    # Different lengths, more prompts than batch_size, some sharing a long prefix.
    prompts = PROMPTS + ["The weather today is", PROMPTS[0]]
    gens = backend.generate(prompts, 0, NO_STOP)
    expected = reference_greedy(lively_model, tokenizer, prompts, NO_STOP.max_new_tokens)
    assert [g.greedy.token_ids for g in gens] == expected


def test_sliding_window_model_matches_transformers_generate(tokenizer):
    # Gemma-3 style: a sliding-window layer (window 8, shorter than the prompts) and a full one.
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )
    model = Gemma3ForCausalLM(config).eval()
    backend = HFBackend(model, tokenizer, batch_size=2)
    prompts = [PROMPTS[0], PROMPTS[1], "The weather today is"]
    gens = backend.generate(prompts, 2, NO_STOP, seeds=[5, 1, 7])
    expected = reference_greedy(model, tokenizer, prompts, NO_STOP.max_new_tokens)
    assert [g.greedy.token_ids for g in gens] == expected
    assert max(len(set(t)) for t in expected) > 2  # not one token repeated
    alone = backend.generate(prompts[1:2], 2, NO_STOP, seeds=[1])[0]
    assert [s.token_ids for s in alone.samples] == [s.token_ids for s in gens[1].samples]


def test_shared_prefix_path_equals_plain_path(backend):
    # The first three prompts share the few-shot block; "Hello" disables sharing.
    shared = backend.generate(PROMPTS[:2] + PROMPTS[3:], 2, NO_STOP, seeds=[1, 2, 3])
    plain = [
        backend.generate([p], 2, NO_STOP, seeds=[s])[0]
        for p, s in zip(PROMPTS[:2] + PROMPTS[3:], [1, 2, 3], strict=True)
    ]
    assert shared_prefix_length([backend.encode([p])[0] for p in PROMPTS[:2]]) > 8
    for a, b in zip(shared, plain, strict=True):
        assert a.greedy.token_ids == b.greedy.token_ids
        assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]


def test_greedy_logprobs_equal_full_forward(backend, lively_model, tokenizer):
    gens = backend.generate(PROMPTS[:2], 1, NO_STOP)
    for prompt, gen in zip(PROMPTS[:2], gens, strict=True):
        for completion in (gen.greedy, gen.samples[0]):
            prompt_ids = backend.encode([prompt])[0]
            logprobs = full_logprobs(lively_model, tokenizer, prompt_ids + completion.token_ids)
            expected = [logprobs[len(prompt_ids) - 1 + i, tok].item() for i, tok in enumerate(completion.token_ids)]
            np.testing.assert_allclose(completion.logprobs, expected, atol=1e-4)


def test_max_new_tokens_is_respected(backend):
    params = SamplingParams(max_new_tokens=3, stop=())
    gens = backend.generate(PROMPTS, 2, params)
    lengths = {len(c.token_ids) for g in gens for c in [g.greedy, *g.samples]}
    assert lengths == {3}
    assert all(len(c.logprobs) == len(c.tokens) == 3 for g in gens for c in g.samples)


# ----------------------------------------------------------------- sampling


def test_same_seeds_give_same_samples_and_other_seeds_differ(backend):
    a = backend.generate(PROMPTS[:2], 4, NO_STOP, seeds=[7, 8])
    b = backend.generate(PROMPTS[:2], 4, NO_STOP, seeds=[7, 8])
    c = backend.generate(PROMPTS[:2], 4, NO_STOP, seeds=[9, 10])
    ids = [[s.token_ids for s in g.samples] for g in a]
    assert ids == [[s.token_ids for s in g.samples] for g in b]
    assert ids != [[s.token_ids for s in g.samples] for g in c]
    # The samples of one prompt differ from each other (independent rows).
    assert len({tuple(t) for t in ids[0]}) > 1


def test_samples_do_not_depend_on_batch_neighbours(backend):
    alone = backend.generate([PROMPTS[1]], 3, NO_STOP, seeds=[42])[0]
    batched = backend.generate(PROMPTS, 3, NO_STOP, seeds=[5, 42, 6, 7])[1]
    assert [s.token_ids for s in batched.samples] == [s.token_ids for s in alone.samples]
    assert batched.greedy.token_ids == alone.greedy.token_ids


def test_finished_rows_leave_without_changing_others(backend):
    params = SamplingParams(max_new_tokens=10, stop=())
    free = backend.generate(PROMPTS[:2], 0, params)
    # A stop string made of the second prompt's second token ends that row early.
    stop_text = backend.decode(free[1].greedy.token_ids[1:2])
    assert stop_text.strip() and stop_text not in backend.decode(free[0].greedy.token_ids)
    stopping = SamplingParams(max_new_tokens=10, stop=(stop_text,))
    both = backend.generate(PROMPTS[:2], 3, stopping, seeds=[1, 2])
    alone = backend.generate(PROMPTS[:1], 3, stopping, seeds=[1])[0]
    assert len(both[1].greedy.token_ids) == 1  # left the batch after its second step
    assert len(both[0].greedy.token_ids) == 10
    assert both[0].greedy.token_ids == alone.greedy.token_ids
    assert [s.token_ids for s in both[0].samples] == [s.token_ids for s in alone.samples]
    for got, expected in zip(both[0].samples, alone.samples, strict=True):
        np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-4)


def test_refilling_the_running_batch_changes_nothing(lively_model, tokenizer):
    # batch_size=1 prefills one prompt at a time and merges it into the rows still running
    # (caches of different lengths, left-padded); batch_size=8 runs all prompts as one chunk.
    params = SamplingParams(max_new_tokens=8, stop=("e",))  # a common letter: rows end at various steps
    prompts = PROMPTS + ["The weather today is"]
    one = HFBackend(lively_model, tokenizer, batch_size=1).generate(prompts, 3, params, seeds=[1, 2, 3, 4, 5])
    big = HFBackend(lively_model, tokenizer, batch_size=8).generate(prompts, 3, params, seeds=[1, 2, 3, 4, 5])
    for a, b in zip(one, big, strict=True):
        assert a.greedy.token_ids == b.greedy.token_ids
        assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]
        for x, y in zip([a.greedy, *a.samples], [b.greedy, *b.samples], strict=True):
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)
    lengths = {len(c.token_ids) for g in one for c in [g.greedy, *g.samples]}
    assert len(lengths) > 1  # rows really finished at different steps


def test_sample_tokens_hand_computed():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]]))
    nucleus = SamplingParams(temperature=1.0, top_p=0.8, top_k=0)
    # Kept: 0.5 and 0.3 (the mass above 0.15 is already 0.8), renormalized to 0.625 / 0.375.
    assert sample_tokens(logits, torch.tensor([0.6]), nucleus).tolist() == [1]
    assert sample_tokens(logits, torch.tensor([0.63]), nucleus).tolist() == [3]
    assert sample_tokens(logits, torch.tensor([0.999]), nucleus).tolist() == [3]
    top1 = SamplingParams(temperature=1.0, top_p=1.0, top_k=1)
    assert sample_tokens(logits, torch.tensor([0.99]), top1).tolist() == [1]
    full = SamplingParams(temperature=1.0, top_p=1.0, top_k=50)
    # Cumulative order 0.5, 0.8, 0.95, 1.0 → u=0.9 falls on the third-ranked token.
    assert sample_tokens(logits, torch.tensor([0.9]), full).tolist() == [2]
    # A high temperature flattens: ranks 0.5/0.3 become closer than at temperature 1.
    hot = SamplingParams(temperature=100.0, top_p=1.0, top_k=2)
    assert sample_tokens(logits, torch.tensor([0.49]), hot).tolist() == [1]
    assert sample_tokens(logits, torch.tensor([0.51]), hot).tolist() == [3]


def test_temperature_zero_samples_are_greedy(backend):
    params = SamplingParams(max_new_tokens=6, temperature=0.0, stop=())
    [gen] = backend.generate(PROMPTS[:1], 2, params)
    assert all(s.token_ids == gen.greedy.token_ids for s in gen.samples)


# -------------------------------------------------------------------- stops


def test_stop_string_cuts_text_and_drops_the_stop_token(backend):
    [free] = backend.generate(PROMPTS[:1], 0, NO_STOP)
    ids = free.greedy.token_ids
    stop_text = backend.decode(ids[3:4])
    assert stop_text.strip()
    [cut] = backend.generate(PROMPTS[:1], 0, SamplingParams(max_new_tokens=10, stop=(stop_text,)))
    first = next(i for i in range(len(ids)) if stop_text in backend.decode(ids[: i + 1]))
    assert cut.greedy.token_ids == ids[:first]
    assert cut.greedy.logprobs == pytest.approx(free.greedy.logprobs[:first], abs=1e-5)
    # The dropped stop token's log-prob is kept aside (an answer that is only a stop weighs it).
    assert cut.greedy.stop_logprob == pytest.approx(free.greedy.logprobs[first], abs=1e-5)
    assert free.greedy.finish_reason != "length" or free.greedy.stop_logprob is None
    full_text = backend.decode(ids[: first + 1])
    assert cut.greedy.text == full_text[: full_text.find(stop_text)].strip()


def test_stop_string_spanning_tokens_is_found(tokenizer):
    vocab = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    ids = tokenizer(" Paris is", add_special_tokens=False)["input_ids"]
    assert len(ids) == 2
    matcher = StopMatcher(tokenizer, vocab, ["s i"])  # last letter of one token, first of the next
    assert ids[0] not in matcher.token_ids and ids[1] not in matcher.token_ids
    assert not matcher.hit(ids[:1])
    assert matcher.hit(ids)
    assert matcher.cut(" Paris is") == " Pari"
    newline = StopMatcher(tokenizer, vocab, ["\n"])
    assert newline.tail_tokens == 0  # a one-character ASCII stop is a pure set lookup
    assert newline.hit(tokenizer("Paris\n", add_special_tokens=False)["input_ids"])


# ------------------------------------------------------------------ scoring


def test_score_equals_manual_forward(backend, lively_model, tokenizer):
    prompts = [PROMPTS[0], "Hello", PROMPTS[1], PROMPTS[3], "Hi there"]
    continuations = [" Rayleigh scattering", " world", " 101", " 4", ""]
    scores = backend.score(prompts, continuations)
    for prompt, cont, got in zip(prompts, continuations, scores, strict=True):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        cont_ids = tokenizer(prompt + cont, add_special_tokens=False)["input_ids"][len(prompt_ids) :]
        logprobs = full_logprobs(lively_model, tokenizer, prompt_ids + cont_ids)
        expected = [logprobs[len(prompt_ids) - 1 + i, t].item() for i, t in enumerate(cont_ids)]
        assert len(got) == len(cont_ids)
        np.testing.assert_allclose(got, expected, atol=1e-4)


def test_next_token_logprobs_match_manual_forward(backend, lively_model, tokenizer):
    prompts = PROMPTS + ["The weather"]
    columns = [tokenizer(" A", add_special_tokens=False)["input_ids"][0], 5, 100, 2]
    got = backend.next_token_logprobs(prompts, columns)
    assert got.shape == (len(prompts), len(columns))
    for row, prompt in zip(got, prompts, strict=True):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        expected = full_logprobs(lively_model, tokenizer, ids)[-1, columns].numpy()
        np.testing.assert_allclose(row, expected, atol=1e-4)


@pytest.mark.parametrize("layer", [-1, 0, 1])
def test_hidden_states_under_left_padding_equal_single_prompt(backend, lively_model, tokenizer, layer):
    got = backend.hidden_states(PROMPTS + ["Hi"], layer=layer)
    assert got.shape == (len(PROMPTS) + 1, lively_model.config.hidden_size)
    for row, prompt in zip(got, PROMPTS + ["Hi"], strict=True):
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        with torch.inference_mode():
            expected = lively_model(input_ids=ids, output_hidden_states=True).hidden_states[layer][0, -1]
        np.testing.assert_allclose(row, expected.numpy(), atol=1e-4)


def test_hidden_states_layer_out_of_range(backend):
    with pytest.raises(CandorError, match="layer 7"):
        backend.hidden_states(["Hi"], layer=7)


# --------------------------------------------------------------- utilities


def test_left_pad_and_positions():
    ids, mask = pad_batch([[5, 6, 7], [8], []], pad_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert positions_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 0]]
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3], [1, 2, 9, 9]]) == 2
    assert shared_prefix_length([[1, 2], [1, 2]]) == 1  # each keeps one token to predict from


def test_tokenize_decode_and_render_chat(backend, tokenizer):
    ids = backend.tokenize("Paris is nice")
    assert ids == tokenizer("Paris is nice", add_special_tokens=False)["input_ids"]
    assert backend.decode(ids) == "Paris is nice"
    rendered = backend.render_chat([{"role": "user", "content": "Hi there"}])
    assert "Hi there" in rendered and rendered.endswith("assistant\n")


def test_render_chat_without_template_fails(lively_model, tokenizer):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    backend = HFBackend(lively_model, plain, model_name="tiny")
    with pytest.raises(CandorError, match="no chat template"):
        backend.render_chat([{"role": "user", "content": "Hi"}])


def test_bad_arguments(backend):
    with pytest.raises(CandorError, match="seeds"):
        backend.generate(["a", "b"], 1, NO_STOP, seeds=[1])
    with pytest.raises(CandorError, match="max_new_tokens"):
        backend.generate(["a"], 1, SamplingParams(max_new_tokens=0))
    with pytest.raises(CandorError, match="top_p"):
        backend.generate(["a"], 1, SamplingParams(top_p=0.0))
    with pytest.raises(CandorError, match="temperature"):
        backend.generate(["a"], 1, SamplingParams(temperature=-1.0))
    with pytest.raises(CandorError, match="batch_size"):
        HFBackend(backend.model, backend.tokenizer, batch_size=0)
    with pytest.raises(CandorError, match="dtype"):
        HFBackend.from_pretrained("smollm2-135m", dtype="float8")
    with pytest.raises(CandorError, match="continuations"):
        backend.score(["a"], [])
    assert backend.generate([], 3, NO_STOP) == []


# ------------------------------------------------------------------ loading


@pytest.mark.parametrize("name", ["no-such-org/no-such-model-xyz", "/no/such/model/dir"])
def test_unknown_model_fails_clearly(name):
    with pytest.raises(CandorError, match="candor loads local files only") as info:
        HFBackend.from_pretrained(name)
    message = str(info.value)
    # both ways to get a model, and not transformers' advice to check an internet connection candor never uses
    assert name in message and "--model PATH" in message and f"huggingface-cli download {name}" in message
    assert "internet" not in message


def test_registry_and_load_backend(tmp_path):
    assert "hf" in BACKENDS
    with pytest.raises(CandorError, match="unknown backend 'nope'"):
        load_backend("smollm2-135m", backend="nope")
    with pytest.raises(CandorError, match="no-such"):
        load_backend(str(tmp_path / "no-such"))


def test_missing_adapter_fails_clearly(smollm_dir, tmp_path):
    with pytest.raises(CandorError, match="adapter_config.json"):
        HFBackend.from_pretrained(str(smollm_dir), adapter=str(tmp_path))


def test_adapter_is_loaded_and_merged(lively_model, tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(lively_model)
    lora = get_peft_model(
        copy.deepcopy(lively_model), LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    )
    lora.save_pretrained(tmp_path / "adapter")
    base.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    backend = HFBackend.from_pretrained(str(tmp_path / "base"), adapter=str(tmp_path / "adapter"))
    ids = tokenizer("Hello there", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        expected = torch.log_softmax(lora(input_ids=ids).logits[0, -1], -1)
        plain = torch.log_softmax(base(input_ids=ids).logits[0, -1], -1)
    got = backend.next_token_logprobs(["Hello there"], [0, 1, 2, 3])[0]
    np.testing.assert_allclose(got, expected[:4].numpy(), atol=1e-4)
    assert not np.allclose(got, plain[:4].numpy(), atol=1e-4)


# -------------------------------------------------------------- integration


@pytest.mark.integration
def test_embedded_model_answers_easy_questions():
    from candor.annotation.prompts import TEMPLATES
    from candor.data.items import QAItem

    backend = HFBackend.from_pretrained("smollm2-135m")
    template = TEMPLATES.get("fewshot")
    questions = {
        "What is the capital of France?": "Paris",
        "Who wrote Romeo and Juliet?": "Shakespeare",
        "What is the chemical symbol for gold?": "Au",
    }
    items = [
        QAItem(id=str(i), dataset="t", split="t", question=q, answers=(a,))
        for i, (q, a) in enumerate(questions.items())
    ]
    params = SamplingParams(max_new_tokens=16, stop=template.stop)
    gens = backend.generate([template(item, backend) for item in items], 2, params)
    for gen, answer in zip(gens, questions.values(), strict=True):
        assert answer in gen.greedy.text
        assert "\n" not in gen.greedy.text and len(gen.samples) == 2
        assert all(lp <= 0 for lp in gen.greedy.logprobs)
    assert gens[0].greedy.text == "Paris"
    assert np.exp(gens[0].greedy.logprobs[0]) > 0.5


def test_generate_reports_finish_reason_and_token_counts(backend):
    """Each completion says why it ended and how many tokens the engine generated; each prompt its length."""
    from candor.backends.base import SamplingParams

    prompts = ["Question: a\nAnswer:", "Question: a longer one\nAnswer:"]
    gens = backend.generate(prompts, 2, SamplingParams(max_new_tokens=3), greedy=True, seeds=[1, 2])
    for prompt, g in zip(prompts, gens, strict=True):
        assert g.prompt_tokens == len(backend.encode([prompt])[0])
        for c in [g.greedy, *g.samples]:
            assert c.finish_reason in {"stop", "length"}
            # A row that hit the cap keeps all its tokens; one that ended on EOS/stop dropped the last one.
            if c.finish_reason == "length":
                assert c.completion_tokens == len(c.token_ids) == 3
            else:
                assert c.completion_tokens == len(c.token_ids) + 1


REPEAT_FIRST_CALL = """
import sys

import torch

from candor.annotation.prompts import TEMPLATES
from candor.backends.base import SamplingParams
from candor.backends.hf import HFBackend
from candor.data.loaders import load_named

torch.set_num_threads(2)  # as the benchmarks do
backend = HFBackend.from_pretrained("smollm2-135m", batch_size=16)
items = load_named("nq", data_dir=sys.argv[1], limit=16)
prompts = [TEMPLATES.get("fewshot")(item, backend) for item in items]
params = SamplingParams(max_new_tokens=32, temperature=1.0, top_p=0.95, top_k=50, stop=("\\n",))
first, second = (backend.generate(prompts, 5, params) for _ in range(2))
print(max(
    abs(p - q)
    for a, b in zip(first, second)
    for x, y in zip([a.greedy, *a.samples], [b.greedy, *b.samples])
    for p, q in zip(x.logprobs, y.logprobs)
))
"""


@pytest.mark.slow  # over a minute on 2 shared cores (make test-slow)
def test_the_first_generate_call_of_a_process_repeats_exactly(shared_data):
    """A process's first call drifted from its second (up to 2e-4) in about a third of fresh processes
    running the annotation benchmark's job (HFBackend._warm_up): so a few fresh processes are tried."""
    import subprocess
    import sys

    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", REPEAT_FIRST_CALL, str(shared_data / "honestybench")],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert float(done.stdout.strip().splitlines()[-1]) == 0.0
