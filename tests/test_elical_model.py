"""The EliCal confidence head: last-token reading, layers, save/load, the feature cache, the estimator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from candor.annotation.prompts import records_template
from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.backends.chat import TokenizerChat
from candor.backends.hf import HFBackend
from candor.backends.tokens import encode, last_token_index, pad_batch
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.train.elical import Budget, ConfidenceHead, EliCalConfig, FeatureCache, HeadConfig, train_elical
from candor.util.errors import CandorError

QUESTIONS = [
    "Who wrote Hamlet?",
    "What is the boiling point of water at sea level in degrees Celsius?",
    "Name the longest river in Africa, which flows through Egypt and Sudan?",
    "2+2?",
]


def make_records(n: int, start: int = 0, template: str | None = "fewshot") -> list[Record]:
    """Records with every field EliCal reads; targets vary with the question."""
    out = []
    for i in range(start, start + n):
        item = QAItem(
            id=f"toy:{i}",
            dataset="toy",
            split="train",
            question=f"What is fact number {i} about {'cats' if i % 3 else 'dogs'}?",
            answers=("x",),
        )
        out.append(
            Record(
                item=item,
                greedy=Completion("x"),
                samples=[Completion("x")] * 4,
                greedy_correct=i % 2,
                sample_correct=[i % 2, 0, 1, i % 3 == 0],
                consistency=[1, i % 2, i % 3 == 0, 0],
                provenance={"template": template} if template else {},
            )
        )
    return out


def fresh_head(tiny_model_dir: str, mode: str = "head", layer: int = -1, seed: int = 0) -> ConfidenceHead:
    from candor.train.common import load_causal_lm

    model, tokenizer = load_causal_lm(tiny_model_dir, device="cpu")
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "targets": ["q_proj", "v_proj"]} if mode == "lora" else None
    config = HeadConfig(backbone=tiny_model_dir, template="fewshot", layer=layer, mode=mode, lora=lora)
    head = ConfidenceHead.create(model, tokenizer, config, seed=seed)
    if mode == "lora":  # LoRA's B starts at zero; move it so the adapter changes the features
        with torch.no_grad():
            for name, p in head.backbone.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.5)
    return head


# ------------------------------------------------------------ last token


def test_last_token_index_under_left_and_right_padding():
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    assert last_token_index(left).tolist() == [3, 3]
    assert last_token_index(right).tolist() == [1, 2]


@pytest.mark.parametrize("mode", ["head", "lora"])
def test_same_confidence_for_a_question_whatever_the_padding(tiny_model_dir, mode):
    head = fresh_head(tiny_model_dir, mode).eval()
    seqs = encode(head.tokenizer, head.prompts(QUESTIONS))
    assert len({len(s) for s in seqs}) > 1  # the batch really needs padding
    pad = int(head.tokenizer.pad_token_id)
    with torch.no_grad():
        alone = torch.cat([head(*pad_batch([s], pad)) for s in seqs])
        left = head(*pad_batch(seqs, pad, "left"))
        right = head(*pad_batch(seqs, pad, "right"))
        # A different batch: the short question with a much longer neighbour, in the other order.
        mixed = head(*pad_batch([seqs[3], seqs[2]], pad, "right"))
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(mixed, alone[[3, 2]], atol=1e-5, rtol=1e-4)
    assert alone.std() > 0  # the head does read the question


@pytest.mark.parametrize("layer", [-1, 1])
def test_features_are_the_backends_last_token_hidden_states(tiny_model_dir, tiny_model, tokenizer, layer):
    head = fresh_head(tiny_model_dir, "head", layer=layer)
    prompts = head.prompts(QUESTIONS)
    ours = head.prompt_features(prompts, batch_size=3)
    reference = HFBackend(tiny_model, tokenizer, batch_size=2).hidden_states(prompts, layer)
    np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("mode", "layer"), [("head", -1), ("head", 1), ("lora", -1)])
def test_shared_prefix_path_gives_the_left_padded_features(tiny_model_dir, mode, layer):
    from candor.backends.tokens import usable_prefix_length

    head = fresh_head(tiny_model_dir, mode, layer=layer).eval()
    questions = QUESTIONS + ["Who painted the Mona Lisa?", "Capital of France?"]
    prompts = head.prompts(questions)
    seqs = encode(head.tokenizer, prompts)
    assert usable_prefix_length(head.backbone, seqs) > 8  # the few-shot block is shared and computed once
    with torch.no_grad():
        left = head.features(*pad_batch(seqs, int(head.tokenizer.pad_token_id))).numpy()
        confidences = head(*pad_batch(seqs, int(head.tokenizer.pad_token_id))).numpy()
    np.testing.assert_allclose(head.prompt_features(prompts, batch_size=4), left, atol=1e-4, rtol=0)
    np.testing.assert_allclose(head.predict(questions, batch_size=4), confidences, atol=1e-4, rtol=0)
    # A single prompt has nothing to share and takes the plain path: same numbers.
    np.testing.assert_allclose(head.prompt_features(prompts[:1]), left[:1], atol=1e-4, rtol=0)


def test_a_layer_out_of_range_is_a_clear_error(tiny_model_dir):
    head = fresh_head(tiny_model_dir, "head", layer=7)
    with pytest.raises(CandorError, match="layer 7 is out of range"):
        head.predict(["Who?"])


def test_raw_questions_use_the_saved_template(tiny_model_dir):
    head = fresh_head(tiny_model_dir)
    prompt = head.prompts(["Who wrote Hamlet?"])[0]
    assert prompt.startswith("Question: What is the largest planet")
    assert prompt.endswith("Question: Who wrote Hamlet?\nAnswer:")
    item = QAItem(id="a", dataset="", split="", question="Who wrote Hamlet?", answers=())
    np.testing.assert_allclose(head.predict(["Who wrote Hamlet?"]), head.predict([item]))


def test_the_records_template_is_the_one_they_were_annotated_with(tokenizer):
    chat = TokenizerChat(tokenizer, "tiny")
    assert records_template(make_records(2, template="chat"), "auto", chat) == "chat"
    assert records_template(make_records(2, template=None), "fewshot", chat) == "fewshot"
    mixed = make_records(1, template="chat") + make_records(1, 5, template="fewshot")
    with pytest.raises(CandorError, match="different prompt templates"):
        records_template(mixed, "auto", chat)


# ------------------------------------------------------------ save / load


@pytest.mark.parametrize("mode", ["head", "lora"])
def test_save_then_load_gives_identical_predictions(tiny_model_dir, tmp_path, mode):
    config = EliCalConfig(mode=mode, model=tiny_model_dir, max_epochs=2, lora_r=4, lora_alpha=8)
    result = train_elical(
        make_records(24),
        make_records(8, 100),
        method="elical",
        budget=Budget(12),
        config=config,
        out_dir=tmp_path / "head",
    )
    inputs = [*make_records(3, 200), *QUESTIONS]
    before = result.model.predict(inputs)
    loaded = ConfidenceHead.from_pretrained(tmp_path / "head")  # one line: the backbone is loaded by name
    np.testing.assert_allclose(loaded.predict(inputs), before, rtol=1e-6, atol=1e-7)
    assert loaded.config.mode == mode and loaded.config.template == "fewshot"
    assert (tmp_path / "head" / "adapter").exists() == (mode == "lora")
    assert all(not p.requires_grad for p in loaded.backbone.parameters())  # inference: nothing trainable


def test_loading_a_folder_that_is_not_a_head_fails_clearly(tmp_path):
    with pytest.raises(CandorError, match="not a saved EliCal head"):
        ConfidenceHead.from_pretrained(tmp_path)


# ------------------------------------------------------------ feature cache


class CountingExtractor:
    """The head's real feature extraction, counting the prompts that reach the model."""

    def __init__(self, head: ConfidenceHead) -> None:
        self.head = head
        self.prompts: list[str] = []

    def __call__(self, prompts):
        self.prompts.extend(prompts)
        return self.head.prompt_features(prompts)


