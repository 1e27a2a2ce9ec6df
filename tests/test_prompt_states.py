"""Issue 55 part 4: the EliCal head read from the generation engine's own pass, on the documented formats.

vLLM and SGLang do not run here (no GPU, no SGLang install): what is tested is candor's reading of what they
write, in the layouts their source documents (see ``candor.backends.extracted_states`` and
``candor.backends.sglang``), built from a tiny random Llama's real hidden states. The engines themselves are
exercised end to end by ``benchmarks/gpu_check.sh`` only.

- vLLM: a safetensors file per request (``hidden_states`` ``[prompt tokens, layers, hidden]``, ``token_ids``),
  written here with the real ``safetensors`` library; layer id ``num_hidden_layers`` is the last layer before
  the final norm, as vLLM documents, so the reader applies the norm.
- SGLang: a real HTTP server on 127.0.0.1 (``tests/sglang_format_server.py``, a fixture of the format that
  answers from the tiny model) and the ``sglang`` backend reading it end to end inside ``HonestModel``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from sglang_format_server import SGLangFormatServer
from test_serve_prefill_head import QUESTIONS, make_head

from candor.backends.base import PROMPT_HIDDEN_STATES, SamplingParams, absolute_layer
from candor.backends.extracted_states import ExtractedStates, FinalNorm, engine_args, for_model
from candor.backends.hf import HFBackend
from candor.backends.tokens import encode
from candor.serve import Decoding, HonestModel, Threshold
from candor.serve.confidence_sources import HeadSource, PrefillReader
from candor.util.errors import CandorError

LAYERS = 2  # the tiny Llama's decoder layers


def vllm_file(model, tokenizer, prompt: str, layer_ids: list[int], path) -> list[int]:
    """What vLLM's hidden-states connector writes for one request, from the model's real states; its token ids."""
    ids = encode(tokenizer, [prompt])[0]
    captured = {}
    base = getattr(model, "model", model)  # a causal LM or its decoder stack
    hook = base.norm.register_forward_hook(lambda _m, args, _out: captured.setdefault("pre_norm", args[0]))
    try:
        with torch.no_grad():
            states = base(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    finally:
        hook.remove()
    # id i < L: the stream entering decoder layer i (transformers' hidden_states[i]); id L: before the final norm
    rows = [captured["pre_norm"][0] if i == LAYERS else states[i][0] for i in layer_ids]
    save_file({"hidden_states": torch.stack(rows, dim=1).contiguous(), "token_ids": torch.tensor(ids)}, str(path))
    (path.parent / (path.name + ".lock")).touch()  # the connector's lock file, released
    return ids


@pytest.mark.parametrize("layer", [-1, 1])
def test_the_vllm_file_gives_the_heads_input_and_confidence_of_the_hf_path(tiny_model_dir, tmp_path, layer):
    from candor.train.elical import ConfidenceHead

    folder = make_head(tiny_model_dir, tmp_path / "head", layer=layer)
    head = ConfidenceHead.from_pretrained(folder, device="cpu")
    own = head.predict(QUESTIONS)
    own_features = head.prompt_features(head.prompts(QUESTIONS))
    reader = ExtractedStates([1, -1], LAYERS, FinalNorm.from_folder(tiny_model_dir))
    source = PrefillReader(head.head, absolute_layer(layer, LAYERS))
    for i, prompt in enumerate(head.prompts(QUESTIONS)):
        path = tmp_path / f"req-{i}.safetensors"
        ids = vllm_file(head.backbone, head.tokenizer, prompt, [1, LAYERS], path)
        states = reader.read(path, ids)
        assert sorted(states) == [1, LAYERS]
        np.testing.assert_allclose(states[absolute_layer(layer, LAYERS)], own_features[i], atol=1e-6, rtol=0)
        assert source(states) == pytest.approx(own[i], abs=1e-6)


@pytest.mark.parametrize("layers", [(-1,), (LAYERS,), (1, -1)])
def test_a_default_last_layer_head_gets_its_reader_and_engine_args_from_the_model_folder(
    tiny_model_dir, tmp_path, layers
):
    """Issue 63 defect 1: the reader was built before the final norm was loaded, so a head on the default last
    layer (``-1``) could never use vLLM's pass (``candor serve --backend vllm --head H`` failed)."""
    from candor.train.elical import ConfidenceHead

    extraction = for_model(tiny_model_dir, layers, tmp_path / "states")
    reader, args = extraction.reader, extraction.engine_args
    wanted = sorted({absolute_layer(layer, LAYERS) for layer in layers})
    assert reader.layer_ids == wanted and reader.final_norm is not None
    spec = args["speculative_config"]["draft_model_config"]["hf_config"]
    assert spec["eagle_aux_hidden_state_layer_ids"] == wanted
    folder = args["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"]
    assert folder == str(extraction.files.path) and extraction.files.path.parent == tmp_path / "states"
    head = ConfidenceHead.from_pretrained(make_head(tiny_model_dir, tmp_path / "head", layer=-1), device="cpu")
    prompt = head.prompts(QUESTIONS[:1])[0]
    ids = vllm_file(head.backbone, head.tokenizer, prompt, wanted, tmp_path / "req.safetensors")
    np.testing.assert_allclose(
        reader.read(tmp_path / "req.safetensors", ids)[LAYERS], head.prompt_features([prompt])[0], atol=1e-6, rtol=0
    )


