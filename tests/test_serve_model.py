"""HonestModel on a tiny real model: deciding before generating, tuning on dev, one-folder save/load."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import annotated_records
from serve_counting import CountingBackend

from candor.backends.hf import HFBackend
from candor.estimators import ESTIMATORS
from candor.serve import Decoding, HonestModel, Threshold
from candor.serve import thresholds as th
from candor.serve.confidence_sources import EstimatorSource, HeadSource
from candor.util.errors import CandorError

QUESTIONS = [f"What is fact number {i} about {'cats' if i % 3 else 'dogs'}?" for i in range(8)]


def midway(values) -> float:
    v = sorted(values)
    return (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


@pytest.fixture()
def head_dir(tiny_model_dir, tmp_path):
    from candor.train.common import load_causal_lm
    from candor.train.elical import ConfidenceHead, HeadConfig

    model, tokenizer = load_causal_lm(tiny_model_dir, device="cpu")
    head = ConfidenceHead.create(model, tokenizer, HeadConfig(backbone=tiny_model_dir, template="fewshot"), seed=3)
    return head.save_pretrained(tmp_path / "head")


def test_a_head_declines_before_generating(tiny_model_dir, head_dir):
    backend = CountingBackend.from_pretrained(tiny_model_dir, device="cpu")
    source = HeadSource(head_dir)
    conf = source.score_questions(QUESTIONS)
    model = HonestModel(backend, source, threshold=midway(conf), decoding=Decoding(max_new_tokens=4))
    answers = [a[0] for a in model.answer_batch(QUESTIONS)]
    declined = [q for q, a in zip(QUESTIONS, answers, strict=True) if a.abstained]
    assert len(declined) == 4
    # Only the answered questions reached the generator.
    assert len(backend.generated) == 4
    assert not any(q in p for q in declined for p in backend.generated)
    for a, c in zip(answers, conf, strict=True):
        assert a.confidence == pytest.approx(c, rel=1e-5)
        assert a.method == "elical" and (a.answer is None) == a.abstained
        assert a.finish_reason == "abstained" if a.abstained else a.finish_reason in ("stop", "length")
    assert set(answers[0].to_dict()) >= {"answer", "confidence", "abstained", "reason", "method"}


def test_answer_level_estimators_score_the_generated_answer(tiny_backend):
    model = HonestModel(tiny_backend, "consis-lex", decoding=Decoding(max_new_tokens=4))
    assert model.source.samples == 5  # consistency needs sampled answers
    one = model.answer(QUESTIONS[0])
    assert 0.0 <= one.confidence <= 1.0 and not one.abstained and one.reason == "no threshold set"
    # The same question alone or in a batch gets the same samples (seeded by its text).
    batch = model.answer_batch(QUESTIONS[:3])
    assert batch[0][0].confidence == pytest.approx(one.confidence)
    verbal = HonestModel(tiny_backend, "verbal-letter", decoding=Decoding(max_new_tokens=4)).answer(QUESTIONS[1])
    assert verbal.method == "verbal-letter" and 0.1 <= verbal.confidence <= 0.9


def test_tune_picks_the_threshold_the_rule_gives_on_dev(tiny_backend):
    dev = annotated_records(30)
    model = HonestModel(tiny_backend, "consis-sem")
    conf = np.array([r.consistency_rate for r in dev])
    correct = np.array([r.greedy_correct for r in dev])
    t = model.tune(dev, "accuracy", 0.5)
    assert t == th.for_accuracy(conf, correct, 0.5)
    assert t.expected_accuracy >= 0.5
    t = model.tune(dev, "coverage", 0.4)
    assert t.expected_coverage >= 0.4 and t.value == th.for_coverage(conf, correct, 0.4).value
    t = model.tune(dev, "risk", 0.9, delta=0.2)
    assert t == th.risk_control(conf, correct, 0.9, 0.2) and t.rule == "risk"


def test_save_then_load_gives_the_same_answers(tiny_model_dir, head_dir, tmp_path):
    backend = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    dev = annotated_records(40)
    model = HonestModel(backend, "consis-sem", decoding=Decoding(max_new_tokens=4))
    model.tune(dev, "coverage", 0.5, calibrator="histogram")
    before = [a[0].to_dict() for a in model.answer_batch(QUESTIONS[:3])]
    folder = model.save_pretrained(tmp_path / "honest")
    saved = json.loads((folder / "honest.json").read_text())
    assert saved["threshold"]["rule"] == "coverage" and saved["threshold"]["expected_coverage"] >= 0.5
    assert saved["calibrator"]["name"] == "histogram" and saved["calibrator"]["fitted_on"] == 20
    loaded = HonestModel.from_pretrained(folder, device="cpu")
    assert loaded.threshold == model.threshold and loaded.template.name == model.template.name
    assert [a[0].to_dict() for a in loaded.answer_batch(QUESTIONS[:3])] == before
    assert before[0]["calibrated"] is True

    with_head = HonestModel(backend, HeadSource(head_dir), threshold=Threshold(0.5))
    reloaded = HonestModel.from_pretrained(with_head.save_pretrained(tmp_path / "h2"), backend=backend)
    assert (tmp_path / "h2" / "head" / "head.safetensors").exists()
    np.testing.assert_allclose(reloaded.source.score_questions(QUESTIONS), with_head.source.score_questions(QUESTIONS))


def test_loading_a_folder_that_is_not_a_model_fails_clearly(tmp_path):
    with pytest.raises(CandorError, match="not a saved honest model"):
        HonestModel.from_pretrained(tmp_path)


def test_an_advice_adapter_gives_answer_level_confidence_and_travels_with_the_model(
    tiny_model, tiny_model_dir, tmp_path
):
    import copy

    from peft import LoraConfig, get_peft_model

    from candor.serve.factory import build_model

    adapter = tmp_path / "advice"
    lora = get_peft_model(
        copy.deepcopy(tiny_model), LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    )
    lora.save_pretrained(adapter)
    # The adapter's training record names the format it was trained on (as candor.train.advice.pipeline writes it).
    (adapter / "training.json").write_text(json.dumps({"config": {"formats": ["number"], "variant": "default"}}))
    model = build_model(tiny_model_dir, adapter=adapter, threshold=0.0, max_new_tokens=3)
    assert model.method == "verbal-number" and model.backend.adapter == str(adapter)
    first = model.answer(QUESTIONS[0])
    assert first.method == "verbal-number" and 0.0 <= first.confidence <= 1.0
    folder = model.save_pretrained(tmp_path / "honest")
    assert (folder / "adapter" / "adapter_config.json").exists()
    reloaded = HonestModel.from_pretrained(folder, device="cpu")
    assert reloaded.answer(QUESTIONS[0]).to_dict() == first.to_dict()
    plain = build_model(tiny_model_dir, method="verbal-number", threshold=0.0, max_new_tokens=3)
    assert plain.answer(QUESTIONS[0]).confidence != pytest.approx(first.confidence, abs=1e-6)


class StatsCapturingBackend(HFBackend):
    """The real HF backend, recording the prompts and token ids an estimator teacher-forces."""

    forced: list[tuple[str, list[int]]]

    def token_distribution_stats(self, prompts, continuations):
        self.forced = [*getattr(self, "forced", []), *zip(prompts, [list(c) for c in continuations], strict=True)]
        return super().token_distribution_stats(prompts, continuations)


def test_served_answers_are_scored_under_the_prompt_they_were_generated_with(tiny_model, tokenizer):
    """Issue 23, defect 4: the scored token ids and prompt are the generated ones (fewshot here, though the
    tiny model has a chat template that ``auto`` would pick)."""
    backend = StatsCapturingBackend(tiny_model, tokenizer)
    model = HonestModel(backend, "token-entropy-mean", template="fewshot", decoding=Decoding(max_new_tokens=5))
    answers = [a[0] for a in model.answer_batch(QUESTIONS[:3])]
    for q, a in zip(QUESTIONS[:3], answers, strict=True):
        assert a.record.provenance["template"] == "fewshot" and a.record.provenance["model"] == backend.model_name
        assert a.record.provenance["decoding"]["greedy"]["max_new_tokens"] == 5
        prompt, ids = next((p, i) for p, i in backend.forced if p == model.prepare(q).prompt)
        assert ids == a.completion.token_ids and ids
        # Teacher-forced under the generation's prompt, a greedy token is the top-1 at its step, with its log-prob.
        stats = backend.token_distribution_stats([prompt], [ids])[0]
        np.testing.assert_allclose(stats[:, 1], a.completion.logprobs, atol=1e-4)


# Trained artefacts (served through --head, or refused below), and the ensemble, which needs its dev file.
SERVABLE_SKIP = {"elical", "probe", "ensemble"}


@pytest.mark.parametrize("name", sorted(set(ESTIMATORS.names()) - SERVABLE_SKIP))
def test_every_registered_estimator_serves(tiny_backend, name):
    """Issue 23, defect 3: sample-based estimators get their own k of samples instead of none."""
    source = EstimatorSource(name)
    model = HonestModel(tiny_backend, source, template="fewshot", decoding=Decoding(max_new_tokens=3))
    assert model.source.samples == getattr(source.estimator, "default_samples", 0)
    answer = model.answer(QUESTIONS[0])
    assert 0.0 <= answer.confidence <= 1.0 and answer.method == name
    assert "could not be scored" not in answer.reason


def test_samples_are_checked_against_the_estimator(tiny_backend):
    assert HonestModel(tiny_backend, EstimatorSource("semantic-entropy", samples=2)).source.samples == 2
    with pytest.raises(CandorError, match="reads sampled answers"):
        EstimatorSource("semantic-entropy", samples=0)
    with pytest.raises(CandorError, match="reads no sampled answers"):
        EstimatorSource("n-prob", samples=3)


def test_an_empty_greedy_answer_abstains_with_its_reason_instead_of_failing(tiny_backend):
    """Issue 23, defect 1: n-prob cannot score an empty answer; the question abstains, saying why."""
    from candor.annotation.prompts import QATemplate

    model = HonestModel(tiny_backend, "n-prob", decoding=Decoding(max_new_tokens=4))

    def render(item, backend):
        return f"Question: {item.question}\nAnswer:"

    model.template = QATemplate("plain", render)
    first = model.answer(QUESTIONS[0]).answer
    # The same prompt with a stop string that ends the answer at its first character: nothing is left.
    model.template = QATemplate("cut", render, stop=(first[:1],))
    answers = [a[0] for a in model.answer_batch(QUESTIONS[:3])]
    empty = [a for a in answers if a.abstained]
    assert empty, [a.answer for a in answers]
    for a in empty:
        assert a.reason.startswith("the answer could not be scored") and a.finish_reason == "abstained"


def test_a_method_the_backend_cannot_run_is_refused_when_the_model_is_built(tiny_model, tokenizer):
    """Issue 23, defect 3: refused at startup, not on every request."""
    from candor.backends.base import GENERATE, LOGPROBS

    class GenerateOnly(HFBackend):
        capabilities = frozenset({GENERATE, LOGPROBS})  # as a server that gives no next-token log-probs

    backend = GenerateOnly(tiny_model, tokenizer)
    with pytest.raises(CandorError, match="needs next_token_logprobs"):
        HonestModel(backend, "p-true")
    assert HonestModel(backend, "n-prob").method == "n-prob"


def test_a_source_with_fewer_samples_than_its_estimator_needs_is_refused_when_built():
    """k = 1 for an estimator that compares samples pairwise is refused up front, not at the first request."""
    with pytest.raises(CandorError, match="semantic-entropy.*--samples 2"):
        EstimatorSource("semantic-entropy", samples=1)
    assert EstimatorSource("semantic-entropy", samples=2).samples == 2
