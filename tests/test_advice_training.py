"""ADVICE / ConfTuner training: batching, the trainers' losses, LoRA-only gradients, saved adapters."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from candor.annotation.contamination import fingerprints, read_manifest
from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.backends.tokens import pad_batch
from candor.data.items import QAItem
from candor.train.advice import LossWeights, build_triplets, method_config, train
from candor.train.advice.data import (
    ExampleCollator,
    ExampleDataset,
    FormatBatchSampler,
    pair_examples,
    scored_examples,
)
from candor.train.advice.losses import brier, jsd, jsd_hinge, margin_hinge, sum_penalty
from candor.train.advice.pipeline import DONE_MARKER, build_trainer, is_trained, load_result
from candor.train.common import ATTENTION_PROJECTIONS, QUERY_VALUE
from candor.util.errors import CandorError
from candor.verbal.scorer import LabelScorer, build_prompt

QUESTIONS = [
    ("Who wrote Hamlet?", "Shakespeare", "William Shakespeare", "Charles Dickens"),
    ("What is the capital of France?", "Paris", "Paris", "Lyon"),
    ("Which planet is largest?", "Jupiter", "Jupiter", "Saturn"),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci", "Leonardo da Vinci", "Michelangelo"),
    ("What is the boiling point of water in Celsius?", "100", "100 degrees", "90 degrees"),
    ("In which year did the Berlin Wall fall?", "1989", "1989", "1991"),
    ("What gas do plants absorb?", "carbon dioxide", "oxygen", "nitrogen"),
    ("Who discovered penicillin?", "Alexander Fleming", "Louis Pasteur", "Marie Curie"),
]


def make_records() -> list[Record]:
    """Six questions answered correctly with one wrong sample each, two answered wrongly."""
    out = []
    for i, (q, gold, greedy, wrong) in enumerate(QUESTIONS):
        item = QAItem(id=f"t{i}", dataset="toy", split="train", question=q, answers=(gold,))
        correct = int(gold.lower() in greedy.lower())
        samples = [Completion(greedy, logprobs=[-0.2]), Completion(wrong, logprobs=[-0.9])]
        out.append(
            Record(
                item=item,
                greedy=Completion(greedy, logprobs=[-0.1]),
                samples=samples,
                greedy_correct=correct,
                sample_correct=[correct, 0],
                consistency=[1, 0],
            )
        )
    return out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    """The tiny Llama saved as a model directory, so each test loads a fresh copy."""
    from conftest import build_tiny_model

    path = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(len(tokenizer), seed=3).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def fresh(tiny_dir):
    from candor.train.common import load_causal_lm

    return load_causal_lm(str(tiny_dir), device="cpu")


# ---------------------------------------------------------------- batching


def test_format_batch_sampler_keeps_one_format_per_batch():
    formats = [0] * 7 + [1] * 5
    sampler = FormatBatchSampler(formats, batch_size=3, seed=1)
    assert len(sampler) == 3 + 2
    orders = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert all(len({formats[i] for i in b}) == 1 for b in batches)
        assert sorted(i for b in batches for i in b) == list(range(12))
        orders.append(batches)
    assert orders[0] != orders[1]  # reshuffled each epoch
    sampler.set_epoch(0)
    assert list(sampler) == orders[0]  # seeded
    dropping = FormatBatchSampler(formats, batch_size=3, drop_last=True)
    assert len(dropping) == 3 and all(len(b) == 3 for b in dropping)
    with pytest.raises(CandorError, match="batch size"):
        FormatBatchSampler(formats, batch_size=0)


def test_format_batch_sampler_groups_similar_lengths():
    lengths = [5, 11, 0, 7, 3, 9, 1, 10, 2, 8, 6, 4]
    formats = [0] * 12
    sampler = FormatBatchSampler(formats, batch_size=3, lengths=lengths, group=4)  # one group of 12
    batches = [sorted(lengths[i] for i in b) for b in sampler]
    assert sorted(batches) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    with pytest.raises(CandorError, match="lengths"):
        FormatBatchSampler(formats, batch_size=3, lengths=[1, 2])


def test_pair_collator_puts_correct_rows_first(tokenizer):
    triplets = build_triplets(make_records()).triplets
    examples = pair_examples(tokenizer, triplets[:2], ["letter", "number"])
    assert [e["format"] for e in examples] == [0, 0, 1, 1]
    batch = ExampleCollator(tokenizer.pad_token_id)(examples[:2])
    assert batch["input_ids"].shape[0] == 4 and batch["format"].tolist() == [0, 0]
    first = build_prompt(tokenizer, triplets[0].item, triplets[0].a_wrong, "letter")
    width = batch["input_ids"].shape[1]
    assert batch["input_ids"][2, width - len(first.ids) :].tolist() == list(first.ids)  # a_wrong of pair 0
    assert batch["targets"][2:].sum() == 0  # the LM term reads a_correct's answer only
    answer = batch["input_ids"][0][batch["targets"][0]]
    assert tokenizer.decode(answer).strip() == triplets[0].a_correct
    with pytest.raises(CandorError, match="mixes formats"):
        ExampleCollator(tokenizer.pad_token_id)([examples[0], examples[2]])


def test_scored_examples_carry_correctness(tokenizer):
    records = make_records()
    examples = scored_examples(tokenizer, records, ["number"])
    assert [e["correct"] for e in examples] == [r.greedy_correct for r in records]
    batch = ExampleCollator(tokenizer.pad_token_id, "right")(examples[:3])
    assert batch["correct"].tolist() == [1.0, 1.0, 1.0] and batch["attention_mask"][:, 0].all()
    unlabeled = Record(item=records[0].item, greedy=records[0].greedy, samples=[], greedy_correct=None)
    with pytest.raises(CandorError, match="no greedy correctness"):
        scored_examples(tokenizer, [unlabeled], ["number"])


# ---------------------------------------------------------------- the trainers


def advice_trainer(tiny_dir, tmp_path, tokenizer, weights=None, **overrides):
    model, tok = fresh(tiny_dir)
    settings = {"model": str(tiny_dir), "batch_size": 3, "gradient_accumulation": 1, "epochs": 1}
    config = method_config("advice", **{**settings, **({"weights": weights} if weights else {}), **overrides})
    triplets = build_triplets(make_records()).triplets
    dataset = ExampleDataset(pair_examples(tok, triplets, config.formats))
    return build_trainer(config, model, tok, dataset, None, tmp_path), config


def test_one_format_per_batch_through_the_trainer(tiny_dir, tmp_path, tokenizer):
    trainer, _ = advice_trainer(tiny_dir, tmp_path, tokenizer)
    for epoch in range(2):
        loader = trainer.get_train_dataloader()
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == 4  # 6 pairs × 2 formats in batches of 3
        assert all(len(set(b["format"].tolist())) == 1 for b in batches)
        assert sorted(int(b["format"][0]) for b in batches) == [0, 0, 1, 1]


def test_advice_loss_is_the_sum_of_its_terms(tiny_dir, tmp_path, tokenizer):
    trainer, _ = advice_trainer(tiny_dir, tmp_path, tokenizer)
    batch = next(iter(trainer.get_train_dataloader()))
    scorer = trainer.scorers[int(batch["format"][0])]
    model = trainer.model
    terms = trainer.loss_terms(model, batch, scorer)
    assert sorted(terms) == ["jsd", "lm", "margin", "sum"]
    # Recompute each term by hand from the pair's two distributions.
    pairs = batch["format"].shape[0]
    with torch.no_grad():
        out = scorer.forward(model, batch["input_ids"], batch["attention_mask"], targets=batch["targets"])
    lp_c, lp_w = out.log_probs[:pairs], out.log_probs[pairs:]
    mu_c, mu_w = scorer.expected_value(lp_c), scorer.expected_value(lp_w)
    expected = {
        "jsd": jsd_hinge(lp_c, lp_w).mean(),
        "margin": margin_hinge(mu_c, mu_w).mean(),
        "sum": sum_penalty(mu_c, mu_w).mean(),
        "lm": -out.token_logprobs.sum() / batch["targets"].sum(),
    }
    for name, value in expected.items():
        assert terms[name].item() == pytest.approx(value.item(), rel=1e-4, abs=1e-6), name
    loss = trainer.compute_loss(model, batch)
    assert loss.item() == pytest.approx(sum(v.item() for v in terms.values()), rel=1e-5)


def test_switched_off_terms_are_not_computed(tiny_dir, tmp_path, tokenizer):
    weights = LossWeights(lm=1.0, jsd=0.0, margin=2.0, sum=0.0, brier=0.5)
    trainer, _ = advice_trainer(tiny_dir, tmp_path, tokenizer, weights=weights)
    batch = next(iter(trainer.get_train_dataloader()))
    scorer = trainer.scorers[int(batch["format"][0])]
    terms = trainer.loss_terms(trainer.model, batch, scorer)
    assert sorted(terms) == ["brier", "lm", "margin"]
    pairs = batch["format"].shape[0]
    with torch.no_grad():
        lp = scorer.log_distribution(trainer.model, batch["input_ids"], batch["attention_mask"])
    y = torch.tensor([1.0] * pairs + [0.0] * pairs)
    assert terms["brier"].item() == pytest.approx(brier(lp, scorer.values, y).mean().item(), rel=1e-4)
    loss = trainer.compute_loss(trainer.model, batch)
    expected = terms["lm"] + 2.0 * terms["margin"] + 0.5 * terms["brier"]
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_gradients_reach_only_the_lora_weights(tiny_dir, tmp_path, tokenizer):
    trainer, _ = advice_trainer(tiny_dir, tmp_path, tokenizer)
    model = trainer.model
    model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.compute_loss(model, batch).backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    targets = {n.split(".lora_A")[0].split(".")[-1] for n in trainable if "lora_A" in n}
    assert targets == set(ATTENTION_PROJECTIONS)
    for name, p in model.named_parameters():
        if "lora_" not in name:
            assert p.grad is None, name
    grads = [p.grad.abs().sum().item() for n, p in model.named_parameters() if "lora_B" in n]
    assert sum(grads) > 0  # B starts at zero, so its gradient is what moves first


def test_conftuner_trains_on_single_answers(tiny_dir, tmp_path, tokenizer):
    model, tok = fresh(tiny_dir)
    config = method_config("conftuner", model=str(tiny_dir), batch_size=4, gradient_accumulation=1)
    dataset = ExampleDataset(scored_examples(tok, make_records(), config.formats))
    trainer = build_trainer(config, model, tok, dataset, None, tmp_path)
    batch = next(iter(trainer.get_train_dataloader()))
    scorer = trainer.scorers[int(batch["format"][0])]
    terms = trainer.loss_terms(trainer.model, batch, scorer)
    assert sorted(terms) == ["brier"]
    with torch.no_grad():
        lp = scorer.log_distribution(trainer.model, batch["input_ids"], batch["attention_mask"])
    assert terms["brier"].item() == pytest.approx(brier(lp, scorer.values, batch["correct"]).mean().item(), rel=1e-4)
    trainable = {
        n.split(".lora_A")[0].split(".")[-1]
        for n, p in trainer.model.named_parameters()
        if p.requires_grad and "lora_A" in n
    }
    assert trainable == set(QUERY_VALUE)
    with pytest.raises(CandorError, match="pairwise"):
        method_config("conftuner", weights=LossWeights())


# ---------------------------------------------------------------- presets


def test_presets_are_the_papers_settings():
    advice = method_config("advice")
    assert (advice.lora_r, advice.lora_alpha, advice.lora_targets) == (16, 32, ATTENTION_PROJECTIONS)
    assert (
        advice.learning_rate,
        advice.warmup_ratio,
        advice.batch_size,
        advice.gradient_accumulation,
        advice.epochs,
    ) == (1e-5, 0.05, 16, 2, 4.0)
    assert advice.weights.active() == ["lm", "jsd", "margin", "sum"] and advice.formats == ("letter", "number")
    conftuner = method_config("conftuner")
    assert (conftuner.lora_r, conftuner.lora_alpha, conftuner.lora_targets) == (8, 32, QUERY_VALUE)
    assert conftuner.weights.active() == ["brier"] and conftuner.data == "answers"
    both = method_config("advice+conftuner")
    assert both.weights.active() == ["lm", "jsd", "margin", "sum", "brier"] and both.lora_r == 16
    with pytest.raises(CandorError, match="unknown confidence training method 'elical'"):
        method_config("elical")
    with pytest.raises(CandorError, match="bad training option"):
        method_config("advice", epoch=3)
    with pytest.raises(CandorError, match="unknown verbalized confidence format"):
        method_config("advice", formats=("emoji",))


# ---------------------------------------------------------------- saved adapters


def _mu(model, tok, records, fmt):
    scorer = LabelScorer(tok, fmt)
    prompts = [build_prompt(tok, r.item, r.greedy.text, fmt) for r in records]
    ids, mask = pad_batch([p.ids for p in prompts], tok.pad_token_id)
    with torch.no_grad():
        return scorer.expected_value(scorer.log_distribution(model, ids, mask)).numpy()


def test_trained_adapter_reloads_with_identical_confidences(tiny_dir, tmp_path, tokenizer):
    from candor.backends.hf import HFBackend
    from candor.estimators import get_estimator

    trainer, _ = advice_trainer(tiny_dir, tmp_path, tokenizer, learning_rate=0.05, epochs=2)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    model = trainer.model.eval()
    records = make_records()
    base, _ = fresh(tiny_dir)
    reloaded = HFBackend.from_pretrained(str(tiny_dir), adapter=str(tmp_path / "adapter"), device="cpu")
    for fmt in ("letter", "number"):
        in_memory = _mu(model, tokenizer, records, fmt)
        assert np.abs(in_memory - _mu(base, tokenizer, records, fmt)).max() > 1e-3  # training changed it
        estimated = get_estimator(f"verbal-{fmt}").estimate(records, reloaded)
        np.testing.assert_allclose(estimated, in_memory, atol=1e-5)


def test_train_end_to_end_writes_an_adapter_for_every_format(tiny_dir, tmp_path):
    from candor.backends.hf import HFBackend
    from candor.estimators import get_estimator

    out = tmp_path / "advice"
    config = method_config(
        "advice", model=str(tiny_dir), batch_size=2, gradient_accumulation=2, epochs=1, extra_samples=2, logging_steps=1
    )
    result = train(config, make_records(), out)
    assert is_trained(out) and (out / DONE_MARKER).exists() and (out / "adapter_config.json").exists()
    assert len((out / "triplets.jsonl").read_text().splitlines()) == 6
    saved = load_result(out)
    assert saved["n_train"] == 12 and saved["triplet_stats"]["from_samples"] == 6
    assert saved["cost"]["wall_s"] > 0 and saved["cost"]["peak_rss_mib"] > 0
    steps = [h for h in saved["history"] if "loss" in h]
    assert len(steps) == 3 and all("loss_jsd" in h and "loss_lm" in h for h in steps)
    assert saved["config"]["weights"]["jsd"] == 1.0 and result.n_train == 12
    backend = HFBackend.from_pretrained(str(tiny_dir), adapter=str(out), device="cpu")
    records = make_records()[:3]
    for fmt in ("letter", "number", "text", "float", "percent"):  # three formats unseen in training
        values = get_estimator(f"verbal-{fmt}").estimate(records, backend)
        assert values.shape == (3,) and np.all((values >= 0) & (values <= 1))
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 16


@pytest.mark.parametrize("method", ["conftuner", "advice+conftuner"])
def test_other_methods_train_and_save(tiny_dir, tmp_path, method):
    out = tmp_path / method
    config = method_config(
        method, model=str(tiny_dir), batch_size=4, gradient_accumulation=1, epochs=1, extra_samples=0
    )
    result = train(config, make_records(), out, dev_records=make_records()[:4])
    assert is_trained(out)
    assert any("eval_loss" in h for h in result.history)  # the dev split is evaluated each epoch
    # ConfTuner learns from every answer; the pair methods only from the six questions answered correctly.
    trained = [q for q, *_ in QUESTIONS] if method == "conftuner" else [q for q, *_ in QUESTIONS[:6]]
    assert read_manifest(out) == fingerprints(trained)
    active = config.weights.active()
    assert all(f"loss_{name}" in result.history[0] for name in active)


def test_train_refuses_what_it_cannot_use(tiny_dir, tmp_path):
    wrong_only = [r for r in make_records() if r.greedy_correct == 0]
    with pytest.raises(CandorError, match="no training examples"):
        train(method_config("advice", model=str(tiny_dir), extra_samples=0), wrong_only, tmp_path / "x")
    with pytest.raises(CandorError, match="needs training records or triplets"):
        train(method_config("advice", model=str(tiny_dir)), None, tmp_path / "y")
    assert not is_trained(tmp_path / "x")


def test_the_pairwise_terms_can_separate_a_pair_when_trained_alone(tiny_dir, tmp_path, tokenizer):
    """The JSD and margin gradients really reach the LoRA weights: overfitting a few pairs pulls them apart."""
    torch.manual_seed(0)  # the LoRA init draws from the global generator: keep the outcome independent of test order
    weights = LossWeights(lm=0.0, jsd=1.0, margin=1.0, sum=0.0)
    trainer, config = advice_trainer(
        tiny_dir, tmp_path, tokenizer, weights=weights, learning_rate=0.01, epochs=20, formats=("number",)
    )
    # Collate directly: a second prepared dataloader left half-read would skew accelerate's accumulation state.
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    scorer = trainer.scorers[int(batch["format"][0])]

    def gap_and_jsd() -> tuple[float, float]:
        with torch.no_grad():
            lp = scorer.log_distribution(trainer.model, batch["input_ids"], batch["attention_mask"])
        pairs = batch["format"].shape[0]
        mu = scorer.expected_value(lp)
        return float((mu[:pairs] - mu[pairs:]).mean()), float(jsd(lp[:pairs], lp[pairs:]).mean())

    gap_before, jsd_before = gap_and_jsd()
    trainer.train()
    gap_after, jsd_after = gap_and_jsd()
    # From an untrained start (gap ≈ 0, JSD ≈ 1e-6) both must move well clear of zero.
    assert gap_after > gap_before + 0.05, (gap_before, gap_after)
    assert jsd_after > jsd_before + 0.01, (jsd_before, jsd_after)
