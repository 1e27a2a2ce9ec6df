"""Diagnostics on a tiny random Llama: sensitivity, masking, rollout, IG, and the written report."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from conftest import build_tiny_model

from candor.data.items import QAItem
from candor.diagnose import CandidateSet, DiagnoseConfig, diagnose_model, run_diagnosis
from candor.diagnose.attribution import integrated_gradients
from candor.diagnose.masking import mask_answer, masking_counterfactual
from candor.diagnose.regions import prompt_regions
from candor.diagnose.rollout import rollout_masses
from candor.diagnose.sensitivity import answer_sensitivity, pairwise_jsd
from candor.util.errors import CandorError
from candor.verbal.formats import confidence_distribution

ITEMS = [
    QAItem(id="nq:1", dataset="nq", split="test", question="who wrote hamlet", answers=("Shakespeare",)),
    QAItem(id="nq:2", dataset="nq", split="test", question="capital of france", answers=("Paris",)),
    QAItem(id="hq:3", dataset="hq", split="test", question="when did the war end", answers=("1945",)),
]


def _sets() -> list[CandidateSet]:
    return [
        CandidateSet(ITEMS[0], ("Marlowe", "William Shakespeare", "1945"), (0, 1, 0), ("greedy", "gold", "borrowed")),
        CandidateSet(ITEMS[1], ("Paris", "Lyon"), (1, 0), ("greedy", "sample")),
        CandidateSet(ITEMS[2], ("1989", "1945", "Paris"), (0, 1, 0), ("greedy", "gold", "borrowed")),
    ]


SMALL = DiagnoseConfig(ig_examples=1, ig_steps=8, ig_batch_size=4)


def test_sensitivity_matches_inference_scoring(tiny_backend):
    sets = _sets()
    result = answer_sensitivity(tiny_backend, sets, "number")
    assert [q.item_id for q in result.questions] == ["nq:1", "nq:2", "hq:3"]
    expected = confidence_distribution(tiny_backend, [ITEMS[0]] * 3, list(sets[0].answers), "number")
    q = result.questions[0]
    # Both paths run the same float32 model on batches of other shapes: equal up to float32 rounding.
    np.testing.assert_allclose(q.distributions, expected, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(q.distributions.sum(1), 1.0, atol=1e-9)
    np.testing.assert_allclose(q.mu, expected @ (np.arange(10) / 9), atol=1e-9)
    np.testing.assert_allclose(q.jsd, pairwise_jsd(expected), rtol=1e-4, atol=1e-9)
    assert result.summary()["n_pairs"] == 3 + 1 + 3


def test_masking_keeps_length_and_real_matches_inference(tiny_backend, tokenizer):
    regions = prompt_regions(tokenizer, ITEMS[0], "William Shakespeare", "number")
    masked = mask_answer(regions, tokenizer.pad_token_id)
    start, end = regions.answer_span
    assert len(masked) == len(regions.ids)
    assert masked[start:end] == [tokenizer.pad_token_id] * (end - start)
    assert masked[:start] == list(regions.ids[:start]) and masked[end:] == list(regions.ids[end:])

    answers = ["William Shakespeare", "Paris", "1989"]
    result = masking_counterfactual(tiny_backend, ITEMS, answers, "number", batch_size=2)
    reference = confidence_distribution(tiny_backend, ITEMS, answers, "number")
    np.testing.assert_allclose(np.stack([e.real for e in result.examples]), reference, atol=1e-5)
    # " William" + " Shakespeare"; " Paris"; digits one token each (the lone space before them is template)
    assert [e.n_answer_tokens for e in result.examples] == [2, 1, 4]
    changed = [not np.allclose(e.real, e.masked, atol=1e-7) for e in result.examples]
    assert any(changed)  # a random model still reads the answer a little
    s = result.summary()
    shift = np.mean([abs(e.mu_real - e.mu_masked) for e in result.examples])
    assert s["mask_shift"] == pytest.approx(shift)


def test_mask_answer_without_answer_tokens_is_an_error(tokenizer):
    regions = prompt_regions(tokenizer, ITEMS[0], "Shakespeare", "number")
    empty = type(regions)(regions.prompt, regions.ids, np.zeros_like(regions.roles))
    with pytest.raises(CandorError, match="no answer tokens"):
        mask_answer(empty, 0)


def test_rollout_masses_sum_to_one_and_attention_is_restored(tiny_backend):
    before = tiny_backend.model.config._attn_implementation
    result = rollout_masses(tiny_backend, ITEMS[:2], ["William Shakespeare", "Paris"], "number")
    assert tiny_backend.model.config._attn_implementation == before
    for ex in result.examples:
        assert sum(ex.mass.values()) == pytest.approx(1.0, abs=1e-9)
        assert all(v > 0 for v in ex.mass.values())
    summary = result.summary()
    assert summary["n"] == 2
    assert sum(summary[r] for r in ("bos", "template", "question", "answer")) == pytest.approx(1.0)
    assert sum(summary["excl_bos"].values()) == pytest.approx(1.0)
    ex = result.examples[0]
    assert summary["excl_bos"]["answer"] == pytest.approx(
        np.mean([e.mass["answer"] / (1 - e.mass["bos"]) for e in result.examples])
    )
    assert ex.mass["answer"] < 1 - ex.mass["bos"]


def test_integrated_gradients_completeness(tiny_backend):
    result = integrated_gradients(
        tiny_backend, ITEMS[:2], ["William Shakespeare", "Paris"], "number", steps=48, internal_batch_size=16
    )
    for ex in result.examples:
        gap = ex.mu_input - ex.mu_baseline
        # captum's delta is sum(attributions) − (f(x) − f(baseline)); μ here is computed separately.
        assert ex.scores.sum() - gap == pytest.approx(ex.delta, abs=1e-6)
        assert abs(ex.delta) <= 0.05 * abs(gap) + 1e-6
        assert len(ex.scores) == len(ex.tokens)
        assert 1 <= ex.first_answer_rank <= len(ex.tokens)
    assert all(p.requires_grad for p in tiny_backend.model.parameters())  # restored after freezing


def test_integrated_gradients_errors(tiny_backend, monkeypatch):
    with pytest.raises(CandorError, match="steps"):
        integrated_gradients(tiny_backend, ITEMS[:1], ["x"], steps=0)
    monkeypatch.setitem(sys.modules, "captum.attr", None)  # as if captum were not installed
    with pytest.raises(CandorError, match=r"\.\[diagnose\]"):
        integrated_gradients(tiny_backend, ITEMS[:1], ["Shakespeare"])


def test_run_diagnosis_writes_report_side_by_side(tiny_backend, tokenizer, tmp_path):
    from candor.backends.hf import HFBackend

    other = HFBackend(build_tiny_model(len(tokenizer), seed=1), tokenizer, batch_size=4)
    report = run_diagnosis(
        _sets(), tmp_path / "out", config=SMALL, backends={"base": tiny_backend, "advice": other}, title="Tiny diagnose"
    )
    out = tmp_path / "out"
    for name in (
        "diagnose.md",
        "diagnose.json",
        "jsd_hist.png",
        "mu_by_correctness.png",
        "masking.png",
        "rollout.png",
        "attribution_base.html",
        "attribution_advice.html",
        "details/base.json",
        "details/advice.json",
    ):
        assert (out / name).stat().st_size > 0, name
    doc = json.loads((out / "diagnose.json").read_text())
    assert list(doc["models"]) == ["base", "advice"]
    base = doc["models"]["base"]
    assert base["share_jsd_le_0.1"] == pytest.approx(report.diagnoses["base"].sensitivity.share_jsd_at_most(0.1))
    assert base["rollout"]["n"] == 3 and base["masking"]["n"] == 3 and base["attribution"]["n"] == 1
    assert doc["models"]["advice"]["mean_jsd"] != base["mean_jsd"]  # two different models
    md = (out / "diagnose.md").read_text()
    assert "| | base | advice |" in md and "](jsd_hist.png)" in md and "(attribution_advice.html)" in md
    details = json.loads((out / "details/base.json").read_text())
    assert len(details["sensitivity"]["questions"]) == 3


def test_stage_cache_resumes_and_invalidates(tiny_backend, tokenizer, tmp_path):
    from candor.backends.hf import HFBackend

    config = DiagnoseConfig(stages=("sensitivity", "rollout"))
    first = diagnose_model(tiny_backend, _sets(), config, cache_dir=tmp_path)
    assert (tmp_path / "base" / "sensitivity.json").exists()
    # Resume: the same model, settings and questions read the saved stages back (costs included).
    (tmp_path / "base" / "rollout.json").write_text(
        (tmp_path / "base" / "rollout.json").read_text().replace('"cost": {', '"cost": {"marker": 7.0, ', 1)
    )
    resumed = diagnose_model(tiny_backend, _sets(), config, cache_dir=tmp_path)
    assert resumed.costs["rollout"]["marker"] == 7.0
    # A different model under the same name and settings: its weights differ, so it is recomputed.
    other = HFBackend(build_tiny_model(len(tokenizer), seed=2), tokenizer)
    assert other.model_name == tiny_backend.model_name
    again = diagnose_model(other, _sets(), config, cache_dir=tmp_path)
    assert not np.allclose(again.sensitivity.questions[0].mu, first.sensitivity.questions[0].mu, atol=1e-6)
    assert "marker" not in again.costs["rollout"]
    # Changed candidates change the key too.
    fresh = diagnose_model(other, _sets()[:2], config, cache_dir=tmp_path)
    assert len(fresh.sensitivity.questions) == 2
    assert fresh.masking is None and not math.isnan(fresh.summary()["mean_jsd"])


def test_stage_cache_is_keyed_by_the_adapter_weights(tiny_backend, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v1")
    config = DiagnoseConfig(stages=("sensitivity",))
    cache = tmp_path / "cache"
    diagnose_model(tiny_backend, _sets(), config, name="advice", adapter=str(adapter), cache_dir=cache)
    saved = cache / "advice" / "sensitivity.json"
    key = json.loads(saved.read_text())["key"]
    diagnose_model(tiny_backend, _sets(), config, name="advice", adapter=str(adapter), cache_dir=cache)
    assert json.loads(saved.read_text())["key"] == key  # same weights: read back
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v2")  # retrained into the same folder
    diagnose_model(tiny_backend, _sets(), config, name="advice", adapter=str(adapter), cache_dir=cache)
    assert json.loads(saved.read_text())["key"] != key


def test_run_diagnosis_input_errors(tiny_backend, tmp_path):
    with pytest.raises(CandorError, match="no questions"):
        diagnose_model(tiny_backend, [], DiagnoseConfig())
    with pytest.raises(CandorError, match="not a mix"):
        run_diagnosis([*_sets(), "what"], tmp_path, backends={"base": tiny_backend})


def test_run_diagnosis_loads_model_and_adapter_from_disk(tiny_model, tokenizer, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    model_dir, adapter_dir = tmp_path / "model", tmp_path / "adapter"
    tiny_model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    peft_model = get_peft_model(build_tiny_model(len(tokenizer)), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # a non-identity adapter
    peft_model.save_pretrained(adapter_dir)

    config = DiagnoseConfig(stages=("sensitivity", "masking"))
    report = run_diagnosis(
        _sets()[:2],
        tmp_path / "out",
        model=str(model_dir),
        adapter=str(adapter_dir),
        adapter_name="advice",
        config=config,
    )
    assert list(report.diagnoses) == ["base", "advice"]
    assert report.diagnoses["advice"].adapter == str(adapter_dir)
    base, advice = report.summary()["base"], report.summary()["advice"]
    assert base["mask_shift"] != pytest.approx(advice["mask_shift"])
    doc = json.loads((tmp_path / "out" / "diagnose.json").read_text())
    assert doc["models"]["advice"]["adapter"] == str(adapter_dir) and "rollout" not in doc["models"]["base"]
    assert not (tmp_path / "out" / "rollout.png").exists()
    with pytest.raises(CandorError, match="cannot be called 'base'"):
        run_diagnosis(
            _sets()[:1],
            tmp_path / "x",
            model=str(model_dir),
            adapter=str(adapter_dir),
            adapter_name="base",
            config=config,
        )
