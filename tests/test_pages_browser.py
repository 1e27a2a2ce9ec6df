"""The pages in a real headless Chromium: no console error, no request leaves the page, controls do what they say."""

from __future__ import annotations

import math
import re

import pytest
from browser import (  # noqa: F401  (a fixture)
    browser_context,  # noqa: F401  (a fixture)
    screenshot,
    watched,
)
from pages_data import ROLES, page_records

from candor.evaluation.report import write_report
from candor.evaluation.report_page import selective_stats


def pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.1f}%"


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    records, table = page_records(n=150, methods=3, seed=2)
    out = tmp_path_factory.mktemp("report")
    result = write_report(
        table,
        out,
        roles=ROLES,
        bootstrap=50,
        title="candor report: page test",
        records=records,
        command="candor eval -c confidences.jsonl -o report --bootstrap 50 --records records.jsonl",
    )
    return table, result


def open_page(w, url: str) -> None:
    w.page.goto(url)
    w.page.wait_for_selector("body[data-ready]", timeout=60_000)
    assert w.page.evaluate("document.body.dataset.ready") == "1", w.errors


def set_slider(page, value: float) -> None:
    page.eval_on_selector(
        "#sel-threshold", "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }", str(value)
    )


def test_report_loads_offline_without_errors(watched, report_page):  # noqa: F811
    _, result = report_page
    open_page(watched, result.files["html"].as_uri())
    watched.assert_no_errors()
    watched.assert_offline()
    # every chart rendered an SVG
    for chart in ("reliability", "histogram", "risk", "selective"):
        assert watched.page.locator(f"#chart-{chart} svg").count() >= 1, chart
    assert watched.page.locator("#provenance-list dd").first.is_visible()
    screenshot(watched, "report.png")


def test_report_slider_updates_the_selective_numbers(watched, report_page):  # noqa: F811
    table, result = report_page
    page = watched.page
    open_page(watched, result.files["html"].as_uri())
    page.select_option("#sel-method", "method-1")
    conf, y = table.arrays("method-1")
    for t in (0.3, 0.72):
        set_slider(page, t)
        ref = selective_stats(conf, y, t)
        assert page.text_content("#sel-threshold-value") == f"{t:.2f}"
        assert page.text_content("#sel-accuracy") == pct(ref.accuracy)
        assert page.text_content("#sel-coverage") == pct(ref.coverage)
        assert page.text_content("#sel-over") == pct(ref.over_abstention)
        assert page.text_content("#sel-answered") == f"{ref.answered} / {len(conf)}"
    # the chart's threshold rule follows the slider
    assert page.evaluate("candorPage.views.selective.signal('threshold')") == pytest.approx(0.72)
    watched.assert_no_errors()


def test_report_filters_pick_confident_wrong_and_unsure_right(watched, report_page):  # noqa: F811
    table, result = report_page
    page = watched.page
    open_page(watched, result.files["html"].as_uri())
    page.select_option("#sel-method", "method-2")
    set_slider(page, 0.4)
    conf, y = table.arrays("method-2")
    expected = {
        "confident-wrong": int(((conf >= 0.4) & (y == 0)).sum()),
        "unsure-right": int(((conf < 0.4) & (y == 1)).sum()),
        "all": len(conf),
    }
    assert 0 < expected["confident-wrong"] < len(conf) and 0 < expected["unsure-right"] < len(conf)
    for kind, count in expected.items():
        page.select_option("#rec-filter", kind)
        assert page.get_attribute("#rec-count", "data-count") == str(count)
        assert page.locator("#rec-table tbody tr").count() == min(count, 200)
    page.select_option("#rec-filter", "confident-wrong")
    marks = page.locator("#rec-table tbody tr td:nth-child(6)").all_text_contents()
    assert set(marks) == {"✗"}
    page.fill("#rec-search", "number 7 about")
    assert page.get_attribute("#rec-count", "data-count") == str(int(conf[7] >= 0.4 and y[7] == 0))
    page.select_option("#rec-filter", "all")
    assert page.get_attribute("#rec-count", "data-count") == "1"
    assert "gold 7 | alias 7" in page.text_content("#rec-table tbody")
    watched.assert_no_errors()


def test_report_table_sorts_and_method_picker_switches(watched, report_page):  # noqa: F811
    _, result = report_page
    page = watched.page
    open_page(watched, result.files["html"].as_uri())
    ev = result.evaluation
    header = page.locator("#main-table th.sortable", has_text="ID AUROC")
    header.click()  # ascending
    header.click()  # descending
    first = page.locator("#main-table tbody tr").first.get_attribute("data-method")
    assert first == max(ev.methods, key=lambda m: ev.metrics[m]["id"]["auroc"])
    page.select_option("#method-select", "method-2")
    assert page.text_content("#method-aurc") == f"{100 * ev.metrics['method-2']['all']['aurc']:.1f}"
    assert page.evaluate("candorPage.views.reliability.signal('method')") == "method-2"
    watched.assert_no_errors()


@pytest.fixture(scope="module")
def diagnose_page(tmp_path_factory):
    from test_diagnose_page import committed_run

    from candor.diagnose.diagnosis_report import write_diagnosis_report

    doc, diagnoses, config = committed_run()
    files = write_diagnosis_report(diagnoses, tmp_path_factory.mktemp("diag"), config, doc["title"])
    return diagnoses, files["html"]


