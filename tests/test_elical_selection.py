"""Choosing stage 2 by held-out domains: the folds never let a held-out domain in; the pick; a tiny real run."""

from __future__ import annotations

import pytest
from helpers import annotated_records

from candor.annotation.contamination import fingerprints, read_manifest
from candor.train.elical import WHOLE_POOL, EliCalConfig
from candor.train.elical.rules import RULES, TARGETS, rule_of, stage_two_line
from candor.train.elical.selection import (
    domain_changes,
    lodo_folds,
    pick,
    pick_universal,
    rechoose,
    select_rule,
    tolerances,
)
from candor.util.errors import CandorError

DOMAINS = ("nq", "hq", "pararel")


def pool_dev_extra(n_pool: int = 12, n_dev: int = 4, n_extra: int = 6):
    pool = [r for i, d in enumerate(DOMAINS) for r in annotated_records(n_pool, 1000 * i, d)]
    dev = [r for i, d in enumerate(DOMAINS) for r in annotated_records(n_dev, 1000 * i + 500, d)]
    extra = [r for i, d in enumerate(DOMAINS) for r in annotated_records(n_extra, 1000 * i + 700, d)]
    return pool, dev, extra


def test_each_fold_trains_and_stops_on_the_other_domains_and_scores_the_held_out_one():
    pool, dev, extra = pool_dev_extra()
    folds = lodo_folds(pool, dev, extra)
    assert [f.held_out for f in folds] == list(DOMAINS)
    for fold in folds:
        others = set(DOMAINS) - {fold.held_out}
        assert {r.item.dataset for r in fold.train} == others
        assert {r.item.dataset for r in fold.dev} == others
        assert {r.item.dataset for r in fold.score} == {fold.held_out}
        assert len(fold.train) == 2 * 12 and len(fold.dev) == 2 * 4 and len(fold.score) == 4 + 6
        # no question text of the held-out domain reaches training or stopping
        scored = {r.item.question for r in fold.score}
        assert not scored & {r.item.question for r in fold.train + fold.dev}


def test_a_held_out_question_hidden_in_another_domains_pool_is_refused():
    pool, dev, extra = pool_dev_extra()
    leaked = annotated_records(1, 700, "nq")[0]  # nq's extra dev question ...
    leaked.item = type(leaked.item)("hq:leak", "hq", "train", leaked.item.question, ("x",))  # ... filed under hq
    with pytest.raises(CandorError, match="held-out 'nq'"):
        lodo_folds([*pool, leaked], dev, extra)


def test_bad_fold_inputs_are_named():
    pool, dev, extra = pool_dev_extra()
    with pytest.raises(CandorError, match="at least two datasets"):
        lodo_folds([r for r in pool if r.item.dataset == "nq"], dev)
    with pytest.raises(CandorError, match="datasets the pool lacks: squad"):
        lodo_folds(pool, dev, annotated_records(2, 9000, "squad"))
    with pytest.raises(CandorError, match="'pararel' has no dev questions"):
        lodo_folds(pool, [r for r in dev if r.item.dataset != "pararel"])


def test_the_pick_is_the_best_mean_auroc_with_near_ties_broken_by_ece():
    candidates = {
        "a": {"mean_auroc": 0.700, "mean_ece": 0.02},
        "b": {"mean_auroc": 0.7005, "mean_ece": 0.09},  # within 0.1 point of a: a tie, a's ECE is lower
        "c": {"mean_auroc": 0.650, "mean_ece": 0.01},
    }
    assert pick(candidates) == "a"
    candidates["b"]["mean_auroc"] = 0.72
    assert pick(candidates) == "b"


def test_rules_are_config_settings_and_the_default_is_one_of_them():
    assert rule_of(EliCalConfig()) in RULES
    for name, rule in RULES.items():
        assert rule_of(rule.apply(EliCalConfig())) == name
    assert rule_of(EliCalConfig(cal_anchor=0.5)) is None


def test_a_tiny_selection_runs_every_rule_on_every_fold_and_no_head_saw_its_held_out_domain(tiny_model_dir, tmp_path):
    pool, dev, extra = pool_dev_extra()
    config = EliCalConfig(mode="head", model=tiny_model_dir, max_epochs=2, feature_cache=str(tmp_path / "features"))
    result = select_rule(
        pool,
        dev,
        extra,
        out_dir=tmp_path / "select",
        config=config,
        rules=["loss-stop", "bias-scale"],
        budgets=[WHOLE_POOL],
        seeds=[0],
    )
    assert set(result["candidates"]) == {"loss-stop", "bias-scale"}
    assert result["selected"] in result["candidates"]
    assert result["folds"]["nq"] == {"n_train": 24, "n_dev": 8, "n_scored": 10, "n_correct": 3}
    for c in result["candidates"].values():
        assert set(c["by_budget"]) == {"all"} and set(c["by_budget"]["all"]["by_fold"]) == set(DOMAINS)
        assert 0.0 <= c["mean_auroc"] <= 1.0
    heads = list((tmp_path / "select").glob("*/*/heads/*/seed0"))
    # EliCal@all per rule and fold, and one Eli-Only per fold that every rule's stage 2 resumed
    assert sorted(h.parents[3].name for h in heads) == ["bias-scale"] * 3 + ["loss-stop"] * 3 + ["stage1"] * 3
    for head in heads:
        held_out = head.parents[2].name
        assert held_out in DOMAINS
        seen = read_manifest(head)
        unseen = fingerprints(r.item.question for r in [*pool, *dev, *extra] if r.item.dataset == held_out)
        assert seen and not seen & unseen, head
    with pytest.raises(CandorError, match="unknown stage-2 rules"):
        select_rule(pool, dev, extra, out_dir=tmp_path / "x", config=config, rules=["nope"])