def test_feature_cache_misses_then_hits_across_instances(tiny_model_dir, tmp_path):
    head = fresh_head(tiny_model_dir)
    prompts = head.prompts(QUESTIONS)
    extract = CountingExtractor(head)

    first = FeatureCache(tmp_path, "tiny", -1, "fewshot")
    out1 = first.get(prompts, extract)
    assert (first.misses, first.hits, len(extract.prompts)) == (4, 0, 4)

    again = FeatureCache(tmp_path, "tiny", -1, "fewshot")  # a new run: reads the shards from disk
    out2 = again.get(list(reversed(prompts)), extract)
    assert (again.misses, again.hits, len(extract.prompts)) == (0, 4, 4)  # the model did not run
    np.testing.assert_array_equal(out2, out1[::-1])
    np.testing.assert_allclose(out1, head.prompt_features(prompts), atol=1e-6)

    new = head.prompts(["A brand new question?"])
    again.get(prompts[:2] + new, extract)
    assert extract.prompts[4:] == new  # only the unseen prompt was computed
    assert (again.misses, again.hits) == (1, 6)


def test_feature_cache_is_keyed_by_layer_and_template(tiny_model_dir, tmp_path):
    head = fresh_head(tiny_model_dir)
    extract = CountingExtractor(head)
    prompts = head.prompts(QUESTIONS[:2])
    FeatureCache(tmp_path, "tiny", -1, "fewshot").get(prompts, extract)
    FeatureCache(tmp_path, "tiny", 1, "fewshot").get(prompts, extract)
    FeatureCache(tmp_path, "tiny", -1, "chat").get(prompts, extract)
    assert len(extract.prompts) == 6


