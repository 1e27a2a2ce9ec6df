"""An EliCal head exported as a ``*ForSequenceClassification`` checkpoint, read back by standard tools."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import saved_elical_head

from candor.train.elical import ConfidenceHead, HeadConfig
from candor.train.elical.export import (
    BIAS_KEY,
    EXPORT_FILE,
    export_seq_cls,
    read_export,
    seq_cls_confidence,
)
from candor.util.errors import CandorError

QUESTIONS = [
    "Who wrote Hamlet?",
    "What is the boiling point of water at sea level in degrees Celsius?",
    "Name the longest river in Africa, which flows through Egypt and Sudan?",
    "2+2?",
]


@pytest.fixture(scope="module", params=["head", "lora"])
def exported(request, tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"export-{request.param}")
    head = saved_elical_head(tiny_model_dir, root / "head", request.param)
    result = export_seq_cls(root / "head", root / "seq-cls")
    return head, result, root / "seq-cls"


def test_the_export_is_a_one_label_sequence_classifier_with_the_bias_written_down(exported):
    head, result, out = exported
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    assert len(config["id2label"]) == 1
    assert config["pad_token_id"] == head.tokenizer.pad_token_id
    info = read_export(out)
    assert info["mode"] == head.config.mode and info["template"] == "fewshot"
    assert config[BIAS_KEY] == pytest.approx(info["logit_bias"]) == pytest.approx(result.logit_bias)
    assert json.loads(result.vllm_pooler_config()) == {"logit_mean": -result.logit_bias}
    assert abs(result.logit_bias) > 0.1  # a real bias, so the tests below would see it dropped


def test_auto_model_for_sequence_classification_gives_the_heads_confidence(exported):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    head, _, out = exported
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompts = head.prompts(QUESTIONS)
    expected = head.predict(QUESTIONS)
    got = seq_cls_confidence(model, tokenizer, prompts)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # the tokenizer's own padded batch (right padding, the config's pad token) pools the same tokens
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits[:, 0].double()
    np.testing.assert_allclose(torch.sigmoid(logits + model.config.candor_logit_bias).numpy(), expected, atol=1e-5)
    assert np.abs(torch.sigmoid(logits).numpy() - expected).max() > 1e-2  # the bias is not in the weights


def test_the_text_classification_pipeline_gives_the_heads_logit(exported):
    from transformers import pipeline

    head, result, out = exported
    prompts = head.prompts(QUESTIONS)
    expected = head.predict(QUESTIONS)
    classify = pipeline("text-classification", model=str(out), device="cpu")
    raw = [r["score"] for r in classify(prompts, function_to_apply="none")]
    np.testing.assert_allclose(1 / (1 + np.exp(-(np.array(raw) + result.logit_bias))), expected, atol=1e-5)
    # its default for one label is the sigmoid of the raw logit: the head's confidence without its bias
    default = [r["score"] for r in classify(prompts)]
    np.testing.assert_allclose(default, 1 / (1 + np.exp(-np.array(raw))), atol=1e-6)


def test_a_head_on_a_middle_layer_is_refused(tiny_model_dir, tmp_path):
    saved_elical_head(tiny_model_dir, tmp_path / "head", "head", layer=1)
    with pytest.raises(CandorError, match="layer 1.*final layer"):
        export_seq_cls(tmp_path / "head", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_head_on_the_last_layer_by_index_exports(tiny_model_dir, tmp_path):
    head = saved_elical_head(tiny_model_dir, tmp_path / "head", "head", layer=2)  # the tiny model has 2 layers
    export_seq_cls(tmp_path / "head", tmp_path / "out")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    got = seq_cls_confidence(model, AutoTokenizer.from_pretrained(tmp_path / "out"), head.prompts(QUESTIONS))
    np.testing.assert_allclose(got, head.predict(QUESTIONS), atol=1e-5)


def test_a_bos_the_chat_template_writes_is_not_doubled_by_the_exported_tokenizer(tiny_model, smollm_dir, tmp_path):
    """SmolLM2's BOS is <|im_start|>, which its chat template writes: a tokenizer that also adds a BOS would
    feed the engine [BOS, BOS, ...] where the head read one (candor drops the doubled BOS)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    from candor.backends.tokens import encode

    tokenizer = AutoTokenizer.from_pretrained(smollm_dir, add_bos_token=True)
    tiny_model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    head = saved_elical_head(str(tmp_path / "model"), tmp_path / "head", "head")
    head.config.template = "chat"
    head.save_pretrained(tmp_path / "head")
    prompts = head.prompts(QUESTIONS)
    assert tokenizer(prompts[0])["input_ids"][:2] == [tokenizer.bos_token_id] * 2  # the trap is real
    result = export_seq_cls(tmp_path / "head", tmp_path / "out")
    exported = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert [exported(p)["input_ids"] for p in prompts] == encode(head.tokenizer, prompts)
    classify = pipeline("text-classification", model=str(tmp_path / "out"), device="cpu")
    raw = np.array([r["score"] for r in classify(prompts, function_to_apply="none")])
    np.testing.assert_allclose(1 / (1 + np.exp(-(raw + result.logit_bias))), head.predict(QUESTIONS), atol=1e-5)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    np.testing.assert_allclose(seq_cls_confidence(model, exported, prompts), head.predict(QUESTIONS), atol=1e-5)


