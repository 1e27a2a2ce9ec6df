"""The label-budget sweep: the seed-mean summary, the AUROC shortcut, an end-to-end tiny sweep and its cache."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from helpers import annotated_records
from sklearn.metrics import roc_auc_score

from candor.annotation.contamination import fingerprints, read_manifest
from candor.evaluation.metrics import alignment, auroc, ece
from candor.train.elical import WHOLE_POOL, Budget, EliCalConfig
from candor.train.elical.curve import summarize_column
from candor.train.elical.sweep import SweepData, run_sweep
from candor.util.errors import CandorError


def test_rank_sum_auroc_equals_scikit_learn_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = rng.integers(0, 2, size=60)
        conf = np.round(rng.random(60), 1)  # many ties
        assert auroc(conf, y) == pytest.approx(roc_auc_score(y, conf), abs=1e-12)
    with pytest.warns(RuntimeWarning, match="undefined"):
        assert np.isnan(auroc(np.array([0.2, 0.4]), np.array([1, 1])))


def test_summary_is_the_seed_mean_of_size_weighted_group_averages():
    rng = np.random.default_rng(1)
    labels = {"a": rng.integers(0, 2, 30), "b": rng.integers(0, 2, 10), "c": rng.integers(0, 2, 20)}
    roles = {"a": "id", "b": "id", "c": "ood"}
    seeds = [{ds: rng.random(y.size) for ds, y in labels.items()} for _ in range(2)]
    out = summarize_column(seeds, labels, roles, bootstrap=50)

    def group(conf, metric, members):
        sizes = [labels[d].size for d in members]
        return np.average([metric(conf[d], labels[d]) for d in members], weights=sizes)

    for name, metric in (("auroc", roc_auc_score_flipped), ("ece", ece), ("alignment", alignment)):
        per_seed_id = [group(s, metric, ["a", "b"]) for s in seeds]
        assert out["id"][name] == pytest.approx(np.mean(per_seed_id))
        assert out["per_seed"]["id"][name] == pytest.approx(per_seed_id)
        assert out["seed_std"]["id"][name] == pytest.approx(np.std(per_seed_id))
        assert out["ood"][name] == pytest.approx(np.mean([metric(s["c"], labels["c"]) for s in seeds]))
        low, high = out["ci95"]["id"][name]
        assert low <= high
    assert set(out["per_dataset"]) == {"a", "b", "c"}


def roc_auc_score_flipped(conf, y):
    return roc_auc_score(y, conf)


def sweep_data(n_train: int = 36) -> SweepData:
    tests = {"near": annotated_records(12, 500, "near"), "far": annotated_records(12, 700, "far")}
    return SweepData(annotated_records(n_train), annotated_records(8, 200), tests, {"near": "id", "far": "ood"})


def test_a_tiny_sweep_writes_the_curve_and_reuses_its_runs(tiny_model_dir, tmp_path, caplog):
    data = sweep_data()
    config = EliCalConfig(mode="head", model=tiny_model_dir, max_epochs=3, feature_cache=str(tmp_path / "features"))
    baseline = {ds: np.linspace(0.1, 0.9, len(recs)) for ds, recs in data.tests.items()}
    kwargs = dict(
        out_dir=tmp_path / "sweep",
        config=config,
        budgets=[Budget(10), WHOLE_POOL],
        seeds=[0],
        bootstrap=20,
        baselines={"N-Prob": baseline},
    )
    summary = run_sweep(data, **kwargs)

    expected = {"Eli-Only", "Cal-Only@10", "EliCal@10", "Cal-Only@all", "EliCal@all", "N-Prob"}
    assert set(summary["methods"]) == expected
    assert summary["n_labels"] == {"10": 10, "all": 36}
    on_disk = json.loads((tmp_path / "sweep" / "curve.json").read_text())
    assert set(on_disk["methods"]) == expected
    assert (tmp_path / "sweep" / "budget_curve.png").stat().st_size > 10_000
    elical = summary["methods"]["EliCal@10"]
    assert set(elical["id"]) == {"auroc", "ece", "alignment"} and "ood" in elical
    assert [s["name"] for s in elical["training"][0]["stages"]] == ["cal"]  # resumed the seed's Eli head
    assert elical["cost"]["peak_rss_mib"] > 0
    assert summary["methods"]["N-Prob"]["id"]["auroc"] == pytest.approx(
        roc_auc_score([r.greedy_correct for r in data.tests["near"]], baseline["near"])
    )

    # Each head keeps the fingerprints of what it was trained or early-stopped on, and nothing else.
    heads = tmp_path / "sweep" / "heads"
    dev = fingerprints(r.item.question for r in data.dev)
    pool = fingerprints(r.item.question for r in data.train)
    cal_only = read_manifest(heads / "cal-only@10" / "seed0")
    assert len(cal_only) == 18 and dev <= cal_only and len(cal_only & pool) == 10
    assert read_manifest(heads / "eli-only" / "seed0") == pool | dev
    assert read_manifest(heads / "elical@10" / "seed0") == pool | dev  # its stage-1 head's, inherited
    tests = fingerprints(r.item.question for r in data.test_records())
    assert not read_manifest(heads / "elical@all" / "seed0") & tests

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="candor.train.elical"):
        again = run_sweep(data, **kwargs)
    assert sum("reusing cached run" in m for m in caplog.messages) == 5
    assert not any(m.startswith("training ") for m in caplog.messages)
    assert again["methods"]["EliCal@all"]["id"] == summary["methods"]["EliCal@all"]["id"]

    # Other test questions, same training: every head is rescored, none retrained, and the old test
    # questions score as before.
    more = SweepData(
        data.train, data.dev, {**data.tests, "extra": annotated_records(9, 900, "extra")}, {**data.roles, "extra": "id"}
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="candor.train.elical"):
        rescored = run_sweep(more, **{**kwargs, "baselines": None})
    assert sum("rescoring the cached head" in m for m in caplog.messages) == 5
    assert not any(m.startswith("training ") for m in caplog.messages)
    column = "EliCal@10"
    assert rescored["methods"][column]["per_dataset"]["near"] == summary["methods"][column]["per_dataset"]["near"]
    # Other training records: retrained.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="candor.train.elical"):
        fewer = SweepData(data.train[1:], data.dev, more.tests, more.roles)
        run_sweep(fewer, **{**kwargs, "budgets": [Budget(10)], "baselines": None})
    assert sum(m.startswith("training ") for m in caplog.messages) == 3


def test_the_sweep_refuses_a_dev_slice_that_overlaps_test_before_training(tiny_model_dir, tmp_path):
    data = sweep_data()
    leaked = SweepData(data.train, [*data.dev, data.tests["near"][0]], data.tests, data.roles)
    with pytest.raises(
        CandorError,
        match="the dev slice: 1 of 9 questions are also in the test set, e.g. 'What is fact number 500 about near\\?'",
    ):
        run_sweep(leaked, out_dir=tmp_path, config=EliCalConfig(model=tiny_model_dir), budgets=[Budget(10)], seeds=[0])
    assert not (tmp_path / "runs").exists()


def test_the_sweep_refuses_a_budget_over_the_pool(tiny_model_dir, tmp_path):
    with pytest.raises(CandorError, match="label budget 100 is larger than the labelled pool \\(36 records\\)"):
        run_sweep(
            sweep_data(), out_dir=tmp_path, config=EliCalConfig(model=tiny_model_dir), budgets=[Budget(10), Budget(100)]
        )


def test_a_lora_sweep_trains_fresh_backbones_and_predicts_from_tokens(tiny_model_dir, tmp_path):
    data = sweep_data()
    config = EliCalConfig(mode="lora", model=tiny_model_dir, max_epochs=1, lora_r=4, lora_alpha=8)
    summary = run_sweep(
        data, out_dir=tmp_path, config=config, budgets=[Budget(10)], seeds=[0], methods=("elical",), bootstrap=0
    )
    assert set(summary["methods"]) == {"Eli-Only", "EliCal@10"}
    assert (tmp_path / "heads" / "elical@10" / "seed0" / "adapter").is_dir()
    run = json.loads((tmp_path / "runs" / "elical@10" / "seed0.json").read_text())
    assert len(run["confidence"]) == 24 and len(set(run["confidence"])) > 1