def test_feature_cache_is_keyed_by_the_backbones_dtype(tiny_model_dir, tmp_path):
    """bf16 features never serve a float32 run (or back); float32 keeps the folder of older caches."""
    head = fresh_head(tiny_model_dir)
    extract = CountingExtractor(head)
    prompts = head.prompts(QUESTIONS[:2])
    FeatureCache(tmp_path, "tiny", -1, "fewshot").get(prompts, extract)
    FeatureCache(tmp_path, "tiny", -1, "fewshot", "bfloat16").get(prompts, extract)
    FeatureCache(tmp_path, "tiny", -1, "fewshot", "float32").get(prompts, extract)  # the first one's rows
    assert len(extract.prompts) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny--layer-1--fewshot", "tiny--layer-1--fewshot--bfloat16"]


def test_a_half_written_shard_is_ignored(tiny_model_dir, tmp_path):
    head = fresh_head(tiny_model_dir)
    cache = FeatureCache(tmp_path, "tiny", -1, "fewshot")
    cache.get(head.prompts(QUESTIONS[:2]), head.prompt_features)
    # A run killed after writing features but before their key file: the shard does not count.
    (cache.folder / "shard-dead.npy").write_bytes(b"partial")
    assert len(FeatureCache(tmp_path, "tiny", -1, "fewshot")) == 2


# ------------------------------------------------------------ estimator


def test_elical_estimator_scores_records_and_raw_questions(tiny_model_dir, tmp_path):
    config = EliCalConfig(mode="head", model=tiny_model_dir, max_epochs=2)
    result = train_elical(
        make_records(20), make_records(6, 50), method="eli-only", config=config, out_dir=tmp_path / "eli"
    )
    records = make_records(5, 300)
    est = get_estimator("elical", head=str(tmp_path / "eli"))
    assert est.level == "question" and not est.needs_backend
    np.testing.assert_allclose(est.estimate(records), result.model.predict(records), rtol=1e-6)
    np.testing.assert_allclose(est.score_questions(QUESTIONS), result.model.predict(QUESTIONS), rtol=1e-6)


def test_elical_estimator_in_bfloat16_is_close_to_float32_and_cached_apart(tiny_model_dir, tmp_path):
    config = EliCalConfig(mode="head", model=tiny_model_dir, max_epochs=2)
    train_elical(make_records(20), make_records(6, 50), method="eli-only", config=config, out_dir=tmp_path / "eli")
    records = make_records(8, 300)
    full = get_estimator("elical", head=str(tmp_path / "eli"))
    half = get_estimator("elical", head=str(tmp_path / "eli"), dtype="bfloat16")
    assert next(half.head.backbone.parameters()).dtype == torch.bfloat16
    assert next(full.head.backbone.parameters()).dtype == torch.float32
    a, b = full.estimate(records), half.estimate(records)
    assert not np.array_equal(a, b)  # bf16 really ran
    # A random tiny model amplifies bf16 rounding; the embedded model's drift is in benchmarks/elical_cost.py.
    np.testing.assert_allclose(b, a, atol=0.08)
    assert np.corrcoef(a, b)[0, 1] > 0.9
    assert half.describe()["dtype"] == "bfloat16" and "dtype" not in full.describe()
    with pytest.raises(CandorError, match="unknown dtype"):
        get_estimator("elical", head=str(tmp_path / "eli"), dtype="float7").estimate(records)