def test_the_export_never_replaces_its_head_or_an_unrelated_folder(tiny_model_dir, tmp_path):
    saved_elical_head(tiny_model_dir, tmp_path / "head", "head")
    before = sorted(p.name for p in (tmp_path / "head").iterdir())
    for out in (tmp_path / "head", tmp_path / "head" / "cls", tmp_path):
        with pytest.raises(CandorError, match="would overwrite the input"):
            export_seq_cls(tmp_path / "head", out)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(CandorError, match="exists and is not an earlier output"):
        export_seq_cls(tmp_path / "head", tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    assert sorted(p.name for p in (tmp_path / "head").iterdir()) == before
    export_seq_cls(tmp_path / "head", tmp_path / "cls")
    export_seq_cls(tmp_path / "head", tmp_path / "cls")  # an earlier export is replaced whole
    assert read_export(tmp_path / "cls")["mode"] == "head"


def test_a_folder_that_is_not_a_head_is_refused(tmp_path):
    (tmp_path / "nothead").mkdir()
    with pytest.raises(CandorError, match="not a saved EliCal head"):
        export_seq_cls(tmp_path / "nothead", tmp_path / "out")
    with pytest.raises(CandorError, match=f"no {EXPORT_FILE}"):
        read_export(tmp_path / "nothead")


# Measured on the embedded model (random head and LoRA, 10 questions): head mode within 3.7e-6;
# LoRA mode within 1.2e-5, of which merging the adapter into float32 weights changes the features
# by up to 3.4e-5 (on values up to 45) and the logit by 3.7e-5, and folding the standardization into
# float32 weights the logit by 6e-6. The merged checkpoint cannot be closer than its own rounding.
REAL_MODEL_TOLERANCE = {"head": 1e-5, "lora": 3e-5}


def embedded_head(mode: str, folder) -> ConfidenceHead:
    """A head on the embedded SmolLM2-135M (random LoRA and head, standardized on real features), saved and reloaded."""
    from candor.train.common import load_causal_lm

    model, tokenizer = load_causal_lm("smollm2-135m", device="cpu")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = {"r": 8, "alpha": 16, "dropout": 0.0, "targets": targets} if mode == "lora" else None
    config = HeadConfig(backbone="smollm2-135m", template="chat" if mode == "lora" else "fewshot", mode=mode, lora=lora)
    head = ConfidenceHead.create(model, tokenizer, config, seed=1)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in head.backbone.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        head.head.standardize_on(torch.tensor(head.prompt_features(head.prompts(QUESTIONS))))
        head.head.linear.weight.copy_(torch.randn(head.head.linear.weight.shape, generator=gen) * 0.1)
        head.head.linear.bias.fill_(0.3)
    head.save_pretrained(folder)
    return ConfidenceHead.from_pretrained(folder, device="cpu")


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["head", "lora"])
def test_on_the_embedded_model_the_export_gives_the_heads_confidence(mode, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    head = embedded_head(mode, tmp_path / "head")
    export_seq_cls(tmp_path / "head", tmp_path / "cls")
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "cls").eval()
    got = seq_cls_confidence(classifier, AutoTokenizer.from_pretrained(tmp_path / "cls"), head.prompts(QUESTIONS))
    expected = head.predict(QUESTIONS)
    assert expected.max() - expected.min() > 0.1
    np.testing.assert_allclose(got, expected, atol=REAL_MODEL_TOLERANCE[mode])


