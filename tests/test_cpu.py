"""The CPU's facts, and the warning for a 16-bit dtype that the CPU only emulates."""

from __future__ import annotations

import logging

import pytest
import torch

from candor.backends.hf import warn_if_emulated
from candor.util import cpu

AVX2_ONLY = {"cpu_name": "AMD EPYC", "architecture": "x86_64", "avx2": True, "avx512_f": False, "avx512_bf16": False}
AMX = {**AVX2_ONLY, "cpu_name": "Intel Xeon", "avx512_f": True, "amx_bf16": True}


@pytest.fixture
def report(monkeypatch):
    """Pretend torch reports ``caps`` for this CPU."""

    def use(caps: dict) -> None:
        monkeypatch.setattr(cpu, "capabilities", lambda: caps)

    return use


def test_native_16bit_follows_the_instructions_torch_reports(report):
    report(AVX2_ONLY)
    assert cpu.native_16bit(torch.bfloat16) is False
    assert cpu.native_16bit(torch.float16) is False
    report(AMX)
    assert cpu.native_16bit(torch.bfloat16) is True
    assert cpu.native_16bit(torch.float16) is False  # AMX-BF16 is not AMX-FP16
    report({**AVX2_ONLY, "avx512_bf16": True})
    assert cpu.native_16bit(torch.bfloat16) is True


def test_native_16bit_is_unknown_without_a_report_or_for_other_dtypes(report):
    report({})
    assert cpu.native_16bit(torch.bfloat16) is None
    report(AMX)
    assert cpu.native_16bit(torch.float32) is None


def test_describe_names_the_cpu_and_its_16bit_instructions(report):
    report(AMX)
    facts = cpu.describe()
    assert facts["name"] == "Intel Xeon"
    assert facts["avx512"] is True
    assert facts["native_16bit"] == ["amx_bf16"]
    report(AVX2_ONLY)
    assert cpu.describe()["native_16bit"] == []
    assert cpu.describe()["vector_level"] == torch.backends.cpu.get_cpu_capability()


def test_this_machines_report_is_read():
    facts = cpu.describe()
    assert facts["architecture"] != "" and facts["logical_cores"] == torch.cpu.get_capabilities()["num_logical_cores"]


def test_bfloat16_on_a_cpu_that_emulates_it_warns_once_per_load(report, caplog):
    report(AVX2_ONLY)
    with caplog.at_level(logging.WARNING, logger="candor.backends.hf"):
        assert warn_if_emulated(torch.bfloat16, "cpu") is True
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "bfloat16" in message and "AMD EPYC" in message and "amx_bf16 or avx512_bf16" in message


@pytest.mark.parametrize(
    ("caps", "dtype", "device"),
    [
        (AMX, torch.bfloat16, "cpu"),  # native
        (AVX2_ONLY, torch.float32, "cpu"),  # float32 is never emulated
        (AVX2_ONLY, torch.bfloat16, "cuda:0"),  # not the CPU's business
        ({}, torch.bfloat16, "cpu"),  # torch cannot tell: say nothing rather than guess
    ],
)
def test_no_warning_where_the_dtype_is_native_or_unknown(report, caplog, caps, dtype, device):
    report(caps)
    with caplog.at_level(logging.WARNING, logger="candor.backends.hf"):
        assert warn_if_emulated(dtype, device) is False
    assert not caplog.records