def test_diagnose_page_loads_offline_and_the_ig_view_switches(watched, diagnose_page):  # noqa: F811
    diagnoses, path = diagnose_page
    page = watched.page
    open_page(watched, path.as_uri())
    for chart in ("jsd", "mu", "masking", "shift", "rollout"):
        assert page.locator(f"#chart-{chart} svg").count() >= 1, chart
    page.select_option("#ig-model", "advice")
    page.select_option("#ig-example", "3")
    example = diagnoses["advice"].attribution.examples[3]
    assert page.locator("#ig-tokens span").count() == len(example.tokens)
    assert f"μ(input) = {example.mu_input:.4f}" in page.text_content("#ig-summary")
    assert f"ranked {example.first_answer_rank} of {len(example.tokens)}" in page.text_content("#ig-summary")
    scores = [float(s) for s in page.locator("#ig-tokens span").evaluate_all("els => els.map(e => e.dataset.score)")]
    assert scores == pytest.approx(example.scores.tolist(), abs=1e-6)  # the page keeps 6 decimals
    watched.assert_no_errors()
    watched.assert_offline()
    screenshot(watched, "diagnose.png")


# ---------------------------------------------------------------- the playground at candor serve's /

KEY = "playground-key-not-secret"
REFUSAL = "I am not sure."
QUESTIONS = [f"What is the capital of country number {i}?" + " really" * (i % 5) for i in range(10)]


@pytest.fixture(scope="module")
def playground(tiny_model, tokenizer):
    pytest.importorskip("fastapi")
    from candor.backends.hf import HFBackend
    from candor.serve import Decoding, HonestModel, Threshold
    from candor.serve.http.app import ServeSettings, create_app
    from candor.serve.http.server import serve_in_thread

    backend = HFBackend(tiny_model, tokenizer, batch_size=16)
    model = HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=6))
    conf = sorted(a[0].confidence for a in model.answer_batch(QUESTIONS))
    middle = (conf[len(conf) // 2 - 1] + conf[len(conf) // 2]) / 2  # some questions answer, some abstain
    model.threshold = Threshold(
        middle, rule="accuracy", target=0.8, expected_accuracy=0.8, expected_coverage=0.45, n_dev=40
    )
    settings = ServeSettings(api_key=KEY, max_tokens=16, refusal=REFUSAL)
    with serve_in_thread(create_app(model, settings)) as url:
        yield model, url


def server_streams(url: str) -> bool:
    """Whether this server answers ``stream: true`` with server-sent events (the page must work either way)."""
    import json
    import urllib.error
    import urllib.request

    body = {"model": "candor", "messages": [{"role": "user", "content": QUESTIONS[0]}], "stream": True}
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return "text/event-stream" in resp.headers.get("content-type", "")
    except urllib.error.HTTPError:
        return False


def ask(page, question: str) -> None:
    page.fill("#question", question)
    page.click("#ask")
    # Selectors, not wait_for_function: the playground's policy forbids the eval the latter needs.
    page.wait_for_selector("body[data-state=done], body[data-state=error]", timeout=120_000)
    assert page.get_attribute("body", "data-state") == "done", page.text_content("#status")


def test_playground_shows_an_answer_and_an_abstention(watched, playground):  # noqa: F811
    model, url = playground
    page = watched.page
    page.goto(f"{url}/")
    page.fill("#api-key", KEY)
    page.wait_for_selector("#model-id:text-is('candor')", timeout=30_000)
    direct = {q: model.answer(q) for q in QUESTIONS}
    answered = next(q for q, a in direct.items() if not a.abstained)
    declined = next(q for q, a in direct.items() if a.abstained)
    assert server_streams(url), "candor serve answers stream: true with server-sent events"
    mode = "streamed"

    ask(page, answered)
    a = direct[answered]
    assert page.text_content("#verdict") == "Answered"
    assert page.text_content("#answer") == a.answer
    assert float(page.get_attribute("#conf-value", "data-value")) == pytest.approx(a.confidence, rel=1e-4)
    width = re.search(r"width:\s*([\d.]+)%", page.get_attribute("#conf-bar", "style")).group(1)
    assert float(width) == pytest.approx(100 * a.confidence, abs=0.06)
    info = page.text_content("#threshold-info")
    assert info.startswith("Threshold ")
    assert float(info.split()[1]) == pytest.approx(model.threshold.value, rel=5e-3)
    assert "expected accuracy 80.0%" in info and "coverage 45.0%" in info
    assert page.get_attribute("#mode", "data-mode") == mode
    screenshot(watched, "playground.png")

    ask(page, declined)
    d = direct[declined]
    assert page.text_content("#verdict") == "Abstained"
    assert page.text_content("#answer") == REFUSAL
    assert float(page.get_attribute("#conf-value", "data-value")) == pytest.approx(d.confidence, rel=1e-4)
    assert page.is_visible("#reason") and d.reason and d.reason in page.text_content("#reason")
    screenshot(watched, "playground_abstained.png")

    watched.assert_offline(allow_local=True)
    assert all(r.startswith(url) for r in watched.requests), watched.requests
    assert watched.errors == []
