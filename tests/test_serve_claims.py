"""``candor serve --claims``: a confidence per claim of a long answer, refinement, buffered streaming (issue 45 item 5),
the threshold tuned with a factuality guarantee (``--factuality-alpha``), claims kept across a reload, on the
embedded model with its chat template (its answers run to several sentences), real HTTP, the official client."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
try:
    import httpx
except ImportError:  # recent openai clients ship the same API as httpx2
    httpx = pytest.importorskip("httpx2")
from typer.testing import CliRunner  # noqa: E402

import candor.train.elical.claim_estimator  # noqa: E402, F401  (registers elical-claims; pip install -e . does it by entry point)
from candor.annotation.claim_split import split_claims  # noqa: E402
from candor.annotation.claims import refine  # noqa: E402
from candor.cli import app  # noqa: E402
from candor.estimators.claim_scoring import score_claims  # noqa: E402
from candor.serve import Decoding, HonestModel  # noqa: E402
from candor.serve import factuality as fa  # noqa: E402
from candor.serve.claim_answers import ClaimPolicy  # noqa: E402
from candor.serve.deployment import Deployment  # noqa: E402
from candor.serve.honest_folder import add_factuality  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from tests.test_serve_app import post  # noqa: E402
from tests.test_serve_factuality import dev_guarantee  # noqa: E402
from tests.test_serve_feedback import ADMIN  # noqa: E402

QUESTION = "Describe Paris in three short sentences."


@pytest.fixture(scope="module")
def generator(smollm_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from candor.backends.hf import HFBackend

    return HFBackend(AutoModelForCausalLM.from_pretrained(smollm_dir), tokenizer, batch_size=4)


@pytest.fixture(scope="module")
def plain_answer(generator):
    """The answer as generated (no claims served), its claims and their claim-prob values, computed directly."""
    model = HonestModel(generator, confidence="n-prob", template="chat", decoding=Decoding(max_new_tokens=48))
    answer = model.answer(QUESTION)
    completion = answer.completion
    claims = split_claims(completion.text, completion, decode=generator.decode)
    assert len(claims) >= 2, f"the fixture's answer should hold several claims: {completion.text!r}"
    prompt = model.prepare(QUESTION).prompt
    values = score_claims("claim-prob", completion, claims, generator, prompt=prompt, question=QUESTION)
    return answer, claims, values


def serving(generator, refine_mode, threshold) -> HonestModel:
    model = HonestModel(generator, confidence="n-prob", template="chat", decoding=Decoding(max_new_tokens=48))
    model.serve_claims(ClaimPolicy("claim-prob", refine=refine_mode, threshold=threshold))
    return model


def test_each_claim_gets_its_confidence_and_low_claims_are_removed(generator, plain_answer):
    answer, claims, values = plain_answer
    threshold = sorted(values)[len(values) // 2]  # at least one claim below it, at least one kept
    expected = refine(answer.answer, claims, values, threshold, "remove")
    assert expected.removed and len(expected.removed) < len(claims)
    with serve_in_thread(create_app(serving(generator, "remove", threshold), ServeSettings())) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        resp = client.chat.completions.create(model="candor", messages=[{"role": "user", "content": QUESTION}])
        conf = resp.choices[0].model_extra["confidence"]
        content = resp.choices[0].message.content
        assert conf["claim_method"] == "claim-prob" and conf["claim_refine"] == "remove"
        # spans into the returned text and values only: a kept claim's span slices its words out of the content
        assert all(set(c) == {"index", "start", "end", "value"} for c in conf["claims"])
        assert [(c["start"], c["end"]) for c in conf["claims"]] == [s or (None, None) for s in expected.spans]
        for c, claim in zip(conf["claims"], claims, strict=True):
            if c["start"] is not None:
                assert content[c["start"] : c["end"]] == claim.text
        assert [c["value"] for c in conf["claims"]] == pytest.approx(values, abs=1e-6)
        removed = [claims.index(c) for c in expected.removed]
        assert [c["index"] for c in conf["removed_claims"]] == removed
        assert all(set(c) == {"index", "value"} and c["value"] < threshold for c in conf["removed_claims"])
        assert conf["refined"] == {"mode": "remove", "kept": len(claims) - len(removed), "removed": len(removed)}
        assert conf["scores_returned_text"] is False  # the value is the answer as generated, not the refined text
        assert content == expected.text
        assert conf["value"] == pytest.approx(answer.confidence, rel=1e-4)  # the answer-level value is unchanged
        # Streaming is buffered until the claims are scored: the client never sees a claim that is removed.
        chunks = [
            c
            for c in client.chat.completions.create(
                model="candor", messages=[{"role": "user", "content": QUESTION}], stream=True
            )
            if c.choices
        ]
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert streamed == expected.text
        assert all(r.text not in streamed for r in expected.removed if r.text not in expected.text)
        assert chunks[-1].choices[0].model_extra["confidence"]["claims"] == conf["claims"]
        # the generated tokens' log-probs would show the removed words: refused, naming the field
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="candor", messages=[{"role": "user", "content": QUESTION}], logprobs=True
            )
        assert refused.value.body["param"] == "logprobs" and "--refine" in refused.value.body["message"]


def test_mark_keeps_the_claims_and_flags_the_low_ones(generator, plain_answer):
    answer, claims, values = plain_answer
    threshold = max(values) + 1e-9  # every claim below: all marked
    model = serving(generator, "mark", min(threshold, 1.0))
    marked = model.answer(QUESTION)
    assert marked.answer == refine(answer.answer, claims, values, min(threshold, 1.0), "mark").text
    assert marked.answer.count("[?") == len(claims)
    assert marked.scores_returned_text is False  # the marked text is not the text the value was computed on
    assert marked.claims.describe()["refined"] == {"mode": "mark", "kept": 0, "marked": len(claims)}


def test_claims_without_refine_report_only(generator, plain_answer):
    answer, claims, _ = plain_answer
    model = HonestModel(generator, confidence="n-prob", template="chat", decoding=Decoding(max_new_tokens=48))
    model.serve_claims(ClaimPolicy("claim-perplexity"))
    served = model.answer(QUESTION)
    assert served.answer == answer.answer and len(served.claims.claims) == len(claims) and not served.claims.removed
    described = served.claims.describe()
    assert described["refined"] is None and served.scores_returned_text is True
    assert [(c["start"], c["end"]) for c in described["claims"]] == [(c.start, c.end) for c in claims]


LIST_PROMPTS = [
    "Tell me three facts about Paris, one per sentence.",
    "List three rivers in Europe as bullet points.",
    "Give me two numbered facts about the Moon.",
]
# A claim that is nothing but list markers, numbering, bullets or a heading's hashes.
NOT_A_CLAIM = re.compile(r"[\s#*+\-\u2022.;:]*(?:\(?(?:\d{1,3}|[A-Za-z]|[ivxIVX]{1,5})[.)]\)?[\s.;:]*)*")


@pytest.mark.parametrize("question", LIST_PROMPTS)
def test_a_list_answer_refined_by_claims_leaks_no_removed_text(generator, tmp_path, question):
    """Issue 54 part 6: no list marker is a claim, and no removed claim's words reach the client, plain or
    streamed; the served record (the operator's) keeps them. Checked on the raw response bytes."""
    model = HonestModel(generator, confidence="n-prob", template="chat", decoding=Decoding(max_new_tokens=48))
    completion = model.answer(question).completion
    claims = split_claims(completion.text, completion, decode=generator.decode)
    assert len(claims) >= 2, f"the answer should hold several claims: {completion.text!r}"
    prompt = model.prepare(question).prompt
    values = score_claims("claim-prob", completion, claims, generator, prompt=prompt, question=question)
    threshold = sorted(values)[len(values) // 2]  # the lower claims removed, at least one kept
    log = tmp_path / "served.jsonl"
    app_ = create_app(serving(generator, "remove", threshold), ServeSettings(log_records=log))
    body = {"model": "candor", "messages": [{"role": "user", "content": question}]}
    with serve_in_thread(app_) as url, httpx.Client(base_url=url, timeout=120) as http:
        plain = http.post("/v1/chat/completions", json=body)
        assert plain.status_code == 200, plain.text
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as streamed:
            assert streamed.status_code == 200
            stream_bytes = b"".join(streamed.iter_bytes())
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 2  # the plain answer and the streamed one, both logged
    content = plain.json()["choices"][0]["message"]["content"]
    for raw, record in zip([plain.content, stream_bytes], records, strict=True):
        served = record["provenance"]["served"]["claims"][0]
        assert served is not None, "the answer should have been split into claims"
        assert [c["text"] for c in served["claims"]] == [c.text for c in claims]  # the same answer, the same claims
        for c in served["claims"]:
            assert not NOT_A_CLAIM.fullmatch(c["text"]), f"a list marker is a claim: {c['text']!r}"
        removed = [c["text"] for c in served["claims"] if c["below"]]
        assert removed, "the threshold should remove a claim"
        text = raw.decode("utf-8")
        for words in removed:
            if words in content:  # the same words stand in a kept claim too (a repeated sentence)
                continue
            for form in (words, json.dumps(words)[1:-1], json.dumps(words, ensure_ascii=False)[1:-1]):
                assert form not in text, f"a removed claim's text reached the client: {words!r}"
    conf = plain.json()["choices"][0]["confidence"]
    assert conf["scores_returned_text"] is False
    assert conf["refined"]["mode"] == "remove" and conf["refined"]["removed"] == len(conf["removed_claims"]) >= 1
    assert all("text" not in c for c in [*conf["claims"], *conf["removed_claims"]])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--refine", "remove"], "--refine needs --claims"),
        (["--claims", "claim-prob", "--claim-threshold", "0.2"], "--claim-threshold is used only with --refine"),
        (["--claims", "claim-nonsense"], "unknown claim method"),
        (["--claims", "claim-prob", "--refine", "cut"], "--refine must be one of"),
        (["--claims", "claim-consistency"], "reads sampled answers"),
        (["--claims", "elical-claims"], "--claims elical-claims needs --claim-head DIR"),
    ],
)
def test_claim_options_are_checked(tiny_model_dir, args, says):
    result = CliRunner().invoke(app, ["serve", "--model", tiny_model_dir, "--port", "1", *args])
    assert result.exit_code == 2 and says in result.output, result.output