def test_metric_differences_are_seed_mean_gaps_with_a_paired_interval():
    import numpy as np
    from sklearn.metrics import roc_auc_score

    from candor.evaluation.aggregate import Group, metric_differences

    rng = np.random.default_rng(0)
    labels = {"a": rng.integers(0, 2, 80), "b": rng.integers(0, 2, 60)}
    good = [{d: 1 / (1 + np.exp(1 - 2 * y - rng.normal(0, s, y.size))) for d, y in labels.items()} for s in (0.8, 1.0)]
    noise = [{d: rng.random(y.size) for d, y in labels.items()}]
    out = metric_differences(good, noise, labels, groups=[Group("both", ("a", "b"))], bootstrap=200)
    expected_a = np.mean([roc_auc_score(labels["a"], g["a"]) for g in good]) - roc_auc_score(labels["a"], noise[0]["a"])
    assert out["a"].value == pytest.approx(expected_a)
    assert out["a"].ci[0] < out["a"].value < out["a"].ci[1]
    assert set(out) == {"a", "b", "both"} and out["both"].value > 0
    same = metric_differences(good, good, labels, bootstrap=50)["a"]  # paired: identical methods never differ
    assert same.value == 0 and same.ci == (0.0, 0.0)
    with pytest.raises(CandorError, match="at least one bootstrap"):
        metric_differences(good, noise, labels, bootstrap=0)


def _saved_elical() -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "elical.json").read_text())


def test_each_target_ships_the_rule_the_benchmark_selected_for_it():
    rule = _saved_elical()["stage2_rule"]
    assert {t: target.rule for t, target in TARGETS.items()} == rule["selected_by_target"]
    assert rule_of(EliCalConfig()) == rule["selected_by_target"]["universal"] == rule["library_default"]["name"]


def _with_changes(changes: dict[str, dict[str, list[float]]], means: dict[str, float]) -> dict[str, dict]:
    """Candidates with per-seed 100→all changes per domain and a mean held-out AUROC (ECE equal)."""
    return {
        name: {
            "mean_auroc": means[name],
            "mean_ece": 0.05,
            "domain_change": {d: {"change": float(sum(s) / len(s)), "per_seed": s} for d, s in per.items()},
        }
        for name, per in changes.items()
    }


def test_tolerance_is_two_standard_errors_from_the_seeds_spread_pooled_over_rules():
    import numpy as np

    changes = {"a": {"x": [0.0, 0.02, 0.04], "y": [0.1, 0.1, 0.1]}, "b": {"x": [-0.01, 0.0, 0.01], "y": [0.0] * 3}}
    candidates = _with_changes(changes, {"a": 0.7, "b": 0.6})
    tol = tolerances(candidates)
    var_x = (np.var([0.0, 0.02, 0.04], ddof=1) + np.var([-0.01, 0.0, 0.01], ddof=1)) / 2
    assert tol["x"] == pytest.approx(2 * np.sqrt(var_x / 3))
    assert tol["y"] == pytest.approx(0.0, abs=1e-12)  # no spread at all: any loss counts
    one_seed = _with_changes({"a": {"x": [0.03]}}, {"a": 0.7})
    assert tolerances(one_seed) == {"x": 0.0}


def test_universal_skips_the_best_mean_when_one_domain_loses_beyond_its_noise():
    # "free" has the best mean but loses 5 points on nq (tolerance about 1 point); "anchored" loses nothing.
    candidates = _with_changes(
        {
            "free": {"nq": [-0.05, -0.06, -0.04], "wiki": [0.08, 0.07, 0.09]},
            "anchored": {"nq": [-0.005, 0.0, 0.005], "wiki": [0.01, 0.0, 0.02]},
            "frozen": {"nq": [0.0, 0.0, 0.0], "wiki": [0.0, 0.0, 0.0]},
        },
        {"free": 0.70, "anchored": 0.68, "frozen": 0.66},
    )
    tol = tolerances(candidates)
    assert pick(candidates) == "free"  # the mean rule (in-domain target) takes it
    chosen = pick_universal(candidates, tol)
    assert chosen["selected"] == "anchored" and chosen["qualified"] == ["anchored", "frozen"]
    assert chosen["losing_domains"]["free"] == ["nq"]
    # when every rule loses somewhere, the smallest worst-domain loss is shipped and said so
    tight = {d: 0.0 for d in tol}
    candidates["frozen"]["domain_change"]["wiki"]["change"] = -0.002
    candidates["anchored"]["domain_change"]["nq"]["change"] = -0.003
    fallback = pick_universal(candidates, tight)
    assert fallback["qualified"] == [] and fallback["selected"] == "frozen" and "no rule qualified" in fallback["how"]
    assert fallback["worst_domain_change"]["free"] == pytest.approx(-0.05)


