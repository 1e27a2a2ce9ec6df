"""`candor label` (issue 43 item 2): the local page driven in Chromium with its keys, its API, and the LLM judge.

The records are tests/data/served_log.jsonl: four answers a real `candor serve --log-records` wrote.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from browser import (  # noqa: F401  (a fixture)
    browser_context,  # noqa: F401  (a fixture)
    screenshot,
    watched,
)
from served_log_fixture import IDS, copy_served_log

from candor.annotation.judges import ANSWER_CHECK_PROMPT, LLMAnswerJudge, parse_verdict
from candor.annotation.labelling import TOKEN_HEADER, LabelServer, judge_labels
from candor.annotation.served_labels import append_label, read_served
from candor.cli.commands import run
from tests.helpers import post_label


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return copy_served_log(tmp_path)


@pytest.fixture
def server(log: Path):
    s = LabelServer(log, port=0).start()
    yield s
    s.close()


def open_label_page(w, url: str) -> None:
    w.page.goto(url)
    w.page.wait_for_selector("body[data-ready]", timeout=60_000)


def press_and_wait(page, key: str, saved: int) -> None:
    page.keyboard.press(key)
    page.wait_for_selector(f"body[data-saved='{saved}']", timeout=10_000)


def test_the_keys_label_skip_and_move_and_each_label_is_saved_at_once(watched, server, log):  # noqa: F811
    page = watched.page
    open_label_page(watched, server.url)
    assert page.text_content("#progress") == "4 of 4 left to label · answer 1 of 4"
    assert "What is the capital of France?" in page.text_content("#card")
    assert "Paris" in page.text_content("#card") and "1.000" in page.text_content("#card")
    press_and_wait(page, "1", 1)
    assert read_served(log).labelled()[0].key == (IDS[0], 0)  # on disk before the next key
    press_and_wait(page, "2", 2)
    page.keyboard.press("0")  # skip Jupiter
    page.wait_for_selector(f"#card[data-id='{IDS[3]}']", timeout=10_000)
    page.keyboard.press("ArrowLeft")
    page.wait_for_selector(f"#card[data-id='{IDS[2]}']", timeout=10_000)
    page.keyboard.press("ArrowLeft")
    page.wait_for_selector(f"#card[data-id='{IDS[1]}']", timeout=10_000)
    assert "wrong (human)" in page.text_content("#card")
    assert page.text_content("#progress") == "2 of 4 left to label · answer 2 of 4"
    labels = {a.key: (a.label, a.label_source) for a in read_served(log).labelled()}
    assert labels == {(IDS[0], 0): (True, "human"), (IDS[1], 0): (False, "human")}
    screenshot(watched, "label.png")
    watched.assert_no_errors()
    watched.assert_offline(allow_local=True)


def test_reopening_resumes_at_the_first_unlabelled_answer(watched, log):  # noqa: F811
    append_label(log, IDS[0], 0, True, "human")
    append_label(log, IDS[1], 0, False, "feedback")
    server = LabelServer(log, port=0).start()  # a file is read once, when the page opens
    try:
        open_label_page(watched, server.url)
        assert watched.page.get_attribute("#card", "data-id") == IDS[2]
        assert watched.page.text_content("#progress") == "2 of 4 left to label · answer 3 of 4"
        press_and_wait(watched.page, "2", 1)
        press_and_wait(watched.page, "1", 2)
        assert watched.page.text_content("#progress").startswith("0 of 4 left")
        watched.assert_no_errors()
    finally:
        server.close()


def test_the_api_refuses_unknown_answers_and_bad_labels(server, log):
    assert post_label(server, {"id": "chatcmpl-nope", "index": 0, "correct": True})[0] == 404
    assert post_label(server, {"id": IDS[3], "index": 2, "correct": True})[0] == 404  # n=2 served indexes 0 and 1
    status, body = post_label(server, {"id": IDS[0], "index": 0, "correct": "yes"})
    assert status == 400 and "'correct'" in body["error"]
    assert post_label(server, {"id": IDS[3], "index": 1, "correct": False}) == (200, {"left": 3})
    assert not [a for a in read_served(log).labelled() if a.key != (IDS[3], 1)]


LABEL = {"id": IDS[0], "index": 0, "correct": False}


@pytest.mark.parametrize(
    ("headers", "status", "said"),
    [
        ({"Origin": "http://evil.example"}, 403, "another site"),  # issue 64 defect 5: a cross-site post
        ({"Content-Type": "text/plain"}, 415, "JSON body"),  # a form or text post needs no preflight
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "JSON body"),
        ({"Origin": "http://evil.example", "Content-Type": "text/plain", TOKEN_HEADER: None}, 403, "another site"),
        ({TOKEN_HEADER: None}, 403, TOKEN_HEADER),
        ({TOKEN_HEADER: "guessed"}, 403, TOKEN_HEADER),
        ({"Sec-Fetch-Site": "cross-site"}, 403, "another site"),
        ({"Host": "evil.example"}, 403, "Host"),  # a DNS-rebound name
    ],
)
def test_a_label_from_another_site_is_refused_and_writes_nothing(server, log, headers, status, said):
    got, body = post_label(server, LABEL, **headers)
    assert got == status and said in body["error"], body
    assert read_served(log).labelled() == []


def test_the_page_carries_its_token_and_its_own_origin_is_taken(server, log):
    html = urllib.request.urlopen(server.url).read().decode()
    assert server.token in html and len(server.token) >= 32
    other = LabelServer(log, port=0).start()
    assert other.token != server.token  # a new token per page server
    other.close()
    origin = server.url.rstrip("/")
    assert post_label(server, LABEL, Origin=origin, **{"Sec-Fetch-Site": "same-origin"})[0] == 200
    assert [a.key for a in read_served(log).labelled()] == [(IDS[0], 0)]
    request = urllib.request.Request(server.url + "api/item", headers={"Host": "rebound.example:80"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 403  # the page's answers are not read through another name either


def test_the_judge_labels_only_the_unlabelled_and_reports_agreement(log, tiny_backend):
    append_label(log, IDS[0], 0, True, "human")
    append_label(log, IDS[1], 0, False, "human")
    report = judge_labels(log, tiny_backend, "tiny")
    served = {a.key: a for a in read_served(log).answers}
    assert (served[(IDS[0], 0)].label_source, served[(IDS[1], 0)].label_source) == ("human", "human")
    assert {served[(IDS[2], 0)].label_source, served[(IDS[3], 0)].label_source} == {"judge:tiny"}
    assert (report.labelled, report.compared) == (2, 2)
    # the same judge, asked again on the human-labelled answers, gives the verdicts the agreement counted
    verdicts = LLMAnswerJudge(tiny_backend).judge_answers(
        ["What is the capital of France?", "Who wrote Hamlet?"], ["Paris", "William Shakespeare"]
    )
    assert report.agreed == (verdicts[0] == 1) + (verdicts[1] == 0)
    assert judge_labels(log, tiny_backend, "tiny").labelled == 0  # a rerun resumes: nothing left


def test_the_judge_prompt_has_no_reference_and_parses_the_shared_verdict_words():
    text = ANSWER_CHECK_PROMPT.format(question="Who wrote Hamlet?", response="Marlowe")
    assert "Who wrote Hamlet?" in text and "Marlowe" in text and "Reference answers" not in text
    assert (parse_verdict("uncertain"), parse_verdict("certain")) == (0, 1)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--base-url", "http://127.0.0.1:9/v1"], "give it with --judge-model"),
        (["--judge-model", "x", "--port", "9"], "serves no page"),
    ],
)
def test_options_that_would_be_ignored_are_refused(log, capsys, extra, message):
    with pytest.raises(SystemExit) as done:
        run(["label", str(log), *extra])
    assert done.value.code == 2 and message in capsys.readouterr().err
