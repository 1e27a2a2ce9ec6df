"""A decode step's small ops on one thread: the thread counts it sets, where, and unchanged numbers."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from candor.backends.base import SamplingParams
from candor.backends.engine import op_threads
from candor.backends.engine.decode_loop import DecodeLoop
from candor.backends.engine.op_threads import all_threads, narrow, openmp_runtime, small_ops_on_one_thread, widen
from candor.backends.engine.packed_linear import PackedLayer, PackedLinears, packing_available

pytestmark = pytest.mark.skipif(
    openmp_runtime() is None or torch.get_num_threads() < 2,
    reason="needs torch on an OpenMP runtime with at least 2 intra-op threads",
)
SMALL = 1000


def test_a_block_runs_on_one_thread_and_gives_the_count_back():
    full = torch.get_num_threads()
    with small_ops_on_one_thread(SMALL):
        assert torch.get_num_threads() == 1
        widen()
        assert torch.get_num_threads() == full
        narrow()
        assert torch.get_num_threads() == 1
        with all_threads():
            assert torch.get_num_threads() == full
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == full


def mkl_local_count() -> int:
    """This thread's own MKL thread count (0: none set, MKL's global count applies), left as it was."""
    mkl = op_threads.mkl_runtime()
    assert mkl is not None
    previous = int(mkl.MKL_Set_Num_Threads_Local(0))
    mkl.MKL_Set_Num_Threads_Local(previous)
    return previous


@pytest.mark.skipif(op_threads.mkl_runtime() is None, reason="torch is not linked with MKL here")
def test_mkl_runs_on_one_thread_inside_a_block_too():
    """MKL keeps its own count: an MKL call in the block (SDPA's products, a vector exp) must not wake a team."""
    assert mkl_local_count() == 0
    with small_ops_on_one_thread(SMALL):
        assert mkl_local_count() == 1
        with all_threads():
            assert mkl_local_count() == 0
        assert mkl_local_count() == 1
    assert mkl_local_count() == 0


def test_attention_over_few_rows_stays_on_one_thread():
    full = torch.get_num_threads()
    with small_ops_on_one_thread(SMALL):
        op_threads.widen_for_attention(op_threads.ONE_THREAD_ATTENTION_ROWS)
        assert torch.get_num_threads() == 1
        op_threads.widen_for_attention(op_threads.ONE_THREAD_ATTENTION_ROWS + 1)
        assert torch.get_num_threads() == full


def test_the_count_comes_back_when_the_block_raises():
    full = torch.get_num_threads()
    with pytest.raises(ValueError), small_ops_on_one_thread(SMALL):
        raise ValueError("a failed step")
    assert torch.get_num_threads() == full


def test_large_activations_nested_blocks_and_outside_calls_change_nothing():
    full = torch.get_num_threads()
    with small_ops_on_one_thread(op_threads.SMALL_OP_ELEMENTS + 1):
        assert torch.get_num_threads() == full
        narrow()  # outside a one-thread block: a no-op
        assert torch.get_num_threads() == full
    with small_ops_on_one_thread(SMALL):
        with small_ops_on_one_thread(SMALL):  # the inner block neither narrows again nor restores
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == full
    widen()
    assert torch.get_num_threads() == full


def test_only_the_calling_thread_changes_and_threads_started_meanwhile_get_the_full_count():
    # torch.set_num_threads would hand its count to every thread started after it (a server's workers).
    full = torch.get_num_threads()
    seen: dict[str, int] = {}
    inside = threading.Event()
    done = threading.Event()

    def other_thread() -> None:
        inside.wait(10)
        seen["running"] = torch.get_num_threads()
        done.set()

    running = threading.Thread(target=other_thread)
    running.start()
    with small_ops_on_one_thread(SMALL):
        inside.set()
        done.wait(10)
        started = threading.Thread(target=lambda: seen.setdefault("started", torch.get_num_threads()))
        started.start()
        started.join()
    running.join()
    assert seen == {"running": full, "started": full}


def test_a_scope_that_does_not_pack_leaves_the_threads_alone():
    full = torch.get_num_threads()
    net = torch.nn.Linear(4, 4)
    with PackedLinears(net, enabled=False).small_ops_on_one_thread(SMALL):
        assert torch.get_num_threads() == full


@pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear")
def test_packed_products_run_on_all_threads_inside_a_block(monkeypatch):
    full = torch.get_num_threads()
    counts: list[int] = []
    usable = PackedLayer.usable

    def recording(self: PackedLayer, x: torch.Tensor) -> bool:
        counts.append(torch.get_num_threads())  # called where the product runs
        return usable(self, x)

    monkeypatch.setattr(PackedLayer, "usable", recording)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 8))
    x = torch.randn(3, 16)
    scope = PackedLinears(net)
    with torch.inference_mode(), scope:
        alone = net(x)
        with scope.small_ops_on_one_thread(SMALL):
            split = net(x)
            assert torch.get_num_threads() == 1  # back to one thread after each product
    assert counts == [full] * 4
    assert torch.equal(alone, split)


@pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear")
@pytest.mark.parametrize("attention_rows", [0, op_threads.ONE_THREAD_ATTENTION_ROWS])
def test_generations_keep_their_numbers_with_the_split_and_the_split_happens(tiny_backend, monkeypatch, attention_rows):
    """Small ops on one thread: bit-equal. Attention on one thread too (the default up to
    ONE_THREAD_ATTENTION_ROWS rows): the same tokens, log-probs within float32 rounding, since MKL
    picks its products' kernels by thread count on some CPUs (bit-equal on an AVX512/AMX CPU,
    up to 1e-6 apart on an AVX2-only one)."""
    monkeypatch.setattr(op_threads, "ONE_THREAD_ATTENTION_ROWS", attention_rows)
    prompts = ["Question: What is the capital of France?\nAnswer:", "Question: Who wrote Hamlet?\nAnswer:"]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=20)

    def run() -> list[tuple[list[int], list[float]]]:
        gens = tiny_backend.generate(prompts, 3, params, seeds=[1, 2])
        return [(list(c.token_ids), list(c.logprobs)) for g in gens for c in [g.greedy, *g.samples]]

    counts: list[int] = []
    set_threads = op_threads._set_threads
    monkeypatch.setattr(op_threads, "_set_threads", lambda n: (counts.append(n), set_threads(n)))
    split = run()
    assert 1 in counts  # the decode steps did run their small ops on one thread
    counts.clear()
    monkeypatch.setattr(op_threads, "SMALL_OP_ELEMENTS", 0)
    unsplit = run()
    assert counts == []
    if attention_rows == 0:
        assert split == unsplit
    else:
        assert [ids for ids, _ in split] == [ids for ids, _ in unsplit]
        for (_, a), (_, b) in zip(split, unsplit, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_the_fallback_cache_keeps_every_op_on_torchs_threads(tokenizer, monkeypatch):
    # A sliding-window layer sends the loop to transformers' own cache, whose attention
    # cannot be widened: SDPA's CPU kernel on one thread was 30x slower, so nothing narrows.
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from candor.backends.engine.kv_batch import KVBatch
    from candor.backends.hf import HFBackend

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
    backend = HFBackend(Gemma3ForCausalLM(config).eval(), tokenizer, batch_size=2)
    kinds: list[type] = []
    step = DecodeLoop.step

    def recording(loop: DecodeLoop) -> None:
        kinds.append(type(loop.kv))
        step(loop)

    counts: list[int] = []
    set_threads = op_threads._set_threads
    monkeypatch.setattr(op_threads, "_set_threads", lambda n: (counts.append(n), set_threads(n)))
    monkeypatch.setattr(DecodeLoop, "step", recording)
    prompts = ["The weather today is", "Question: Who wrote Hamlet?\nAnswer:"]
    backend.generate(prompts, 2, SamplingParams(max_new_tokens=6))
    assert kinds and set(kinds) == {KVBatch}
    assert 1 not in counts


def test_the_runtime_found_is_torchs_even_when_another_openmp_is_loaded_first():
    # scikit-learn ships its own libgomp; setting that one's count does nothing to torch.
    import sklearn.ensemble  # noqa: F401  (loads its OpenMP runtime)

    op_threads.openmp_runtime.cache_clear()
    try:
        full = torch.get_num_threads()
        with small_ops_on_one_thread(SMALL):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == full
    finally:
        op_threads.openmp_runtime.cache_clear()