def test_the_vllm_reader_refuses_another_prompt_and_another_layout(tiny_model_dir, tmp_path):
    from candor.train.elical import ConfidenceHead

    head = ConfidenceHead.from_pretrained(make_head(tiny_model_dir, tmp_path / "head"), device="cpu")
    path = tmp_path / "req.safetensors"
    ids = vllm_file(head.backbone, head.tokenizer, head.prompts(QUESTIONS[:1])[0], [1, LAYERS], path)
    norm = FinalNorm.from_folder(tiny_model_dir)
    with pytest.raises(CandorError, match="token_ids are not the prompt's"):
        ExtractedStates([1, -1], LAYERS, norm).read(path, [*ids[:-1], ids[-1] + 1])
    with pytest.raises(CandorError, match="expected \\[prompt tokens, 1 layers"):
        ExtractedStates([-1], LAYERS, norm).read(path, ids)  # the file holds two layers
    with pytest.raises(CandorError, match="final norm"):
        ExtractedStates([-1], LAYERS)  # the last layer cannot be read without it
    args = engine_args([-1, 1], LAYERS, tmp_path)
    assert args["speculative_config"]["method"] == "extract_hidden_states"
    assert args["speculative_config"]["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2]
    assert args["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"] == str(tmp_path)
    assert args["enable_chunked_prefill"] is False


def sglang_backend(url: str, tiny_model_dir: str):
    from candor.backends import load_backend

    return load_backend(tiny_model_dir, "sglang", base_url=url + "/v1", max_concurrency=4)


def test_the_sglang_backend_reads_the_head_from_the_generation_pass(tiny_model_dir, tmp_path):
    from candor.train.elical import ConfidenceHead

    folder = make_head(tiny_model_dir, tmp_path / "head", layer=-1)
    own = ConfidenceHead.from_pretrained(folder, device="cpu").predict(QUESTIONS)
    hf = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    server = SGLangFormatServer(hf, tiny_model_dir)
    with server as url:
        backend = sglang_backend(url, tiny_model_dir)
        assert PROMPT_HIDDEN_STATES in backend.capabilities and backend.prompt_state_layers == (LAYERS,)
        source = HeadSource(folder)
        model = HonestModel(
            backend,
            source,
            threshold=Threshold(float(np.median(own))),
            template="fewshot",
            decoding=Decoding(max_new_tokens=4),
            backend_name="sglang",
        )
        assert model.prefill_reader is not None and model.prefill_reader.from_engine_pass
        probes = len(server.native_requests)  # the capability probe's request
        answers = [a[0] for a in model.answer_batch(QUESTIONS)]
        prompts = [model.prepare(q).prompt for q in QUESTIONS]
    np.testing.assert_allclose([a.confidence for a in answers], own, atol=1e-6, rtol=0)
    assert not source.ran_own_pass  # no backbone of its own: the input came with the generation
    declined = [a for a in answers if a.abstained]
    assert 0 < len(declined) < len(QUESTIONS)
    # One request per question, which generated the answer and carried the head's input: no second prefill.
    asked = server.native_requests[probes:]
    assert sorted(r["text"] for r in asked) == sorted(prompts)
    assert all(r["return_hidden_states"] and r["sampling_params"]["temperature"] == 0.0 for r in asked)
    greedy = hf.generate(prompts, 0, SamplingParams(max_new_tokens=4, stop=model.template.stop))
    for a, g in zip(answers, greedy, strict=True):
        assert a.abstained or a.answer == g.greedy.text  # the engine's own greedy answer


def test_a_head_on_another_layer_or_a_server_without_hidden_states_keeps_the_separate_pass(tiny_model_dir, tmp_path):
    hf = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    middle = make_head(tiny_model_dir, tmp_path / "middle", layer=1)
    last = make_head(tiny_model_dir, tmp_path / "last", layer=-1)
    with SGLangFormatServer(hf, tiny_model_dir) as url:
        model = HonestModel(sglang_backend(url, tiny_model_dir), HeadSource(middle), template="fewshot")
        assert model.prefill_reader is None  # SGLang hands out the last layer only
    with SGLangFormatServer(hf, tiny_model_dir, hidden_states=False) as url:
        backend = sglang_backend(url, tiny_model_dir)
        assert PROMPT_HIDDEN_STATES not in backend.capabilities
        model = HonestModel(backend, HeadSource(last), template="fewshot")
        assert model.prefill_reader is None
        with pytest.raises(CandorError, match="no prompt hidden states"):
            backend.generate(["Hello"], 0, SamplingParams(max_new_tokens=1), prompt_states=True)


def test_candor_serve_in_front_of_sglang_reads_the_head_from_its_pass(tiny_model_dir, tmp_path):
    """What ``candor serve --backend sglang --base-url URL --head H`` builds (the factory behind it)."""
    from candor.serve.factory import build_model, engine_pass_options

    folder = make_head(tiny_model_dir, tmp_path / "head", layer=-1, template="chat")  # the model's own default
    assert engine_pass_options(folder) == {"prompt_state_layers": (-1,)}  # what the vllm backend is built with
    assert engine_pass_options(make_head(tiny_model_dir, tmp_path / "lora", mode="lora")) == {}
    hf = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    with SGLangFormatServer(hf, tiny_model_dir) as url:
        model = build_model(tiny_model_dir, backend="sglang", head=folder, base_url=url + "/v1", max_new_tokens=3)
        assert model.prefill_reader is not None and model.prefill_reader.from_engine_pass
        answer = model.answer(QUESTIONS[0])
    assert 0.0 <= answer.confidence <= 1.0 and not model.source.ran_own_pass


class _Output:
    """A request output as vLLM returns it: its request id and its ``kv_transfer_params``."""

    def __init__(self, request_id: str, kv_transfer_params: dict | None) -> None:
        self.request_id, self.kv_transfer_params = request_id, kv_transfer_params


def connector_file(folder, name: str, hold: bool = False):
    """A connector's file and lock in ``folder`` (``hold``: the writer still holds the lock, as while it writes)."""
    import fcntl
    import os

    path = folder / f"{name}.safetensors"
    save_file({"hidden_states": torch.zeros(2, 1, 4), "token_ids": torch.tensor([1, 2])}, str(path))
    fd = os.open(str(path) + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
    if hold:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return path, fd
    os.close(fd)
    return path, None


def test_a_states_file_is_found_by_request_id_when_a_stop_string_dropped_its_path(tmp_path):
    """Issue 63 defect 2: vLLM returns ``kv_transfer_params=None`` for a request that ended on a stop string; its
    file, named after the engine's request id (``<id>-<8 characters>``), is found by the output's request id."""
    from candor.backends.extracted_states import StatesFolder

    files = StatesFolder(tmp_path)
    for name in ("1-0a1b2c3d", "10-4e5f6a7b", "0_1-8c9d0e1f"):  # request 1, request 10, request 1's first sample
        connector_file(files.path, name)
    assert files.file_of(_Output("1", None)) == files.path / "1-0a1b2c3d.safetensors"
    assert files.file_of(_Output("10", None)) == files.path / "10-4e5f6a7b.safetensors"
    named = {"hidden_states_path": str(files.path / "0_1-8c9d0e1f.safetensors")}
    assert files.file_of(_Output("1", named)) == files.path / "0_1-8c9d0e1f.safetensors"
    with pytest.raises(CandorError, match="wrote 0 hidden-states files for request 2"):
        files.file_of(_Output("2", None))


def test_the_states_folder_is_cleared_once_files_are_written_and_removed_with_its_owner(tmp_path):
    """Issue 63 defect 2: after a call every file goes, once its writer lets go of its lock (a stop string's is
    written after the call returns); after an error or a cancel (``wait=0``) those still being written stay for
    the next call, and the folder goes with the backend."""
    import os
    import threading

    from candor.backends.extracted_states import StatesFolder

    files = StatesFolder(tmp_path)
    connector_file(files.path, "0-aaaaaaaa")
    _, held = connector_file(files.path, "1-bbbbbbbb", hold=True)
    files.clear(wait=0.0)
    assert sorted(os.listdir(files.path)) == ["1-bbbbbbbb.safetensors", "1-bbbbbbbb.safetensors.lock"]
    threading.Timer(0.3, os.close, [held]).start()  # the writer finishes a moment later
    files.clear(wait=30.0)
    assert os.listdir(files.path) == []
    folder = files.path
    files.close()
    assert not folder.exists()