# ---------------------------------------------------------------- --factuality-alpha, reload


def saved(generator, folder) -> HonestModel:
    HonestModel(generator, confidence="n-prob", template="chat", decoding=Decoding(max_new_tokens=48)).save_pretrained(
        folder
    )
    return HonestModel.from_pretrained(folder, backend=generator)


def ask_over_http(url: str):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    return client.chat.completions.create(model="candor", messages=[{"role": "user", "content": QUESTION}])


def test_the_served_answer_is_refined_at_the_tuned_threshold_and_carries_the_guarantee(
    generator, plain_answer, tmp_path
):
    answer, claims, values = plain_answer
    assert len(set(values)) > 1, values  # some claim is above the lowest one
    guarantee = dev_guarantee(min(values), 0.2)
    folder = tmp_path / "honest"
    saved(generator, folder)
    add_factuality(folder, guarantee)
    model = HonestModel.from_pretrained(folder, backend=generator)
    # The deployment's claims policy, put on this model and on every folder a reload loads.
    deployment = Deployment(claims=ClaimPolicy(method="claim-prob", refine="remove", factuality_alpha=0.2))
    expected = refine(answer.answer, claims, values, guarantee.threshold, "remove")
    assert expected.removed and len(expected.removed) < len(claims)
    bare = tmp_path / "bare"
    saved(generator, bare)  # the same model with no guarantee tuned
    settings = ServeSettings(honest_folder=folder, honest_root=tmp_path, admin_key=ADMIN)
    with serve_in_thread(create_app(model, settings, deployment)) as url:
        resp = ask_over_http(url)
        conf = resp.choices[0].model_extra["confidence"]
        assert resp.choices[0].message.content == expected.text
        assert conf["factuality"] == json.loads(json.dumps(guarantee.describe()))
        assert conf["factuality"]["guarantee"].startswith("a refined answer of more than one claim holds no false")
        assert conf["factuality"]["n_dev"] == 20 and conf["factuality"]["assumption"] == fa.ASSUMPTION
        assert len(conf["removed_claims"]) == len(expected.removed)
        status, body = post(f"{url}/admin/reload", {"honest": str(bare)}, key=ADMIN)
        assert status == 400 and body["error"]["code"] == "reload_failed", body
        assert "no factuality guarantee for claim-prob at alpha=0.2" in body["error"]["message"]


def test_claims_stay_served_after_a_reload(generator, tmp_path):
    folder = tmp_path / "honest"
    model = saved(generator, folder)
    deployment = Deployment(claims=ClaimPolicy(method="claim-prob", refine="remove", threshold=0.0))
    settings = ServeSettings(honest_folder=folder, admin_key=ADMIN)
    with serve_in_thread(create_app(model, settings, deployment)) as url:
        status, body = post(f"{url}/admin/reload", b"", key=ADMIN)
        assert status == 200, body
        conf = ask_over_http(url).choices[0].model_extra["confidence"]
        assert conf.get("claim_method") == "claim-prob" and conf["claim_refine"] == "remove", conf