def test_elical_estimator_without_a_head_says_how_to_get_one():
    with pytest.raises(CandorError, match="needs a trained head"):
        get_estimator("elical").estimate(make_records(1))


def test_elical_refuses_records_annotated_by_another_backbone(tiny_model_dir, tmp_path, caplog):
    fresh_head(tiny_model_dir).save_pretrained(tmp_path / "head")
    records = make_records(3)
    for rec in records:
        rec.provenance["model"] = "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(CandorError, match=r"trained on '.*'.*annotated by 'Qwen/Qwen2.5-7B-Instruct'"):
        get_estimator("elical", head=str(tmp_path / "head")).estimate(records)
    # Allowed explicitly: scored, with a warning naming both.
    allowed = get_estimator("elical", head=str(tmp_path / "head"), allow_other_backbone=1)
    assert allowed.estimate(records).shape == (3,)
    assert "Qwen/Qwen2.5-7B-Instruct" in caplog.text
    # Records of the head's own backbone are scored without a word.
    for rec in records:
        rec.provenance["model"] = tiny_model_dir
    caplog.clear()
    get_estimator("elical", head=str(tmp_path / "head")).estimate(records)
    assert "elical" not in caplog.text


def test_score_with_another_head_in_the_same_folder_recomputes_and_warns_of_overlap(tiny_model_dir, tmp_path, caplog):
    import logging

    from candor.annotation.contamination import write_manifest
    from candor.estimators.confidences import read_confidences, score_into

    records, head, out = make_records(4), tmp_path / "head", tmp_path / "conf.jsonl"
    fresh_head(tiny_model_dir, seed=0).save_pretrained(head)
    write_manifest(head, [records[1].item.question.upper(), records[3].item.question, "an unseen question"])
    options = {"elical": {"head": str(head)}}
    with caplog.at_level(logging.INFO):
        first = score_into(records, ["elical"], out, options=options).arrays("elical")[0]
    assert (
        f"contamination: 2 of 4 records being scored are among the training questions of elical.head {head}"
        in caplog.text
        and repr(records[1].item.question) in caplog.text
    )
    fresh_head(tiny_model_dir, seed=5).save_pretrained(head)  # retrained into the same folder
    caplog.clear()
    with caplog.at_level(logging.INFO):
        second = score_into(records, ["elical"], out, options=options).arrays("elical")[0]
    assert "elical: recomputing (changed: options)" in caplog.text
    assert not np.allclose(first, second)
    np.testing.assert_allclose(second, get_estimator("elical", head=str(head)).estimate(records), rtol=1e-6)
    assert read_confidences(out).provenance("elical")["produced_by"]["options"]["head"]["path"] == str(head)


def test_feature_cache_progress_counts_the_uncached_prompts_once(tmp_path, caplog):
    import logging

    cache = FeatureCache(tmp_path, "tiny", -1, "fewshot")
    prompts = [f"question {i}" for i in range(300)]
    cache.get(prompts[:44], lambda batch: np.ones((len(batch), 2)))
    with caplog.at_level(logging.INFO, logger="candor.train.elical.features"):
        cache.get(prompts, lambda batch: np.ones((len(batch), 2)))
    lines = [r.getMessage().split(": ", 1)[1] for r in caplog.records]
    # Was "256/256 new prompts": read as how many were new, while 44 of the 300 were cached.
    assert lines == ["256 of 300 prompts not cached yet", "extracted 256 of those 256"]
    caplog.clear()
    fresh = FeatureCache(tmp_path / "other", "tiny", -1, "fewshot")
    with caplog.at_level(logging.INFO, logger="candor.train.elical.features"):
        fresh.get(prompts, lambda batch: np.ones((len(batch), 2)))
    # Was "256/300 new prompts" then "300/300 new prompts": progress that read like two different counts.
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "300 of 300 prompts not cached yet",
        "extracted 256 of those 300",
        "extracted 300 of those 300",
    ]
