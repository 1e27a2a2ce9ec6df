"""Which labels `candor adapt` learns from (issue 53, part 3): trusted sources, the scored text, one per response.

A real log: the tiny model served over HTTP (the official client) with ``--log-records``; greedy
replies with n = 2 (both choices are the scored text), sampled replies with n = 2 (neither is),
and replies of a model that abstains on everything. Labels are appended in the served log's format.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from candor.annotation.label_selection import (  # noqa: E402
    ABSTAINED,
    NOT_SCORED,
    SUPERSEDED,
    UNTRUSTED,
    USED,
    labelled_records,
    parse_label_sources,
    select_labels,
    trusted,
    unscored_reason,
)
from candor.annotation.served_labels import append_label, read_served  # noqa: E402
from candor.serve import Decoding, HonestModel, Threshold  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from candor.util.errors import CandorError  # noqa: E402

KEY = "label-selection-key"


def serve(backend, log: Path, threshold: float, questions: list[str], **params) -> list[str]:
    """Serve ``questions`` once each (``params``: n, temperature ...); the response ids."""
    model = HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=4))
    model.threshold = Threshold(threshold, rule="fixed")
    with serve_in_thread(create_app(model, ServeSettings(api_key=KEY, log_records=log))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        return [
            client.chat.completions.create(
                model="candor", messages=[{"role": "user", "content": q}], max_tokens=4, **params
            ).id
            for q in questions
        ]


@pytest.fixture(scope="module")
def served(tiny_model, tokenizer, tmp_path_factory) -> tuple[Path, list[str], list[str], list[str]]:
    """The log, and the ids of greedy n=2 replies, sampled n=2 replies and abstentions."""
    from candor.backends.hf import HFBackend

    backend = HFBackend(tiny_model, tokenizer, batch_size=8)
    log = tmp_path_factory.mktemp("selection") / "served.jsonl"
    greedy = serve(backend, log, 0.0, ["Who wrote Hamlet?", "Where is Lima?"], n=2, temperature=0)
    sampled = serve(backend, log, 0.0, ["Who painted the Mona Lisa?"], n=2, temperature=1.0, seed=7)
    abstained = serve(backend, log, 1.0, ["What is the capital of Peru?"])
    return log, greedy, sampled, abstained


def by_key(log: Path) -> dict[tuple[str, int], object]:
    return {a.key: a for a in read_served(log).answers}


def test_the_log_marks_which_choices_carry_the_scored_text(served) -> None:
    log, greedy, sampled, abstained = served
    answers = by_key(log)
    assert [unscored_reason(answers[(greedy[0], i)]) for i in (0, 1)] == [None, None]
    assert [unscored_reason(answers[(sampled[0], i)]) for i in (0, 1)] == [NOT_SCORED, NOT_SCORED]
    assert unscored_reason(answers[(abstained[0], 0)]) == ABSTAINED


def test_only_labels_of_the_scored_text_from_trusted_sources_count(served, tmp_path) -> None:
    """Fails on the old code: a label on a sampled or abstained choice became the greedy answer's label."""
    source, greedy, sampled, abstained = served
    log = tmp_path / "served.jsonl"
    log.write_bytes(source.read_bytes())
    append_label(log, greedy[0], 0, True, "human")
    append_label(log, greedy[0], 1, False, "human")  # the same scored text, labelled later: it stands
    append_label(log, greedy[1], 0, True, "human")
    append_label(log, greedy[1], 0, False, "feedback")  # later, but untrusted: the human label still counts
    append_label(log, sampled[0], 1, True, "human")  # a sampled reply: not what the confidence scored
    append_label(log, abstained[0], 0, False, "human")  # the client saw a refusal
    selection = select_labels(read_served(log).answers, ("human",))
    assert {r.item.question: r.greedy_correct for r in selection.records} == {
        "Who wrote Hamlet?": 0,
        "Where is Lima?": 1,
    }
    assert selection.by_source == {
        "human": {USED: 2, SUPERSEDED: 1, NOT_SCORED: 1, ABSTAINED: 1},
        "feedback": {UNTRUSTED: 1},
    }
    assert selection.to_dict()["used"] == 2 and selection.to_dict()["ignored"] == 4
    # every source trusted: the later feedback label is the one that stands for "Where is Lima?"
    assert {r.item.question: r.greedy_correct for r in labelled_records(read_served(log).answers)} == {
        "Who wrote Hamlet?": 0,
        "Where is Lima?": 0,
    }


def test_label_sources_are_patterns() -> None:
    assert parse_label_sources("human, judge:*") == ("human", "judge:*")
    assert trusted("judge:Qwen/Qwen2.5-7B", ("human", "judge:*")) and not trusted("feedback", ("human", "judge:*"))
    for bad in ("", "human,,audit", " "):
        with pytest.raises(CandorError, match="--label-sources"):
            parse_label_sources(bad)
