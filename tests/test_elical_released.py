"""Heads in the EliCal authors' layout (a PEFT LoRA folder + nn.Linear(hidden, 1) state dict) import exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from candor.train.elical import ConfidenceHead, HeadConfig
from candor.train.elical.released import import_released_head
from candor.util.errors import CandorError

QUESTIONS = [
    "Who wrote Hamlet?",
    "What is the boiling point of water at sea level in degrees Celsius?",
    "Name the longest river in Africa, which flows through Egypt and Sudan?",
]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def released(tiny_model_dir, tmp_path_factory):
    """The authors' layout, written as their trainer writes it: LoRA on the causal LM (r=8, alpha=16, the seven
    projections), saved with save_pretrained, and the linear head's state dict saved with torch.save."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("released")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lora)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # B starts at zero; move it so the adapter changes the hidden states
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    peft_model.save_pretrained(root / "lora_epoch_best")
    vector_head = nn.Linear(model.config.hidden_size, 1)
    with torch.no_grad():
        vector_head.weight.copy_(torch.randn(vector_head.weight.shape, generator=gen) * 0.3)
        vector_head.bias.fill_(-0.4)
    torch.save(vector_head.state_dict(), root / "vector_head_epoch_best.pt")
    return root, peft_model.eval(), vector_head.eval()


def reference_confidences(peft_model, vector_head, tokenizer, prompts: list[str]) -> np.ndarray:
    """The authors' computation, one prompt at a time: sigmoid(Linear(final hidden state of the last token))."""
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt")
            states = peft_model(**ids, output_hidden_states=True).hidden_states[-1]
            out.append(torch.sigmoid(vector_head(states[0, -1])).item())
    return np.array(out)


def test_an_imported_head_gives_the_authors_confidences(released, tiny_model_dir, tmp_path):
    root, peft_model, vector_head = released
    out = import_released_head(
        root / "lora_epoch_best",
        root / "vector_head_epoch_best.pt",
        tiny_model_dir,
        tmp_path / "head",
        template="fewshot",
    )
    config = HeadConfig.read(out)
    assert (config.mode, config.layer, config.template, config.hidden_size) == ("lora", -1, "fewshot", 64)
    assert config.lora == {"r": 8, "alpha": 16, "dropout": 0.0, "targets": sorted(TARGETS)}
    head = ConfidenceHead.from_pretrained(out, device="cpu")
    prompts = head.prompts(QUESTIONS)
    expected = reference_confidences(peft_model, vector_head, head.tokenizer, prompts)
    np.testing.assert_allclose(head.predict(QUESTIONS), expected, atol=1e-6)
    base = ConfidenceHead.from_pretrained(out, device="cpu")
    base.backbone.disable_adapter_layers()  # the adapter matters: without it the numbers move
    assert np.abs(base.predict(QUESTIONS) - expected).max() > 1e-3


def test_an_imported_head_scores_through_the_estimator_and_exports(released, tiny_model_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from candor.estimators import get_estimator
    from candor.train.elical.export import export_seq_cls, seq_cls_confidence

    root, peft_model, vector_head = released
    out = import_released_head(
        root / "lora_epoch_best",
        root / "vector_head_epoch_best.pt",
        tiny_model_dir,
        tmp_path / "head",
        template="fewshot",
    )
    scores = get_estimator("elical", head=str(out), device="cpu").score_questions(QUESTIONS)
    head = ConfidenceHead.from_pretrained(out, device="cpu")
    expected = reference_confidences(peft_model, vector_head, head.tokenizer, head.prompts(QUESTIONS))
    np.testing.assert_allclose(scores, expected, atol=1e-6)
    export_seq_cls(out, tmp_path / "seq-cls")
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "seq-cls").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "seq-cls")
    np.testing.assert_allclose(seq_cls_confidence(model, tokenizer, head.prompts(QUESTIONS)), expected, atol=1e-5)


def test_cli_import_head_writes_a_head_folder(released, tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from candor.cli import app

    root, _, _ = released
    args = [
        "import-head",
        str(root / "lora_epoch_best"),
        str(root / "vector_head_epoch_best.pt"),
        "--backbone",
        tiny_model_dir,
        "-o",
        str(tmp_path / "head"),
        "--template",
        "fewshot",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "imported a lora head" in result.output and HeadConfig.read(tmp_path / "head").mode == "lora"


def bad_pt(tmp_path, content) -> str:
    path = tmp_path / "vector_head.pt"
    torch.save(content, path)
    return str(path)


class NotATensor:
    pass


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ({"linear.weight": torch.zeros(1, 64), "linear.bias": torch.zeros(1)}, "keys weight, bias"),
        ({"weight": torch.zeros(1, 32), "bias": torch.zeros(1)}, "shape \\(1, 32\\).*hidden size needs \\(1, 64\\)"),
        ({"weight": torch.zeros(2, 64), "bias": torch.zeros(2)}, "shape \\(2, 64\\)"),
        ({"weight": torch.zeros(1, 64), "bias": torch.zeros(2)}, "bias must have shape"),
        ([torch.zeros(1, 64)], "got list"),
        ({"weight": NotATensor(), "bias": torch.zeros(1)}, "weights_only=True"),
    ],
)
def test_a_bad_vector_head_is_a_clear_error(released, tiny_model_dir, tmp_path, content, needle):
    root, _, _ = released
    with pytest.raises(CandorError, match=needle):
        import_released_head(root / "lora_epoch_best", bad_pt(tmp_path, content), tiny_model_dir, tmp_path / "head")
    assert not (tmp_path / "head").exists()


def test_a_folder_that_is_not_a_lora_adapter_is_a_clear_error(released, tiny_model_dir, tmp_path):
    root, _, _ = released
    (tmp_path / "empty").mkdir()
    with pytest.raises(CandorError, match="not a PEFT LoRA folder"):
        import_released_head(tmp_path / "empty", root / "vector_head_epoch_best.pt", tiny_model_dir, tmp_path / "h")
    with pytest.raises(CandorError, match="no such file"):
        import_released_head(root / "lora_epoch_best", tmp_path / "missing.pt", tiny_model_dir, tmp_path / "h")
    with pytest.raises(CandorError, match="would overwrite the input"):  # -o pointed at the release itself
        import_released_head(root / "lora_epoch_best", root / "vector_head_epoch_best.pt", tiny_model_dir, root)
    assert (root / "lora_epoch_best" / "adapter_config.json").exists()


def test_an_adapter_for_another_model_is_a_clear_error(released, tiny_model_dir, tmp_path):
    """LoRA weights whose modules the backbone lacks (a deeper model's layer 5) are refused, not dropped."""
    import shutil

    from safetensors.torch import load_file, save_file

    root, _, _ = released
    shutil.copytree(root / "lora_epoch_best", tmp_path / "lora")
    weights = load_file(str(tmp_path / "lora" / "adapter_model.safetensors"))
    weights = {k.replace("layers.1.", "layers.5."): v for k, v in weights.items()}
    save_file(weights, str(tmp_path / "lora" / "adapter_model.safetensors"))
    with pytest.raises(CandorError, match="names no module of the backbone"):
        import_released_head(tmp_path / "lora", root / "vector_head_epoch_best.pt", tiny_model_dir, tmp_path / "h")