VLLM_CLASSIFY = """
import json, sys
from vllm import LLM
from vllm.config import PoolerConfig

if __name__ == "__main__":
    folder, pooler, dtype, prompts, out = sys.argv[1:]
    pooler, prompts = json.loads(pooler), json.loads(prompts)
    llm = LLM(folder, runner="pooling", pooler_config=PoolerConfig(**pooler), dtype=dtype, enforce_eager=True,
              max_model_len=512)
    json.dump([o.outputs.probs[0] for o in llm.classify(prompts)], open(out, "w"))
"""


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.parametrize("mode", ["head", "lora"])
def test_vllm_pooling_runner_classifies_with_the_heads_confidence(mode, tmp_path):
    """On the embedded model (vLLM's CPU attention has no kernel for the tiny model's head size 16), with the
    pooler config and dtype the export prints. vLLM's engine must start under ``__main__``: it runs in a
    subprocess (see tests/test_backend_vllm.py)."""
    pytest.importorskip("vllm", reason="vllm is not importable here; run this test in the vllm venv (see README)")
    import os
    import subprocess
    import sys

    head = embedded_head(mode, tmp_path / "head")
    result = export_seq_cls(tmp_path / "head", tmp_path / "cls")
    script, got = tmp_path / "classify.py", tmp_path / "probs.json"
    script.write_text(VLLM_CLASSIFY)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    args = [
        sys.executable,
        str(script),
        result.folder,
        result.vllm_pooler_config(),
        result.dtype,
        json.dumps(head.prompts(QUESTIONS)),
        str(got),
    ]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(json.loads(got.read_text()), head.predict(QUESTIONS), atol=1e-3)


# ------------------------------------------------------------ the command line


def test_cli_export_to_seq_cls_writes_the_classifier_and_says_how_to_serve_it(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from candor.cli import app

    saved_elical_head(tiny_model_dir, tmp_path / "head", "head")
    result = CliRunner().invoke(app, ["export", str(tmp_path / "head"), "--to", "seq-cls", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    info = read_export(tmp_path / "out")
    assert info["architecture"] == "LlamaForSequenceClassification"
    assert "--runner pooling" in result.output and f'"logit_mean": {-info["logit_bias"]}' in result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--to", "onnx", "OUT"], "--to 'onnx': unknown export format; known: honestybench, seq-cls"),
        (["--to", "seq-cls"], "give where to write once"),
        (["--to", "seq-cls", "OUT", "--out", "OUT2"], "give where to write once"),
        (["--to", "seq-cls", "OUT"], "not a saved EliCal head"),
        (["OUT"], "is an EliCal head folder; export it with --to seq-cls"),
        (["OUT", "--dtype", "bfloat16"], "--dtype applies to --to seq-cls only"),
    ],
)
def test_cli_export_mistakes_exit_2_with_one_line(tmp_path, args, needle):
    from typer.testing import CliRunner

    from candor.cli import app

    source = tmp_path / "src"
    source.mkdir()
    if "seq-cls" not in args:  # looks like a head folder, exported as records by mistake
        (source / "elical_config.json").write_text("{}")
    args = [str(tmp_path / a) if a.startswith("OUT") else a for a in args]
    result = CliRunner().invoke(app, ["export", str(source), *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "OUT").exists()
