"""``candor serve --claims elical-claims --claim-head DIR``: a trained claim head scores a served answer's claims from
the served model's own pass (no second backbone), with the numbers of the offline estimator on the same prompt and
token ids; refused with another backbone, at startup and on reload; carried across a reload.

The head is trained on a copy of the embedded SmolLM2 loaded by this module (training freezes the model it reads),
and that copy serves: its answers to a compound question run to several claims.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
from typer.testing import CliRunner  # noqa: E402

import candor.train.elical.claim_estimator  # noqa: E402, F401  (registers elical-claims; pip install -e . does it by entry point)
from candor.annotation.claim_split import split_claims  # noqa: E402
from candor.annotation.claims import refine  # noqa: E402
from candor.backends.base import Completion  # noqa: E402
from candor.cli import app  # noqa: E402
from candor.estimators.claim_base import ClaimContext  # noqa: E402
from candor.estimators.claim_scoring import get_claim_estimator  # noqa: E402
from candor.serve import Decoding, HonestModel  # noqa: E402
from candor.serve import factuality as fa  # noqa: E402
from candor.serve.claim_answers import ClaimJudge, ClaimPolicy  # noqa: E402
from candor.serve.deployment import Deployment  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from candor.util.errors import CandorError  # noqa: E402
from tests.test_elical_claims import toy_records  # noqa: E402
from tests.test_serve_app import post  # noqa: E402
from tests.test_serve_feedback import ADMIN  # noqa: E402

QUESTION = "1. What is the capital of France?\n2. Which city is the capital of Italy?"
LAYER = 20  # a middle layer of SmolLM2's 30: the served pass stops there
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def served_lm(smollm_dir):
    """This module's own copy of the embedded model (training the head freezes the model it reads)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm_dir)


@pytest.fixture(scope="module")
def claim_head(served_lm, smollm_dir, tokenizer, tmp_path_factory) -> Path:
    """A claim head trained on the served model (both stages, ``last`` pooling, layer 20)."""
    from candor.train.elical import Budget, EliCalConfig
    from candor.train.elical.claim_head import train_claim_head

    out = tmp_path_factory.mktemp("claim-head")
    config = EliCalConfig(model=str(smollm_dir), cal_target="hard", max_epochs=1, batch_size=8, layer=LAYER)
    train_claim_head(
        toy_records(tokenizer, 12),
        toy_records(tokenizer, 6, start=100),
        out_dir=out,
        config=config,
        budget=Budget(10),
        pooling="last",
        model=served_lm,
        tokenizer=tokenizer,
    )
    return out


