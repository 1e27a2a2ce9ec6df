"""Prepacked oneDNN linear layers: same numbers as nn.Linear, never stale, invisible outside a scope."""

from __future__ import annotations

import copy
import pickle
import threading

import pytest
import torch

from candor.backends.engine import packed_linear
from candor.backends.engine.packed_linear import (
    PackedLinears,
    packed_linears_of,
    packing_available,
    with_packed_linears,
)

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear")


def small_net(seed: int = 0, bias: bool = True) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(48, 96, bias=bias), torch.nn.SiLU(), torch.nn.Linear(96, 32, bias=False))


def reference(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The net computed with torch.nn.functional.linear, outside any scope."""
    h = torch.nn.functional.linear(x, net[0].weight, net[0].bias)
    return torch.nn.functional.linear(torch.nn.functional.silu(h), net[2].weight)


def packed_weights(scope: PackedLinears) -> int:
    return sum(layer.packed is not None for layer in scope.layers.values())


def test_inside_a_scope_the_packed_kernel_gives_nn_linears_numbers():
    net, x = small_net(), torch.randn(5, 7, 48)
    scope = PackedLinears(net)
    with torch.inference_mode(), scope:
        out = net(x)
    assert packed_weights(scope) == 2  # the packed path ran, for both layers
    torch.testing.assert_close(out, reference(net, x), rtol=1e-5, atol=1e-6)


NO_BF16_PATH = "this CPU has no oneDNN bfloat16 path (it needs AVX512 or AVX-NE-CONVERT)"


@pytest.mark.skipif(not packing_available(torch.bfloat16), reason=NO_BF16_PATH)
def test_bfloat16_layers_are_packed_too():
    net = small_net().to(torch.bfloat16)
    x = torch.randn(4, 48, dtype=torch.bfloat16)
    scope = PackedLinears(net)
    with torch.inference_mode(), scope:
        out = net(x)
    assert packed_weights(scope) == 2
    torch.testing.assert_close(out.float(), reference(net, x).float(), rtol=2e-2, atol=2e-2)


def test_a_dtype_this_cpu_cannot_pack_runs_nn_linears_own_kernels(monkeypatch):
    """An AVX2-only CPU refuses oneDNN's bfloat16 reorder: its layers keep nn.Linear's kernels, and no stack packs."""
    can_pack = packed_linear.packing_available

    def no_bfloat16(dtype: torch.dtype = torch.float32) -> bool:
        return dtype != torch.bfloat16 and can_pack(dtype)

    monkeypatch.setattr(packed_linear, "packing_available", no_bfloat16)
    net = small_net().to(torch.bfloat16)
    x = torch.randn(4, 48, dtype=torch.bfloat16)
    scope = PackedLinears(net)
    assert scope.enabled  # float32 packs: the scope is on, the bfloat16 layers stay unpacked
    assert scope.stack((net[0],)) is None
    with torch.inference_mode(), scope:
        out = net(x)
    assert packed_weights(scope) == 0
    assert torch.equal(out, reference(net, x))  # nn.Linear's own kernels, bit for bit


def test_the_packing_probe_refuses_dtypes_it_has_no_kernels_for():
    assert not packing_available(torch.float64)
    assert not packing_available(torch.int8)


@pytest.mark.skipif(packing_available(torch.bfloat16), reason="this CPU packs bfloat16")
def test_on_a_cpu_without_the_bfloat16_path_the_probe_says_so():
    """Where the reorder refuses bfloat16 (AVX2 only), the probe is False rather than the first product raising."""
    weight = torch.randn(8, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError):
        torch.ops.mkldnn._reorder_linear_weight(weight, None)


def test_outside_a_scope_the_model_is_untouched():
    net, x = small_net(), torch.randn(3, 48)
    scope = PackedLinears(net)
    with torch.inference_mode(), scope:
        assert "forward" in vars(net[0])  # installed while the scope is open
        net(x)
    assert all("forward" not in vars(m) for m in net.modules())
    assert torch.equal(net(x), reference(net, x))  # nn.Linear's own kernel: bit-equal
    twin = copy.deepcopy(net)
    assert torch.equal(twin(x), net(x))
    assert torch.equal(pickle.loads(pickle.dumps(net))(x), net(x))


def test_gradients_on_take_nn_linears_own_path():
    net, x = small_net(), torch.randn(3, 48)
    scope = PackedLinears(net)
    with scope:
        out = net(x)
        out.sum().backward()
    assert packed_weights(scope) == 0
    assert torch.equal(out, reference(net, x))
    assert net[0].weight.grad is not None


def test_a_weight_changed_through_data_between_scopes_is_repacked():
    """PEFT's merge adds to ``weight.data`` in place: no version bump, same storage; the fingerprint moves."""
    net, x = small_net(), torch.randn(3, 48)
    scope = PackedLinears(net)
    with torch.inference_mode(), scope:
        before = net(x)
    net[0].weight.data.add_(0.5)
    with torch.inference_mode(), scope:
        after = net(x)
    torch.testing.assert_close(after, reference(net, x), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(after, before)


def test_a_weight_changed_in_place_inside_a_scope_is_repacked():
    net, x = small_net(), torch.randn(3, 48)
    scope = PackedLinears(net)
    with scope:
        with torch.no_grad():
            net(x)
            net[2].weight.mul_(2.0)  # bumps the version counter
            out = net(x)
        torch.testing.assert_close(out, reference(net, x).detach(), rtol=1e-5, atol=1e-6)


def test_a_replaced_parameter_is_repacked():
    net, x = small_net(), torch.randn(3, 48)
    scope = PackedLinears(net)
    with torch.inference_mode(), scope:
        net(x)
    net[0].weight = torch.nn.Parameter(torch.randn(96, 48))
    with torch.inference_mode(), scope:
        out = net(x)
    torch.testing.assert_close(out, reference(net, x), rtol=1e-5, atol=1e-6)


def test_scopes_nest_and_the_outermost_one_restores():
    net, x = small_net(), torch.randn(2, 48)
    scope = PackedLinears(net)
    with torch.inference_mode():
        with scope:
            with scope:
                net(x)
            assert "forward" in vars(net[0])  # the inner exit does not uninstall
        assert "forward" not in vars(net[0])


def test_a_disabled_scope_changes_nothing():
    net, x = small_net(), torch.randn(2, 48)
    scope = PackedLinears(net, enabled=False)
    with torch.inference_mode(), scope:
        assert "forward" not in vars(net[0])
        assert torch.equal(net(x), reference(net, x))


def test_one_scope_per_model():
    net = small_net()
    assert packed_linears_of(net) is packed_linears_of(net)
    assert packed_linears_of(small_net()) is not packed_linears_of(net)


def test_a_scope_held_by_one_thread_serves_another():
    """The live engine's thread holds the scope; re-reads from server threads go through it too."""
    net, x = small_net(), torch.randn(2, 48)
    scope = PackedLinears(net)
    opened, done = threading.Event(), threading.Event()

    def holder() -> None:
        with scope:
            opened.set()
            done.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    opened.wait(10)
    with torch.inference_mode():
        out = net(x)
    done.set()
    thread.join()
    assert packed_weights(scope) == 2
    torch.testing.assert_close(out, reference(net, x), rtol=1e-5, atol=1e-6)
    assert "forward" not in vars(net[0])


def test_a_lora_base_layer_is_packed_and_the_adapter_still_adds():
    from peft import LoraConfig, get_peft_model

    net, x = small_net(), torch.randn(3, 48)
    model = get_peft_model(net, LoraConfig(r=4, target_modules=["0"], init_lora_weights=False))
    with torch.no_grad():
        plain = model(x)
    scope = PackedLinears(model)
    with torch.inference_mode(), scope:
        packed = model(x)
    assert packed_weights(scope) >= 1
    torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-6)


def test_with_packed_linears_opens_the_owners_scope():
    class Owner:
        def __init__(self) -> None:
            self.packed_linears = PackedLinears(small_net())

        @with_packed_linears
        def depth(self) -> int:
            return self.packed_linears.depth

    owner = Owner()
    assert owner.depth() == 1
    assert owner.packed_linears.depth == 0


def test_hf_backend_generates_the_same_answers_packed_or_not(tiny_model, tokenizer):
    from candor.backends.base import SamplingParams
    from candor.backends.hf import HFBackend

    prompts = ["Question: who wrote Hamlet?\nAnswer:", "Question: what is 2+2?\nAnswer:"]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95, top_k=50)
    packed = HFBackend(tiny_model, tokenizer, batch_size=4)
    stock = HFBackend(tiny_model, tokenizer, batch_size=4, pack_linears=False)
    got = packed.generate(prompts, 2, params, seeds=[1, 2])
    want = stock.generate(prompts, 2, params, seeds=[1, 2])
    assert packed_weights(packed.packed_linears) > 0 and packed_weights(stock.packed_linears) == 0
    for g, w in zip(got, want, strict=True):
        for a, b in zip([g.greedy, *g.samples], [w.greedy, *w.samples], strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert all("forward" not in vars(m) for m in tiny_model.modules())


def test_copies_that_would_not_fit_in_half_the_free_memory_are_not_made():
    from candor.backends.engine.packed_linear import copies_fit, linear_weight_bytes

    net = small_net(bias=False)
    needed = linear_weight_bytes(net)
    assert needed == (48 * 96 + 96 * 32) * 4
    assert copies_fit(net, free=2 * needed)
    assert not copies_fit(net, free=2 * needed - 1)
    meta = torch.nn.Linear(4, 4, device="meta")  # no CPU weights: nothing to pack
    assert linear_weight_bytes(meta) == 0 and not copies_fit(meta, free=1 << 40)
    assert not PackedLinears(meta).enabled


def test_weights_made_under_inference_mode_are_packed_too():
    """They carry no version counter (a head loaded inside inference_mode has such weights)."""
    with torch.inference_mode():
        net = small_net()
    x = torch.randn(3, 48)
    scope = PackedLinears(net)
    with torch.inference_mode(), scope:
        out = net(x)
    assert packed_weights(scope) == 2
    with torch.inference_mode():
        torch.testing.assert_close(out, reference(net, x), rtol=1e-5, atol=1e-6)


def test_from_pretrained_passes_pack_linears_through(tiny_model_dir):
    from candor.backends.hf import HFBackend

    assert HFBackend.from_pretrained(tiny_model_dir, device="cpu").packed_linears.enabled
    assert not HFBackend.from_pretrained(tiny_model_dir, device="cpu", pack_linears=False).packed_linears.enabled
