"""EliCal training: the loss, early stopping, the two stages, targets, budgets, the dev slice, bad input."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.train.common import training_arguments
from candor.train.elical import (
    WHOLE_POOL,
    Budget,
    ConfidenceHead,
    EliCalConfig,
    LinearHead,
    carve_dev,
    check_disjoint,
    targets,
    train_elical,
)
from candor.train.elical.trainer import (
    BestOnDev,
    EliCalTrainer,
    PromptCollator,
    auroc_metrics,
    collate_features,
    epoch_history,
    feature_examples,
)
from candor.util.errors import CandorError


def make_records(n: int, start: int = 0, **drop: bool) -> list[Record]:
    """Annotated records; ``drop`` names fields to leave out (consistency, sample_correct, greedy_correct)."""
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
                greedy_correct=None if drop.get("greedy_correct") else i % 2,
                sample_correct=None if drop.get("sample_correct") else [i % 2, 0, 1, int(i % 3 == 0)],
                consistency=None if drop.get("consistency") else [1, i % 2, int(i % 3 == 0), 0],
                provenance={"template": "fewshot"},
            )
        )
    return out


def lora_config(tiny_model_dir: str, **kw) -> EliCalConfig:
    return EliCalConfig(mode="lora", model=tiny_model_dir, lora_r=4, lora_alpha=8, max_epochs=2, **kw)


# ------------------------------------------------------------ targets


def test_stage_targets_are_the_consistency_rate_the_sample_accuracy_and_greedy_correctness():
    rec = make_records(1, start=3)[0]  # i=3: consistency [1,1,1,0], sample_correct [1,0,1,1], greedy 1
    assert targets([rec], "consistency").tolist() == [0.75]
    assert targets([rec], "soft").tolist() == [0.75]
    rec.sample_correct = [0, 0, 1, 0]
    assert targets([rec], "soft").tolist() == [0.25]
    assert targets([rec], "hard").tolist() == [1.0]


def test_target_errors_name_the_record_the_field_and_where_it_came_from():
    recs = make_records(3) + make_records(1, start=3, consistency=True)
    message = (
        "record 'toy:3' has no 'consistency' (1 of 4 records lack it): stage 1 (Eli) trains on the consistency "
        "rate; annotate with samples and a consistency judge"
    )
    with pytest.raises(CandorError) as plain:
        targets(recs, "consistency")
    assert str(plain.value) == message
    with pytest.raises(CandorError) as located:
        targets(recs, "consistency", source="pool.jsonl", what="the training pool")
    assert str(located.value) == "pool.jsonl:4: " + message.replace("'toy:3' has", "'toy:3' of the training pool has")
    assert targets(recs[:3], "soft").dtype == np.float32


# ------------------------------------------------------------ the trainer


def arguments(tmp_path, epochs: int, lr: float = 0.1, evaluate: bool = True, weight_decay: float = 0.0):
    return training_arguments(
        tmp_path,
        learning_rate=lr,
        epochs=epochs,
        batch_size=4,
        weight_decay=weight_decay,
        eval_strategy="epoch" if evaluate else "no",
        label_names=["labels"],
        prediction_loss_only=True,
    )


def test_the_loss_is_the_mean_squared_error_to_the_targets(tmp_path):
    head = LinearHead(2)
    with torch.no_grad():
        head.linear.weight.copy_(torch.tensor([[1.0, -1.0]]))
        head.linear.bias.zero_()
    trainer = EliCalTrainer(model=head, args=arguments(tmp_path, 1, evaluate=False))
    batch = {"features": torch.tensor([[0.0, 0.0], [2.0, 0.0]]), "labels": torch.tensor([0.5, 1.0])}
    expected = ((0.5 - 0.5) ** 2 + (1 / (1 + math.exp(-2.0)) - 1.0) ** 2) / 2
    assert trainer.compute_loss(head, batch).item() == pytest.approx(expected, rel=1e-6)


def test_early_stopping_stops_after_patience_and_restores_the_best_weights(tmp_path):
    # Training pushes confidence up (targets 1) while the dev slice wants it down (targets 0):
    # the dev loss is best after epoch 1 and only gets worse.
    rng = np.random.default_rng(0)
    x, x_dev = rng.normal(size=(16, 3)).astype(np.float32), rng.normal(size=(8, 3)).astype(np.float32)
    head = LinearHead(3)
    stopper = BestOnDev(patience=4)
    trainer = EliCalTrainer(
        model=head,
        args=arguments(tmp_path, 50),
        train_dataset=feature_examples(x, np.ones(16)),
        eval_dataset=feature_examples(x_dev, np.zeros(8)),
        data_collator=collate_features,
        callbacks=[stopper],
    )
    trainer.train()
    assert stopper.stopped_early and stopper.best_epoch == 1.0
    assert trainer.state.epoch == 5.0  # the best epoch, then 4 without improvement
    with torch.no_grad():
        final_dev_loss = torch.mean(head(torch.from_numpy(x_dev)) ** 2).item()
    assert final_dev_loss == pytest.approx(stopper.best_loss, rel=1e-5)
    history = epoch_history(trainer.state.log_history)
    assert [h["epoch"] for h in history] == [1.0, 2.0, 3.0, 4.0, 5.0]
    log = trainer.state.log_history
    assert [h["dev_loss"] for h in history] == [e["eval_loss"] for e in log if "eval_loss" in e]
    assert [h["train_loss"] for h in history] == [e["loss"] for e in log if "loss" in e]


def test_epoch_history_merges_a_trainer_log_by_epoch_and_drops_rows_without_a_loss():
    # A Trainer's log_history with 3 steps per epoch, a loss logged every 2 steps, evaluation every epoch,
    # and max_steps=7: epochs are fractions of 3 steps, and the closing summary entry carries no loss.
    log = [
        {"loss": 0.9, "grad_norm": 1.5, "learning_rate": 0.08, "epoch": 2 / 3, "step": 2},
        {"eval_loss": 0.8, "eval_runtime": 0.01, "epoch": 1.0, "step": 3},
        {"loss": 0.7, "grad_norm": 1.1, "learning_rate": 0.04, "epoch": 4 / 3, "step": 4},
        {"loss": 0.6, "grad_norm": 0.9, "learning_rate": 0.02, "epoch": 2.0, "step": 6},
        {"eval_loss": 0.65, "eval_runtime": 0.01, "epoch": 2.0, "step": 6},
        {"train_runtime": 0.3, "train_loss": 0.73, "epoch": 7 / 3, "step": 7},
    ]
    assert epoch_history(log) == [
        {"epoch": 0.667, "train_loss": 0.9},
        {"epoch": 1.0, "dev_loss": 0.8},
        {"epoch": 1.333, "train_loss": 0.7},
        {"epoch": 2.0, "train_loss": 0.6, "dev_loss": 0.65},
    ]


def test_feature_rows_are_float32_and_prompts_pad_on_the_side_asked():
    examples = feature_examples(np.arange(6, dtype=np.float64).reshape(3, 2), np.array([1, 0, 1]))
    batch = collate_features([examples[i] for i in range(3)])
    assert batch["features"].dtype == torch.float32
    assert batch["features"].tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert batch["labels"].dtype == torch.float32 and batch["labels"].tolist() == [1.0, 0.0, 1.0]
    prompts = [{"input_ids": [5, 6, 7], "labels": 1.0}, {"input_ids": [8], "labels": 0.0}]
    left, right = PromptCollator(pad_id=0)(prompts), PromptCollator(pad_id=0, side="right")(prompts)
    assert left["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert left["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert right["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert right["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert right["labels"].dtype == torch.float32 and right["labels"].tolist() == [1.0, 0.0]


def test_the_head_gets_its_own_learning_rate_in_lora_mode(tiny_model_dir, tmp_path):
    from candor.train.common import load_causal_lm
    from candor.train.elical.model import HeadConfig

    model, tokenizer = load_causal_lm(tiny_model_dir, device="cpu")
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "targets": ["q_proj"]}
    head = ConfidenceHead.create(
        model, tokenizer, HeadConfig(backbone=tiny_model_dir, template="fewshot", mode="lora", lora=lora)
    )
    trainer = EliCalTrainer(
        model=head,
        args=arguments(tmp_path, 1, lr=5e-5, evaluate=False, weight_decay=0.1),
        head_parameters=head.head.parameters(),
        head_learning_rate=1e-3,
    )
    optimizer = trainer.create_optimizer()
    rates = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    assert {rates[id(p)] for p in head.head.parameters()} == {1e-3}
    # The head's groups keep the rest of their settings: weight decay on its weight, none on its bias.
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert {n: decay[id(p)] for n, p in head.head.named_parameters()} == {"linear.weight": 0.1, "linear.bias": 0.0}
    lora_params = [p for n, p in head.backbone.named_parameters() if "lora_" in n]
    assert lora_params and {rates[id(p)] for p in lora_params} == {5e-5}
    assert len(rates) == len(lora_params) + 2  # nothing frozen is optimized


# ------------------------------------------------------------ stages


def test_stage_two_updates_the_lora_weights_it_resumes(tiny_model_dir, tmp_path):
    train, dev = make_records(24), make_records(8, 100)
    eli = train_elical(train, dev, method="eli-only", config=lora_config(tiny_model_dir), out_dir=tmp_path / "eli")
    stage1 = load_file(str(tmp_path / "eli" / "adapter" / "adapter_model.safetensors"))
    resumed = ConfidenceHead.from_pretrained(tmp_path / "eli", trainable=True)
    assert all(p.requires_grad for n, p in resumed.backbone.named_parameters() if "lora_" in n)

    cal = train_elical(
        train,
        dev,
        method="elical",
        init_from=tmp_path / "eli",
        budget=Budget(12),
        config=lora_config(tiny_model_dir),
        out_dir=tmp_path / "elical",
    )
    stage2 = load_file(str(tmp_path / "elical" / "adapter" / "adapter_model.safetensors"))
    assert stage1.keys() == stage2.keys() and stage1
    changed = [k for k in stage1 if not torch.allclose(stage1[k], stage2[k])]
    assert changed and any("lora_A" in k for k in changed) and any("lora_B" in k for k in changed)
    assert [s.name for s in cal.stages] == ["cal"] and cal.n_train == 12
    assert not torch.allclose(eli.model.head.linear.weight, cal.model.head.linear.weight)


def test_elical_runs_both_stages_and_records_each(tiny_model_dir, tmp_path):
    config = EliCalConfig(mode="head", model=tiny_model_dir, max_epochs=3)
    result = train_elical(
        make_records(30),
        make_records(8, 100),
        method="elical",
        budget=Budget(10),
        config=config,
        out_dir=tmp_path / "h",
    )
    eli, cal = result.stages
    assert (eli.name, eli.target, eli.n_train, eli.n_dev) == ("eli", "consistency", 30, 8)
    assert (cal.name, cal.target, cal.n_train) == ("cal", "soft", 10)
    assert len(eli.history) == eli.epochs_run == 3 and all("dev_loss" in h for h in eli.history)
    assert cal.best_dev_loss == min(h["dev_loss"] for h in cal.history)
    assert set(result.cost) == {"wall_s", "peak_rss_mib"} and result.cost["peak_rss_mib"] > 0
    assert (tmp_path / "h" / "training.json").exists()


def test_the_paper_epoch_rule_and_the_cap():
    # 50 up to 10k labels, 15 above, 10 on the full set whatever its size (the official scripts' rule).
    assert EliCalConfig().epochs_for(1000) == 50
    assert EliCalConfig().epochs_for(10_000) == 50
    assert EliCalConfig().epochs_for(10_001) == 15
    assert EliCalConfig().epochs_for(1000, full_set=True) == 10
    assert EliCalConfig().epochs_for(560_000, full_set=True) == 10
    assert EliCalConfig(max_epochs=3).epochs_for(1000) == 3
    assert EliCalConfig(max_epochs=30).epochs_for(1000, full_set=True) == 10
    assert EliCalConfig(epochs=7).epochs_for(20_000) == 7
    assert EliCalConfig(epochs=7).epochs_for(200, full_set=True) == 7


def test_each_stage_plans_the_epochs_of_its_set(tiny_model_dir, tmp_path):
    """Stage 1 trains on the full pool (10 epochs), stage 2 on a budget (50) or on the full pool (10)."""
    train, dev = make_records(30), make_records(6, start=100)
    config = EliCalConfig(mode="head", model=tiny_model_dir, patience=1, feature_cache=str(tmp_path / "f"))
    budget = train_elical(train, dev, method="elical", config=config, out_dir=tmp_path / "a", budget=Budget(10))
    assert [s.epochs_planned for s in budget.stages] == [10, 50]
    everything = train_elical(train, dev, method="cal-only", config=config, out_dir=tmp_path / "b", budget=WHOLE_POOL)
    assert [s.epochs_planned for s in everything.stages] == [10]


# ------------------------------------------------------------ budgets and the dev slice


def test_budgets_are_seeded_nested_and_all_is_the_pool():
    pool = make_records(50)
    small, large = Budget(10).draw(pool, seed=1), Budget(25).draw(pool, seed=1)
    assert [r.id for r in large[:10]] == [r.id for r in small]
    assert [r.id for r in Budget(10).draw(pool, seed=1)] == [r.id for r in small]
    assert [r.id for r in Budget(10).draw(pool, seed=2)] != [r.id for r in small]
    assert len(WHOLE_POOL.draw(pool)) == 50
    assert Budget.parse("250") == Budget(250) and Budget.parse("ALL") == WHOLE_POOL
    assert (str(Budget.parse("250")), str(Budget.parse("ALL"))) == ("250", "all")
    with pytest.raises(CandorError, match="positive number or 'all'"):
        Budget.parse("lots")


def test_a_budget_larger_than_the_pool_is_an_error_not_a_clip(tiny_model_dir, tmp_path):
    with pytest.raises(CandorError, match="label budget 60 is larger than the labelled pool \\(50 records\\)"):
        Budget(60).draw(make_records(50))
    with pytest.raises(CandorError, match="larger than the labelled pool"):
        train_elical(
            make_records(20),
            make_records(4, 100),
            method="cal-only",
            budget=Budget(21),
            config=EliCalConfig(model=tiny_model_dir),
            out_dir=tmp_path,
        )
    assert not any(tmp_path.iterdir())  # failed before training anything


def test_the_carved_dev_slice_never_overlaps_training_or_test():
    pool, test = make_records(40), make_records(10, 1000)
    train, dev = carve_dev(pool, 0.2, seed=3)
    assert len(dev) == 8 and len(train) == 32
    assert not {r.id for r in dev} & {r.id for r in train}
    assert not {r.item.question for r in dev} & {r.item.question for r in test}
    check_disjoint(dev, test, "dev")  # no error
    # The same question under another id (a duplicate across files) is caught by its text.
    leaked = make_records(1, 1003)[0]
    leaked.item = QAItem(id="elsewhere:1", dataset="toy", split="dev", question=leaked.item.question, answers=("x",))
    with pytest.raises(CandorError, match="dev record 'elsewhere:1' is also a test question"):
        check_disjoint([*dev, leaked], test, "dev")


# ------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("method", "drop", "field"),
    [
        ("eli-only", "consistency", "consistency"),
        ("elical", "consistency", "consistency"),
        ("cal-only", "sample_correct", "sample_correct"),
    ],
)
def test_missing_fields_fail_early_naming_field_record_and_line(tiny_model_dir, tmp_path, method, drop, field):
    train = make_records(5) + make_records(5, 5, **{drop: True})
    with pytest.raises(CandorError) as err:
        train_elical(
            train,
            make_records(4, 100),
            method=method,
            config=EliCalConfig(model=tiny_model_dir),
            out_dir=tmp_path,
            source="pool.jsonl",
        )
    message = str(err.value)
    assert message.startswith("pool.jsonl:6:") and "'toy:5'" in message and repr(field) in message
    assert "5 of 10 records" in message


def test_hard_targets_need_greedy_correctness_and_the_dev_slice_is_checked_too(tiny_model_dir, tmp_path):
    config = EliCalConfig(model=tiny_model_dir, cal_target="hard")
    with pytest.raises(CandorError, match="'greedy_correct'"):
        train_elical(
            make_records(6, greedy_correct=True),
            make_records(4, 100),
            method="cal-only",
            config=config,
            out_dir=tmp_path,
        )
    with pytest.raises(CandorError, match="'toy:100' of the dev slice has no 'consistency'"):
        train_elical(
            make_records(6),
            make_records(4, 100, consistency=True),
            method="eli-only",
            config=EliCalConfig(model=tiny_model_dir),
            out_dir=tmp_path,
        )


def test_bad_settings_are_named():
    with pytest.raises(CandorError, match="unknown EliCal mode 'full'"):
        EliCalConfig(mode="full")
    with pytest.raises(CandorError, match="'soft' .* or 'hard'"):
        EliCalConfig(cal_target="greedy")
    with pytest.raises(CandorError, match="unknown EliCal method 'cal'"):
        train_elical(make_records(4), make_records(2, 10), method="cal", out_dir=".")
    with pytest.raises(CandorError, match="init_from resumes a stage-1 head"):
        train_elical(make_records(4), make_records(2, 10), method="cal-only", init_from="x", out_dir=".")
    with pytest.raises(CandorError, match="needs a dev slice"):
        train_elical(make_records(4), [], method="eli-only", out_dir=".")


@pytest.mark.parametrize("recenter", [True, False])
def test_stage_two_keeps_the_stage_one_weights_and_recentres_only_the_bias(tiny_model_dir, tmp_path, recenter):
    train, dev = make_records(30), make_records(8, 100)
    config = EliCalConfig(mode="head", model=tiny_model_dir, max_epochs=3)
    eli = train_elical(train, dev, method="eli-only", config=config, out_dir=tmp_path / "eli")
    frozen = EliCalConfig(
        mode="head", model=tiny_model_dir, max_epochs=1, head_learning_rate=0.0, recenter_bias=recenter
    )
    cal = train_elical(
        train,
        dev,
        method="elical",
        init_from=tmp_path / "eli",
        budget=Budget(12),
        config=frozen,
        out_dir=tmp_path / "cal",
    )
    before, after = eli.model.head, cal.model.head
    torch.testing.assert_close(after.linear.weight, before.linear.weight)
    torch.testing.assert_close(after.mean, before.mean)  # the stage-1 standardization is kept
    mean_target = float(targets(Budget(12).draw(train, seed=0), "soft").mean())
    expected = math.log(mean_target / (1 - mean_target)) if recenter else before.linear.bias.item()
    assert after.linear.bias.item() == pytest.approx(expected, rel=1e-6)


def test_patience_running_out_on_the_last_planned_epoch_is_not_an_early_stop(tmp_path):
    # The same run as above, planned for exactly the 5 epochs it runs: it ran every epoch, so it did not stop early.
    rng = np.random.default_rng(0)
    x, x_dev = rng.normal(size=(16, 3)).astype(np.float32), rng.normal(size=(8, 3)).astype(np.float32)
    stopper = BestOnDev(patience=4)
    trainer = EliCalTrainer(
        model=LinearHead(3),
        args=arguments(tmp_path, 5),
        train_dataset=feature_examples(x, np.ones(16)),
        eval_dataset=feature_examples(x_dev, np.zeros(8)),
        data_collator=collate_features,
        callbacks=[stopper],
    )
    trainer.train()
    assert trainer.state.epoch == 5.0 and stopper.bad_epochs == 4 and stopper.best_epoch == 1.0
    assert not stopper.stopped_early


# ------------------------------------------------------------ stage 2's rule (issue 13)


def _evaluate(stopper: BestOnDev, head: LinearHead, epoch: int, auroc: float, loss: float) -> SimpleNamespace:
    """One epoch's evaluation as the Trainer reports it; the head's weight is set to the epoch number."""
    with torch.no_grad():
        head.linear.weight.fill_(float(epoch))
    control = SimpleNamespace(should_training_stop=False)
    stopper.on_evaluate(
        None, SimpleNamespace(epoch=float(epoch)), control, metrics={"eval_auroc": auroc, "eval_loss": loss}, model=head
    )
    return control


@pytest.mark.parametrize(("metric", "best"), [("auroc", 2), ("loss", 3)])
def test_early_stopping_on_dev_auroc_keeps_the_epoch_with_the_best_auroc(metric, best):
    # Epoch 2 ranks the dev slice best; epoch 3 has the lowest dev loss. Each rule keeps its own epoch.
    history = [(0.60, 0.10), (0.80, 0.30), (0.70, 0.05), (0.65, 0.20), (0.62, 0.25), (0.61, 0.26)]
    head, stopper = LinearHead(2), BestOnDev(patience=3, metric=metric)
    stops = [
        _evaluate(stopper, head, epoch, auroc, loss).should_training_stop
        for epoch, (auroc, loss) in enumerate(history, start=1)
    ]
    assert stopper.best_epoch == best
    assert stopper.best_score == (history[best - 1][0] if metric == "auroc" else history[best - 1][1])
    assert stopper.best_loss == history[best - 1][1]  # the dev loss at the chosen epoch, whichever rule chose it
    assert stops.index(True) + 1 == best + 3  # three epochs without improvement, then stop
    stopper.on_train_end(None, None, None, model=head)
    assert head.linear.weight.unique().tolist() == [float(best)]  # the chosen epoch's weights are restored


def test_an_evaluation_without_the_stopping_metric_changes_nothing():
    # e.g. stopping on AUROC with a Trainer that computes no metrics: the dev loss alone is reported
    head, stopper = LinearHead(2), BestOnDev(patience=1, metric="auroc")
    control = SimpleNamespace(should_training_stop=False)
    stopper.on_evaluate(None, SimpleNamespace(epoch=1.0), control, metrics={"eval_loss": 0.3}, model=head)
    assert (stopper.best_score, stopper.best_loss, stopper.bad_epochs) == (None, float("inf"), 0)
    assert not control.should_training_stop


@pytest.mark.parametrize("metric", ["auroc", "loss"])
def test_a_tie_is_no_improvement_so_the_earlier_epoch_stays_best(metric):
    values = [0.6, 0.7, 0.7, 0.65] if metric == "auroc" else [0.3, 0.2, 0.2, 0.25]  # epoch 3 ties epoch 2
    head, stopper = LinearHead(2), BestOnDev(patience=2, metric=metric)
    stops = [_evaluate(stopper, head, epoch, v, v).should_training_stop for epoch, v in enumerate(values, start=1)]
    assert stopper.best_epoch == 2 and stops == [False, False, False, True]


def test_an_evaluation_before_training_counts_as_epoch_0_and_a_missing_dev_loss_is_nan():
    head, stopper = LinearHead(2), BestOnDev(metric="auroc")
    control = SimpleNamespace(should_training_stop=False)
    stopper.on_evaluate(None, SimpleNamespace(epoch=None), control, metrics={"eval_auroc": 0.6}, model=head)
    assert (stopper.best_epoch, stopper.best_score) == (0.0, 0.6) and math.isnan(stopper.best_loss)


def test_the_dev_auroc_metric_scores_greedy_correctness_and_is_neutral_on_one_class():
    compute = auroc_metrics(np.array([0, 1, 0, 1]))
    # positives 0.9 and 0.3 against negatives 0.1 and 0.8: three of four pairs ordered right
    assert compute(SimpleNamespace(predictions=np.array([0.1, 0.9, 0.8, 0.3]))) == {"auroc": 0.75}
    assert auroc_metrics(np.zeros(3))(SimpleNamespace(predictions=np.array([0.2, 0.4, 0.1]))) == {"auroc": 0.5}


def test_the_trainer_stops_on_dev_auroc_and_restores_that_epoch(tmp_path):
    rng = np.random.default_rng(1)
    x, x_dev = rng.normal(size=(32, 3)).astype(np.float32), rng.normal(size=(12, 3)).astype(np.float32)
    y, y_dev = (x[:, 0] > 0).astype(float), (x_dev[:, 0] + x_dev[:, 1] > 0).astype(int)
    head, stopper = LinearHead(3), BestOnDev(patience=2, metric="auroc")
    args = training_arguments(
        tmp_path,
        learning_rate=0.1,
        epochs=6,
        batch_size=8,
        eval_strategy="epoch",
        label_names=["labels"],
        prediction_loss_only=False,
    )
    trainer = EliCalTrainer(
        model=head,
        args=args,
        train_dataset=feature_examples(x, y),
        eval_dataset=feature_examples(x_dev, y_dev),
        data_collator=collate_features,
        callbacks=[stopper],
        compute_metrics=auroc_metrics(y_dev),
    )
    trainer.train()
    aurocs = [e["eval_auroc"] for e in trainer.state.log_history if "eval_auroc" in e]
    assert stopper.best_score == max(aurocs)
    with torch.no_grad():
        restored = head(torch.from_numpy(x_dev)).numpy()
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(y_dev, restored) == pytest.approx(stopper.best_score)


def test_the_l2_sp_penalty_pulls_weights_to_their_start_and_leaves_the_bias_free(tmp_path):
    head = LinearHead(2)
    with torch.no_grad():
        head.linear.weight.copy_(torch.tensor([[1.0, -1.0]]))
        head.linear.bias.fill_(0.5)
    trainer = EliCalTrainer(model=head, args=arguments(tmp_path, 1, evaluate=False), anchor=0.5)
    with torch.no_grad():  # the stage moves away from where it started
        head.linear.weight.copy_(torch.tensor([[2.0, 1.0]]))
        head.linear.bias.fill_(-3.0)
    batch = {"features": torch.tensor([[0.0, 0.0]]), "labels": torch.tensor([0.3])}
    head.train()
    loss = trainer.compute_loss(head, batch)
    mse = (torch.sigmoid(torch.tensor(-3.0)) - 0.3) ** 2
    assert loss.item() == pytest.approx(mse.item() + 0.5 * (1.0**2 + 2.0**2), rel=1e-6)
    loss.backward()
    # d/dw of 0.5*||w - w0||^2 is (w - w0); the MSE adds nothing to w at a zero input; the bias has no penalty term
    torch.testing.assert_close(head.linear.weight.grad, torch.tensor([[1.0, 2.0]]))
    expected_bias_grad = (
        2
        * (torch.sigmoid(torch.tensor(-3.0)) - 0.3)
        * torch.sigmoid(torch.tensor(-3.0))
        * (1 - torch.sigmoid(torch.tensor(-3.0)))
    )
    assert head.linear.bias.grad.item() == pytest.approx(expected_bias_grad.item(), rel=1e-5)
    head.eval()  # the dev loss is the plain MSE, comparable across rules
    assert trainer.compute_loss(head, batch).item() == pytest.approx(mse.item(), rel=1e-6)
    # Without an anchor (the default) there is no penalty, however far the weights move; arguments go
    # positionally as to any Trainer.
    plain = EliCalTrainer(head, arguments(tmp_path, 1, evaluate=False))
    with torch.no_grad():
        head.linear.weight.copy_(torch.tensor([[5.0, 5.0]]))
    head.train()
    assert plain.compute_loss(head, batch).item() == pytest.approx(mse.item(), rel=1e-6)


def test_without_a_head_rate_every_parameter_trains_at_the_trainers_rate(tmp_path):
    head = LinearHead(2)
    trainer = EliCalTrainer(
        model=head, args=arguments(tmp_path, 1, lr=0.05, evaluate=False), head_parameters=head.parameters()
    )
    optimizer = trainer.create_optimizer()
    assert [g["lr"] for g in optimizer.param_groups] == [0.05, 0.05]  # decay and no-decay groups, untouched
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 2


def test_a_strong_anchor_holds_stage_two_at_the_stage_one_weights(tiny_model_dir, tmp_path):
    train, dev = make_records(30), make_records(8, 100)
    eli_config = EliCalConfig(mode="head", model=tiny_model_dir, max_epochs=3)
    eli = train_elical(train, dev, method="eli-only", config=eli_config, out_dir=tmp_path / "eli")
    moved = {}
    for anchor in (0.0, 1e4):
        # Adam steps about lr per step whatever the penalty, so an anchored weight still jitters by ~lr;
        # many small steps let the free head drift far beyond that. No weight decay: it pulls toward zero.
        config = EliCalConfig(
            mode="head",
            model=tiny_model_dir,
            max_epochs=3,
            head_learning_rate=0.02,
            batch_size=2,
            weight_decay=0.0,
            cal_anchor=anchor,
            cal_stop="auroc",
        )
        cal = train_elical(
            train,
            dev,
            method="elical",
            init_from=tmp_path / "eli",
            budget=Budget(20),
            config=config,
            out_dir=tmp_path / f"cal{anchor}",
        )
        moved[anchor] = (cal.model.head.linear.weight - eli.model.head.linear.weight).abs().max().item()
        assert cal.stages[0].stop_metric == "auroc" and cal.stages[0].best_dev_score is not None
    assert moved[1e4] < 0.3 * moved[0.0]


def test_bad_stage_two_rules_are_named():
    with pytest.raises(CandorError, match="unknown cal_stop 'ece'"):
        EliCalConfig(cal_stop="ece")
    with pytest.raises(CandorError, match="cannot be negative"):
        EliCalConfig(cal_anchor=-1.0)


def test_bias_scale_stage_two_keeps_the_stage_one_ranking_and_saves_a_plain_head(tiny_model_dir, tmp_path):
    train, dev = make_records(30), make_records(8, 100)
    eli = train_elical(
        train,
        dev,
        method="eli-only",
        config=EliCalConfig(mode="head", model=tiny_model_dir, max_epochs=3),
        out_dir=tmp_path / "eli",
    )
    config = EliCalConfig(
        mode="head", model=tiny_model_dir, max_epochs=3, head_learning_rate=0.05, batch_size=2, cal_scope="bias-scale"
    )
    cal = train_elical(
        train,
        dev,
        method="elical",
        init_from=tmp_path / "eli",
        budget=Budget(20),
        config=config,
        out_dir=tmp_path / "cal",
    )
    w_eli, w_cal = eli.model.head.linear.weight.detach(), cal.model.head.linear.weight.detach()
    ratio = (w_cal / w_eli).flatten()
    # Only a common scale moved the weights (same direction), so the ranking of any inputs is unchanged.
    assert torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-4)
    assert ratio[0].item() > 0 and abs(ratio[0].item() - 1.0) > 1e-4
    reloaded = ConfidenceHead.from_pretrained(tmp_path / "cal", model=cal.model.backbone, tokenizer=cal.model.tokenizer)
    assert isinstance(reloaded.head, LinearHead) and all(p.requires_grad for p in cal.model.head.parameters())
    x = torch.randn(12, w_eli.shape[1])
    order_eli = torch.argsort(eli.model.head(x)).tolist()
    order_cal = torch.argsort(reloaded.head(x)).tolist()
    assert order_eli == order_cal
    with pytest.raises(CandorError, match="unknown cal_scope 'weights'"):
        EliCalConfig(cal_scope="weights")


def test_bias_scale_freezes_the_lora_weights_for_stage_two_and_thaws_them(tiny_model_dir, tmp_path):
    train, dev = make_records(12), make_records(4, 100)
    eli = train_elical(train, dev, method="eli-only", config=lora_config(tiny_model_dir), out_dir=tmp_path / "eli")
    before = {n: p.detach().clone() for n, p in eli.model.backbone.named_parameters() if "lora" in n}
    cal = train_elical(
        train,
        dev,
        method="elical",
        init_from=tmp_path / "eli",
        budget=Budget(8),
        out_dir=tmp_path / "cal",
        config=lora_config(tiny_model_dir, cal_scope="bias-scale"),
    )
    after = dict(cal.model.backbone.named_parameters())
    assert before and all(torch.equal(after[n], w) for n, w in before.items())
    assert all(after[n].requires_grad for n in before)