@pytest.fixture(scope="module")
def generator(served_lm, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(served_lm, tokenizer, batch_size=4)


@pytest.fixture(scope="module")
def offline(claim_head):
    """The offline estimator: the head on its own backbone, loaded by the name it saved (a second copy)."""
    return get_claim_estimator("elical-claims", head=str(claim_head))


def offline_values(estimator, prompt: str, completion: Completion, decode) -> list[float]:
    claims = split_claims(completion.text, completion, decode=decode)
    ctx = ClaimContext(prompt=prompt, question=QUESTION, answer=completion, claims=claims)
    return estimator.estimate([ctx])[0].tolist()


def honest(generator, template: str = "chat") -> HonestModel:
    return HonestModel(generator, confidence="n-prob", template=template, decoding=Decoding(max_new_tokens=48))


def test_served_claim_values_are_the_offline_heads_plain_and_streamed(generator, claim_head, offline, tmp_path, caplog):
    plain = honest(generator).answer(QUESTION)  # the answer as generated, no claims served
    prompt = honest(generator).prepare(QUESTION).prompt
    completion = plain.completion
    claims = split_claims(completion.text, completion, decode=generator.decode)
    assert len(claims) >= 2, f"the answer should hold several claims: {completion.text!r}"
    values = offline_values(offline, prompt, completion, generator.decode)
    assert len(set(values)) > 1, values
    threshold = (min(values) + max(values)) / 2
    expected = refine(completion.text, claims, values, threshold, "remove")
    log = tmp_path / "served.jsonl"
    policy = ClaimPolicy("elical-claims", refine="remove", threshold=threshold, head=str(claim_head))
    with caplog.at_level(logging.INFO, logger="candor.serve.claim_answers"):
        service = create_app(honest(generator), ServeSettings(log_records=log), Deployment(claims=policy))
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "reads the served model's own pass" in said and "no second backbone" in said
    assert "trained on the 'compound' template but the served prompt is 'chat'" in said
    with serve_in_thread(service) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": QUESTION}]
        resp = client.chat.completions.create(model="candor", messages=messages)
        chunks = [
            c for c in client.chat.completions.create(model="candor", messages=messages, stream=True) if c.choices
        ]
    conf = resp.choices[0].model_extra["confidence"]
    assert conf["claim_method"] == "elical-claims" and conf["claim_refine"] == "remove"
    assert [c["value"] for c in conf["claims"]] == pytest.approx(values, abs=TOLERANCE)
    assert conf["claim_calibrated"] is False and conf["claim_calibrated_on"] is None  # not the head's template
    assert resp.choices[0].message.content == expected.text
    assert [c["index"] for c in conf["removed_claims"]] == [claims.index(c) for c in expected.removed]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == expected.text
    assert chunks[-1].choices[0].model_extra["confidence"]["claims"] == conf["claims"]
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 2
    for record in records:
        assert record["greedy"]["token_ids"] == completion.token_ids  # the ids the offline head was fed
        logged = record["provenance"]["served"]["claims"][0]
        assert [c["value"] for c in logged["claims"]] == pytest.approx(values, abs=TOLERANCE)
        assert [c["below"] for c in logged["claims"]] == [v < threshold for v in values]


def test_the_heads_own_template_is_reported_calibrated_on_a_question_alone(generator, claim_head, offline):
    model = honest(generator, template="compound")
    model.serve_claims(ClaimPolicy("elical-claims", head=str(claim_head)))
    served = model.answer(QUESTION)
    described = served.claims.describe()
    assert described["claim_calibrated"] is True and "'compound' template" in described["claim_calibrated_on"]
    prompt = model.prepare(QUESTION).prompt
    assert offline.head.prompts([QUESTION]) == [prompt]  # `candor claims` renders this very prompt
    expected = offline_values(offline, prompt, served.completion, generator.decode)
    assert [c["value"] for c in described["claims"]] == pytest.approx(expected, abs=TOLERANCE)


def test_a_guarantee_is_refused_where_the_served_values_are_not_the_offline_ones(generator, claim_head):
    """A factuality guarantee is tuned on `candor claims` values, which read the head's own template."""
    rows = [
        {"answer": f"a{i}", "correct": label, "failure": None, "confidence": {"elical-claims": value}}
        for i in range(20)
        for label, value in ((0, 0.3), (1, 1.0))
    ]
    guarantee = fa.tune(fa.labelled_claims(rows, "elical-claims"), "elical-claims", 0.2)
    policy = ClaimPolicy("elical-claims", refine="remove", factuality_alpha=0.2, head=str(claim_head))
    with pytest.raises(
        CandorError, match="not the served ones here .*'compound' template, the served prompt is 'chat'"
    ):
        ClaimJudge(policy, generator, guarantee, template="chat")
    assert ClaimJudge(policy, generator, guarantee, template="compound").threshold == guarantee.threshold


def test_a_claim_head_on_another_backbone_is_refused_at_startup(claim_head, tiny_model_dir):
    result = CliRunner().invoke(
        app,
        [
            "serve",
            "--model",
            tiny_model_dir,
            "--port",
            "1",
            "--claims",
            "elical-claims",
            "--claim-head",
            str(claim_head),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "the claim head's backbone" in result.output and "is not the served weights" in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--claim-head", "HEAD"], "--claim-head needs --claims elical-claims"),
        (["--claims", "claim-prob", "--claim-head", "HEAD"], "--claim-head is read only by --claims elical-claims"),
        (["--claims", "elical-claims", "--claim-head", "nowhere"], "--claim-head nowhere: no such folder"),
    ],
)
def test_claim_head_options_are_checked(tiny_model_dir, tmp_path, args, says):
    args = [str(tmp_path) if a == "HEAD" else a for a in args]
    result = CliRunner().invoke(app, ["serve", "--model", tiny_model_dir, "--port", "1", *args])
    assert result.exit_code == 2 and says in result.output, result.output


def test_the_claim_head_is_in_the_deployments_options_and_digest(tmp_path):
    bare = Deployment(claims=ClaimPolicy("claim-prob"))
    assert "head" not in bare.options()["claims"]  # a policy without a head keeps its digest
    one = Deployment(claims=ClaimPolicy("elical-claims", head=str(tmp_path / "a")))
    other = Deployment(claims=ClaimPolicy("elical-claims", head=str(tmp_path / "b")))
    assert one.options()["claims"]["head"] == str(tmp_path / "a")
    assert one.digest != other.digest
    with pytest.raises(CandorError, match="needs --claim-head DIR"):
        ClaimPolicy("elical-claims")


def test_a_reload_keeps_the_claim_head_and_one_to_another_backbone_is_refused(
    generator, claim_head, tiny_model_dir, tmp_path
):
    from candor.backends import load_backend

    folder, other = tmp_path / "honest", tmp_path / "tiny"
    honest(generator).save_pretrained(folder)
    honest(load_backend(tiny_model_dir)).save_pretrained(other)
    model = HonestModel.from_pretrained(folder, backend=generator)
    deployment = Deployment(claims=ClaimPolicy("elical-claims", head=str(claim_head)))
    settings = ServeSettings(honest_folder=folder, honest_root=tmp_path, admin_key=ADMIN)
    with serve_in_thread(create_app(model, settings, deployment)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": QUESTION}]
        before = client.chat.completions.create(model="candor", messages=messages).choices[0].model_extra
        status, body = post(f"{url}/admin/reload", b"", key=ADMIN)
        assert status == 200, body
        assert body["model_version"].endswith("+opts." + deployment.digest)
        after = client.chat.completions.create(model="candor", messages=messages).choices[0].model_extra
        assert after["confidence"]["claim_method"] == "elical-claims"
        assert after["confidence"]["claims"] == before["confidence"]["claims"]
        status, refused = post(f"{url}/admin/reload", {"honest": str(other)}, key=ADMIN)
        assert status == 400 and refused["error"]["code"] == "reload_failed", refused
        # Refused for its other backbone, or before that for naming a model outside --honest-root (issue 64: a
        # reload reads only inside the root); either way the running model stays.
        message = refused["error"]["message"]
        assert "is not the served weights" in message or "outside --honest-root" in message, message
        still = client.chat.completions.create(model="candor", messages=messages).choices[0].model_extra
        assert still["confidence"]["claims"] == before["confidence"]["claims"]  # the old version still serves


def test_token_hidden_states_are_the_full_passes_layer_states(tiny_backend, tiny_model):
    import torch

    seqs = [[5, 17, 300, 42, 7], [9, 11]]  # two lengths: left padding must not change a row's states
    for layer in (0, 1, -1):
        got = tiny_backend.token_hidden_states(seqs, layer)
        for seq, states in zip(seqs, got, strict=True):
            with torch.no_grad():
                out = tiny_model(input_ids=torch.tensor([seq]), output_hidden_states=True)
            np.testing.assert_allclose(states, out.hidden_states[layer][0].numpy(), atol=1e-5)
    with pytest.raises(CandorError, match="out of range"):
        tiny_backend.token_hidden_states(seqs, 3)
