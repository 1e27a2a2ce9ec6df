"""The READMEs' and pages' tables and quoted numbers are exactly what ``python -m benchmarks.readme_tables`` writes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from candor.estimators.catalog import markdown_table

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TOP = BENCHMARKS.parent / "README.md"
DOCS = BENCHMARKS.parent / "docs"
ESTIMATORS_PAGE = DOCS / "estimators.md"
SERVING_PAGE = DOCS / "serving.md"
RUN = "run: python -m benchmarks.readme_tables"


@pytest.fixture(scope="module")
def gen(readme_generator):
    return readme_generator("generator")


@pytest.fixture(scope="module")
def parts(gen):
    return gen.generated()


@pytest.fixture
def results(tmp_path):
    """A copy of the results files a test may change."""
    copy = tmp_path / "results"
    shutil.copytree(BENCHMARKS / "results", copy, ignore=shutil.ignore_patterns("*.png", "*.md", "*.csv"))
    return copy


def test_every_committed_readme_and_page_matches_the_results_files(gen, parts):
    texts = {path: path.read_text(encoding="utf-8") for path in gen.READMES}
    assert set(gen.READMES) == {BENCHMARKS / "README.md", TOP, DOCS / "benchmarks.md", ESTIMATORS_PAGE, SERVING_PAGE}
    assert gen.unplaced(texts.values(), parts) == []
    assert gen.rewritten(texts, parts) == {}, RUN
    assert gen.main(["--check"]) == 0


def keys_of(path: Path, gen) -> set[str]:
    return {key for _, key in gen.markers(path.read_text(encoding="utf-8"))}


def test_the_readme_and_the_pages_place_their_own_parts(gen, parts):
    bench_keys = keys_of(BENCHMARKS / "README.md", gen)
    assert "table:elical" in keys_of(TOP, gen)  # the landing page's headline table
    assert "table:estimators" in keys_of(ESTIMATORS_PAGE, gen)
    assert {"table:adapt", "table:adapt-goal", "table:serve-conversations"} <= keys_of(SERVING_PAGE, gen)
    # The estimator table and the adapt parts live only in the docs pages: their check is what guards them.
    assert not {"table:estimators", "table:adapt", "table:adapt-goal"} & bench_keys
    assert parts["table:estimators"] + "\n" == markdown_table()


def test_no_page_outside_the_generators_list_holds_a_marker(gen):
    holding = {path for path in [TOP, *DOCS.glob("**/*.md")] if keys_of(path, gen)}
    assert holding <= set(gen.READMES)


def test_a_changed_result_changes_the_readme(gen, results):
    doc = json.loads((results / "elical.json").read_text())
    doc["methods"]["EliCal@100"]["id"]["auroc"] = 0.5
    (results / "elical.json").write_text(json.dumps(doc))
    text = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    new = gen.render(text, gen.generated(results))
    assert new != text
    assert "| EliCal@100 | 50.0 [70, 83] |" in new
    assert "−8 AUROC points in-domain (50.0 [70, 83] vs 57.6 [52, 64])" in new


def test_a_changed_adapt_result_makes_only_the_serving_page_stale(gen, results):
    doc = json.loads((results / "adapt.json").read_text())
    doc["by_domain"]["nq"]["by_labels"]["25"]["adapted"]["auroc"]["mean"] = 0.5
    doc["goal_at_100_labels"]["auroc_gain_by_domain"]["nq"] = -0.5
    (results / "adapt.json").write_text(json.dumps(doc))
    texts = {path: path.read_text(encoding="utf-8") for path in gen.READMES}
    stale = gen.rewritten(texts, gen.generated(results))
    assert list(stale) == [SERVING_PAGE]
    row = "| nq | 25 | adapted | 50.0 [67, 82] | 4.1 [0, 14] | 0.0 | – (answers none) | not exercised (0 answered) |"
    assert row in stale[SERVING_PAGE]
    assert "AUROC gain per domain nq -50.0, hq +1.5" in stale[SERVING_PAGE]


def test_a_guarantee_no_run_exercised_is_not_reported_as_held(gen, results):
    """Issue 53, defect 7: the adapted arm answered nothing at 100 labels, so its guarantee is "not exercised".

    Fails on the old code, whose README said "answered error within α in every run: yes".
    """
    doc = json.loads((results / "adapt.json").read_text())
    adapted = doc["by_labels"]["100"]["adapted"]
    assert adapted["answered_runs"] == 0 and adapted["coverage"]["mean"] == 0.0
    assert adapted["guarantee"] == "not exercised (0 answered)"
    assert doc["goal_at_100_labels"]["answered_error_within_alpha_every_run"] is False
    page = gen.generated(results)
    assert (
        "answered error within α in every run: not exercised (0 answered) (adapted coverage 0.0%)"
        in (page["table:adapt-goal"])
    )
    assert "in every run: yes" not in page["table:adapt-goal"]
    mean_row = (
        "| mean of the four | 100 | adapted | 66.3 [54, 78] | 5.3 [4, 7] | 0.0 | – (answers none) | not exercised"
    )
    assert mean_row in page["table:adapt"]


def test_an_edited_estimator_table_is_stale_and_rewritten(gen, parts):
    text = ESTIMATORS_PAGE.read_text(encoding="utf-8")
    edited = text.replace("| `n-prob` | token probability |", "| `n-prob` | made up |", 1)
    assert edited != text
    assert gen.rewritten({ESTIMATORS_PAGE: edited}, parts) == {ESTIMATORS_PAGE: text}


def test_check_and_rewrite_from_the_command(gen, tmp_path, monkeypatch, capsys):
    copies = tuple(tmp_path / path.relative_to(TOP.parent) for path in gen.READMES)
    for copy, path in zip(copies, gen.READMES, strict=True):
        copy.parent.mkdir(exist_ok=True)
        copy.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    page = copies[gen.READMES.index(SERVING_PAGE)]  # the copy that holds the adapt table
    monkeypatch.setattr(gen, "READMES", copies)
    assert gen.main(["--check"]) == 0
    good = page.read_text(encoding="utf-8")
    page.write_text(good.replace("| hq | 25 | adapted | 72.9", "| hq | 25 | adapted | 70.0"), encoding="utf-8")
    assert gen.main(["--check"]) == 1
    assert f"{page} differs from the results files" in capsys.readouterr().err
    assert gen.main([]) == 0 and page.read_text(encoding="utf-8") == good
    page.write_text(good + "\n<!-- value:nope -->1<!-- /value -->\n", encoding="utf-8")
    assert gen.main(["--check"]) == 2
    line = good.count("\n") + 2
    assert f"{page}:{line}: marker 'value:nope' has no generator" in capsys.readouterr().err
    page.write_text(good.replace("<!-- table:adapt -->", "<!-- table:adapt-gone -->"), encoding="utf-8")
    assert gen.main(["--check"]) == 1
    assert "no README or page places: table:adapt\n" in capsys.readouterr().err


def test_a_part_written_by_two_renderers_is_an_error(gen, readme_generator, monkeypatch):
    adapt = readme_generator("adapt")
    monkeypatch.setattr(gen, "SECTIONS", [adapt.adapt, adapt.adapt])
    with pytest.raises(ValueError, match=r"readme.adapt.adapt writes parts already written: \['table:adapt'"):
        gen.generated()


def test_a_recorded_script_path_is_shown_as_the_module_command(readme_generator):
    shown = readme_generator("formatting").shown_command
    assert shown("python benchmarks/annotate_steps.py --k 5") == "python -m benchmarks.annotate_steps --k 5"
    assert shown("PYTHONPATH=src .venv/bin/python benchmarks/x_y.py --out benchmarks/results/x.json") == (
        "PYTHONPATH=src .venv/bin/python -m benchmarks.x_y --out benchmarks/results/x.json"
    )
    assert shown("python -m benchmarks.decode_lean") == "python -m benchmarks.decode_lean"  # recorded as run now
    assert shown("candor adapt LOG --honest START") == "candor adapt LOG --honest START"


def test_no_generated_part_runs_a_script_by_its_path(parts):
    assert [key for key, text in parts.items() if re.search(r"python\S* benchmarks/\w+\.py", text)] == []


def test_numbers_quoted_in_prose_come_from_the_json(parts):
    assert "1.46× OOD (66.4 → 45.4)" in parts["value:advice-cut"]
    assert parts["value:advice-ood-small"].startswith("OOD (80 questions, 1 correct)")
    assert "+1 at 1800" in parts["value:elical-gaps"]
    assert "in 99.0 s" in parts["value:elical-sweep-time"]
    assert "Prob 6.4 (1.15×)" in parts["value:elical-ece-vs-training-free"]


def test_an_unknown_marker_is_an_error_naming_the_file_and_line(gen, parts):
    with pytest.raises(gen.MarkerError, match=r"^notes.md:2: marker 'value:nope' has no generator"):
        gen.render("text\n<!-- value:nope -->1<!-- /value -->", parts, "notes.md")
    with pytest.raises(gen.MarkerError, match=r"^README:1: marker 'table:nope' has no generator"):
        gen.render("<!-- table:nope -->\n| a |\n<!-- /table -->", parts)


def test_an_adapt_cell_is_the_mean_and_interval_in_points(readme_generator):
    adapt = readme_generator("adapt")
    assert adapt.cell({"mean": 0.6234, "ci95": [0.58, 0.671]}) == "62.3 [58, 67]"
    assert adapt.cell({"mean": None, "ci95": [None, None]}) == "–"
    assert adapt.cell({"mean": 0.5, "ci95": [None, None]}) == "50.0"
    answered = {"answered_error": {"mean": 0.25, "ci95": [0.1, 0.404]}, "coverage": {"mean": 0.0312}}
    assert adapt.error_cell(answered) == "25.0 [10, 40]" and adapt.coverage_cell(answered) == "3.1"
    assert adapt.error_cell({"answered_error": {"mean": None}, "coverage": {"mean": 0.0}}) == "– (answers none)"


def test_the_advice_section_reports_factors_with_intervals_and_whether_each_loss_term_moved(readme_generator):
    advice = readme_generator("advice")
    assert advice._factor({"factor": 1.4588, "ci": [1.4339, 1.4864]}) == "1.46× [1.43, 1.49]"
    assert advice._factor({"factor": None, "ci": [None, None]}) == "–"
    curve = [{"loss_jsd": 0.6, "loss_sum": 0.2 - 0.01 * i, "epoch": i / 10} for i in range(10)]
    # First five steps average 0.18, last five 0.13; a term that stayed put reads the same on both sides.
    assert advice._term_moves(curve) == "jsd 0.600 → 0.600, sum 0.180 → 0.130"
    ref = {"confidence": 0.144, "id": {"ece": 0.0352, "ece_ci": [0.014, 0.0552]}}
    # ECE is biased: a file with only a percentile interval prints the plug-in alone, saying why; one with the
    # bias-corrected estimate prints that with its (basic) interval
    assert advice._constant13(ref) == (
        "confidence 14.4% for every question: ECE in-domain 3.5 (plug-in; its percentile interval not shown)"
    )
    ref["id"]["ece_corrected"] = 0.031
    assert advice._constant13(ref) == "confidence 14.4% for every question: ECE in-domain 3.1 [1, 6]"
    assert advice._constant13(None) == "not computed"


def test_the_advice_section_compares_auroc_within_each_in_domain_dataset(readme_generator):
    advice = readme_generator("advice")
    block = {"per_dataset": {"nq": {"auroc": 0.3}, "hq": {"auroc": None}, "squad": {"auroc": 0.9}}}
    trained = {"per_dataset": {"nq": {"auroc": 0.75}, "hq": {"auroc": 0.7}, "squad": {"auroc": 0.1}}}
    methods = {
        "Default": {"ScoreLetter": block},
        "Prompting": {"ScoreLetter": trained},
        "ADVICE": {"ScoreLetter": trained},
    }
    # Only trained methods, only in-domain datasets (SQuAD is OOD), and an undefined AUROC shows as a dash.
    assert advice._auroc_by_dataset(methods) == "ADVICE ScoreLetter: NQ 30.0 → 75.0, HotpotQA – → 70.0"


def test_lora_rows_carried_over_from_an_earlier_run_are_labelled_so(results):
    from benchmarks.readme.elical import CARRIED_MARK, CARRIED_NOTE, elical

    doc = json.loads((results / "elical.json").read_text())
    for carried in (True, False):
        doc["lora"]["carried_over"] = carried
        (results / "elical.json").write_text(json.dumps(doc))
        table = elical(results)["table:elical"]
        lora_rows = [line for line in table.splitlines() if ", lora (" in line]
        assert lora_rows and all((CARRIED_MARK + " |" in line) is carried for line in lora_rows)
        assert (CARRIED_NOTE in table) is carried
        assert CARRIED_MARK not in "".join(
            line for line in table.splitlines() if ", lora (" not in line and "|" in line
        )
        if carried:  # not measured with the other rows, so never bolded as the best of them
            assert not any("**" in line for line in lora_rows)


def test_the_claim_head_section_derives_its_shift_table_and_thresholds_from_the_values(readme_generator, tmp_path):
    claims = readme_generator("claims")
    cell = {
        "auroc": {"value": 0.6},
        "pooling": {"pooling": "mean", "dev_auroc": {"last": 0.7, "mean": 0.8}},
        # [prompt id, claim index, question, confidence, label]
        "values": [["p0", 0, 0, 0.2, 1], ["p0", 1, 1, 0.4, 0], ["p1", 0, 0, 0.6, 0], ["p1", 1, 1, 0.0, 0]],
    }
    run = {"claim_head": {"nq": {"by_budget": {"100": cell}}, "hq": {"by_budget": {}}}}
    table = claims._shift_table(run, "100")
    assert "| nq | 4 / 1 | 25.0 | 30.0 | 80.0 (mean) | 60.0 |" in table
    assert "| hq |" not in table  # a fold without the budget has no row, not a made-up one
    assert claims._threshold(5e-324) == "> 0" and claims._threshold(0.1844) == "0.184"
    assert claims._threshold("per domain") == "one per domain"
    old = {"size": {"prompts": 144}, "runs": [{"seed": 0}]}
    (tmp_path / "claims_head.json").write_text(json.dumps(old))
    section = claims.claims_head_section(tmp_path)
    assert section["value:claims-head-size"] == "144 prompts (an older run)"
    assert section["table:claims-head-shift"].startswith("_Not in")


def test_the_adapt_page_counts_worse_heads_promoted_and_the_certified_levels(gen, results):
    """Issue 64, defect 12: the promotion table's last row and the certified-α table come from the results."""
    doc = json.loads((results / "adapt.json").read_text())
    worse = doc["promotion"]["all"]["worse_promoted"]
    page = gen.generated(results)
    assert "| **every run** | all | 36 | " in page["table:adapt-promotion"]
    assert page["table:adapt-promotion"].endswith(f"**{worse}** |")
    assert f"over every domain, seed and label count: {worse}" in page["table:adapt-goal"]
    for domain, entry in doc["certified_alpha_at_100_labels"].items():
        assert f"| {domain} | " in page["table:adapt-alpha"]
        if entry["alpha"] is None:
            assert f"| {domain} | none, none, none | none of the grid |" in page["table:adapt-alpha"]
    doc["promotion"]["all"]["worse_promoted"] = 2
    (results / "adapt.json").write_text(json.dumps(doc))
    assert gen.generated(results)["table:adapt-promotion"].endswith("**2** |")