def test_a_saved_selection_is_rechosen_from_its_per_seed_held_out_aurocs():
    import numpy as np

    saved = _saved_elical()["stage2_rule"]["held_out_selection"]
    again = rechoose(saved)
    cell = saved["candidates"]["loss-stop"]["by_budget"]
    seeds = {b: cell[b]["by_fold"]["nq"]["per_seed"]["auroc"] for b in ("100", "all")}
    nq = np.mean(seeds["all"]) - np.mean(seeds["100"])
    assert again["candidates"]["loss-stop"]["domain_change"]["nq"]["change"] == pytest.approx(nq)
    assert domain_changes(cell, "100", "all")["nq"]["first"] == cell["100"]["by_fold"]["nq"]["auroc"]
    assert again["selected_by_target"] == saved["selected_by_target"]
    assert again["selected"] == again["selected_by_target"]["universal"]


def test_the_target_sets_stage_two_and_explicit_fields_override_it():
    universal, in_domain = EliCalConfig(), EliCalConfig(target="in-domain")
    assert rule_of(universal) == TARGETS["universal"].rule and rule_of(in_domain) == TARGETS["in-domain"].rule
    mixed = EliCalConfig(target="in-domain", cal_scope="bias-scale")
    assert (mixed.cal_anchor, mixed.cal_scope) == (RULES[TARGETS["in-domain"].rule].cal_anchor, "bias-scale")
    line = stage_two_line(mixed.fingerprint())
    assert line.startswith("stage 2: target in-domain") and "overridden by your settings: cal_scope=bias-scale" in line
    assert "target" in universal.fingerprint()
    with pytest.raises(CandorError, match="unknown EliCal target 'everywhere'; known: universal, in-domain"):
        EliCalConfig(target="everywhere")


def test_factor_range_is_where_the_universal_pick_holds_and_the_history_is_said():
    from candor.train.elical.selection import TOLERANCE_RULE, TOLERANCE_SE, factor_range

    # one seed-spread per domain: se = 0.01 on both (a pooled sample variance of 3e-4 over 3 seeds)
    se = 0.01
    candidates = _with_changes(
        {
            "free": {"nq": [-0.05] * 3, "wiki": [0.08] * 3},  # qualifies from 5 standard errors
            "anchored": {"nq": [-0.015] * 3, "wiki": [0.01] * 3},  # from 1.5
            "frozen": {"nq": [0.0] * 3, "wiki": [0.0] * 3},  # always
        },
        {"free": 0.70, "anchored": 0.68, "frozen": 0.66},
    )
    tol = {"nq": TOLERANCE_SE * se, "wiki": TOLERANCE_SE * se}
    assert pick_universal(candidates, tol)["selected"] == "anchored"
    assert factor_range(candidates, tol) == pytest.approx((1.5, 5.0))
    # the rule says when it was fixed: after the results it decides on, never "before they were read"
    assert "482b26b" in TOLERANCE_RULE and "before the results were read" not in TOLERANCE_RULE


def test_the_readme_says_whether_the_default_rule_has_its_test_curve(tmp_path):
    """The README's sentence on the library default's test-set budget curve follows the results file: measured
    when the curve's rule is the default's, "not measured" (naming both rules) when the curve is another rule's."""
    import json

    from benchmarks.readme.elical import elical_targets
    from benchmarks.readme.formatting import RESULTS

    saved = _saved_elical()
    rule = saved["stage2_rule"]
    default = rule["library_default"]["name"]
    other = next(name for name in RULES if name != default)
    for curve, measured in ((default, True), (other, False)):
        rule["curve_rule"] = curve
        (tmp_path / "elical.json").write_text(json.dumps(saved))
        sentence = elical_targets(tmp_path)["value:elical-default-curve"]
        assert default in sentence and ("not measured" in sentence) is not measured
        assert measured or f"the curve below is {other}'s" in sentence
    committed = elical_targets(RESULTS)["value:elical-default-curve"]
    shown = _saved_elical()["stage2_rule"]
    assert ("not measured" in committed) is (shown.get("curve_rule", shown["after"]["name"]) != default)


def test_a_rechosen_file_says_the_universal_rule_has_no_curve_only_when_it_has_none(tmp_path):
    import json

    from benchmarks.elical_targets import NO_UNIVERSAL_CURVE, rechoose_saved

    saved = _saved_elical()
    universal = saved["stage2_rule"]["selected_by_target"]["universal"]
    for after, said in ((universal, False), (next(n for n in RULES if n != universal), True)):
        saved["stage2_rule"]["after"]["name"] = after
        path = tmp_path / "elical.json"
        path.write_text(json.dumps(saved))
        rechoose_saved(path)
        notes = json.loads(path.read_text())["notes"]
        assert any(NO_UNIVERSAL_CURVE in n for n in notes) is said
