"""A fixture of SGLang's wire format on 127.0.0.1, answering from a real (tiny) model: not SGLang itself.

It speaks what the ``sglang`` backend reads, in the shapes SGLang documents
(see ``candor.backends.sglang``): ``GET /v1/models``, ``POST /v1/completions``
(OpenAI's shape; ``echo`` refused, as a server without prompt scoring does) and
the native ``POST /generate`` with ``meta_info.hidden_states`` (first the
prefill's rows, one per prompt position, then one vector per generated token),
``output_token_logprobs`` (``[logprob, id, text]``), ``output_top_logprobs``,
``output_ids``, ``finish_reason`` and token counts. Every number comes from a
real forward pass of the model it is given: the last layer after the final
norm (transformers' last ``output_hidden_states`` entry), which is what SGLang's
logits processor receives. ``--enable-return-hidden-states`` is modelled by
``hidden_states``: False answers 400 to a request asking for them.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from candor.backends.base import Completion, SamplingParams
from candor.backends.hf import HFBackend
from candor.backends.tokens import encode


class SGLangFormatServer:
    """``with SGLangFormatServer(backend, name) as url:`` serves at ``url`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, backend: HFBackend, model_name: str, hidden_states: bool = True) -> None:
        self.backend = backend
        self.model_name = model_name
        self.hidden_states = hidden_states
        self.native_requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()  # the model runs one request at a time
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------ model work

    def _generate(self, prompt: str, sampling: dict[str, Any], n: int, seed: int | None) -> list[Completion]:
        temperature = float(sampling.get("temperature", 1.0))
        params = SamplingParams(
            max_new_tokens=int(sampling.get("max_new_tokens", 16)),
            temperature=temperature if temperature > 0 else 1.0,
            top_p=float(sampling.get("top_p", 1.0)),
            top_k=int(sampling.get("top_k", 0)),
            stop=tuple(sampling.get("stop") or ()),
        )
        with self.lock:
            g = self.backend.generate(
                [prompt], 0 if temperature == 0 else n, params, greedy=temperature == 0, seeds=[seed or 0]
            )[0]
        return [g.greedy] if temperature == 0 else list(g.samples)  # type: ignore[list-item]

    def _states(self, prompt_ids: list[int], answer_ids: list[int]) -> list[Any]:
        """SGLang's ``meta_info.hidden_states``: the prefill's rows, then one vector per generated token."""
        ids = torch.tensor([prompt_ids + answer_ids])
        with self.lock, torch.no_grad():
            last = self.backend.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0].float()
        rows = last.tolist()
        # decode step k reads generated token k - 1; the last generated token is never read back
        return [rows[: len(prompt_ids)], *rows[len(prompt_ids) : len(prompt_ids) + max(len(answer_ids) - 1, 0)]]

    def _native(self, body: dict[str, Any]) -> tuple[int, Any]:
        if body.get("return_hidden_states") and not self.hidden_states:
            return 400, {"error": "hidden states are off: run the server with --enable-return-hidden-states"}
        sampling = body.get("sampling_params") or {}
        n = int(sampling.get("n", 1))
        prompt = str(body["text"])
        prompt_ids = encode(self.backend.tokenizer, [prompt])[0]
        results = []
        for c in self._generate(prompt, sampling, n, sampling.get("sampling_seed")):
            meta: dict[str, Any] = {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(c.token_ids),
                "finish_reason": {"type": c.finish_reason or "length"},
            }
            if body.get("return_logprob"):
                meta["output_token_logprobs"] = [
                    [lp, tid, tok] for lp, tid, tok in zip(c.logprobs, c.token_ids, c.tokens, strict=True)
                ]
                meta["output_top_logprobs"] = [[[v, None, t] for t, v in pos.items()] for pos in c.top_logprobs]
            if body.get("return_hidden_states"):
                meta["hidden_states"] = self._states(prompt_ids, list(c.token_ids))
            text = self.backend.tokenizer.decode(c.token_ids)
            results.append({"text": text, "output_ids": list(c.token_ids), "meta_info": meta})
        return 200, results[0] if n == 1 else results

    def _completions(self, body: dict[str, Any]) -> tuple[int, Any]:
        if body.get("echo"):
            return 400, {"error": {"message": "echo is not supported here", "type": "invalid_request_error"}}
        sampling = {
            "temperature": body.get("temperature", 1.0),
            "max_new_tokens": body.get("max_tokens", 16),
            "top_p": body.get("top_p", 1.0),
            "top_k": body.get("top_k", 0),
            "stop": body.get("stop"),
        }
        prompt = str(body["prompt"])
        completions = self._generate(prompt, sampling, int(body.get("n", 1)), body.get("seed"))
        choices = []
        for i, c in enumerate(completions):
            choice: dict[str, Any] = {
                "index": i,
                "text": self.backend.tokenizer.decode(c.token_ids),
                "finish_reason": c.finish_reason or "length",
            }
            if body.get("logprobs") is not None:
                choice["logprobs"] = {
                    "tokens": list(c.tokens),
                    "token_logprobs": list(c.logprobs),
                    "top_logprobs": [dict(list(pos.items())[: int(body["logprobs"])]) for pos in c.top_logprobs],
                }
            choices.append(choice)
        usage = {
            "prompt_tokens": len(encode(self.backend.tokenizer, [prompt])[0]),
            "completion_tokens": sum(len(c.token_ids) for c in completions),
        }
        return 200, {
            "id": "cmpl-0",
            "object": "text_completion",
            "model": self.model_name,
            "choices": choices,
            "usage": usage,
        }

    # ------------------------------------------------------------ HTTP

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": outer.model_name, "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/generate":
                    with outer.lock:
                        outer.native_requests.append(body)
                    self._send(*outer._native(body))
                elif self.path == "/v1/completions":
                    self._send(*outer._completions(body))
                else:
                    self._send(404, {"error": "not found"})

        return Handler
