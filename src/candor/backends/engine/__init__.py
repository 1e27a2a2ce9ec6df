"""The engine: candor's batched decode loop for transformers models, on CPU or GPU.

Annotation asks a model for a greedy answer and k samples of many short
prompts, and live serving keeps a batch of requests decoding while new ones
join. ``model.generate`` recomputes a prompt for each of its answers and holds
finished rows until the longest one ends, so the ``hf`` backend
(:mod:`candor.backends.hf`) and live serving (:mod:`candor.serve`) run this
engine instead:

- :mod:`~candor.backends.engine.decode_loop`: rows that join and leave between
  steps, fed a finite list of prompts (:class:`ChunkFeed`) or, in
  :mod:`~candor.backends.engine.live_engine`, a queue of requests
  (:class:`HFLiveEngine`);
- :mod:`~candor.backends.engine.kv_slots`: the slot KV cache, written in place,
  with a shared prefix kept once; :mod:`~candor.backends.engine.kv_batch` the
  fallback on transformers' own cache;
- :mod:`~candor.backends.engine.packed_linear`: linear layers on prepacked
  oneDNN weights (CPU), off for a dtype the probe finds unsupported;
- :mod:`~candor.backends.engine.llama_step`: the lean decode step of a plain
  Llama, checked against transformers' forward on its first step;
- :mod:`~candor.backends.engine.prefix_attention` and
  :mod:`~candor.backends.engine.shared_prefix`: a prompt prefix (the few-shot
  block) computed once and attended to once for all rows;
- :mod:`~candor.backends.engine.op_threads`: a decode step's small ops on one
  thread, its products and attention on all;
- :mod:`~candor.backends.engine.sampling` and
  :mod:`~candor.backends.engine.stops`: the next token of each row and where
  a row ends (stop matchers kept in a bounded cache);
- :mod:`~candor.backends.engine.chunked_prefill`: a long prompt prefilled in
  chunks between the live engine's decode steps, to the bits of one piece;
- :mod:`~candor.backends.engine.continuation_states` and
  :mod:`~candor.backends.engine.prefix_scoring` (with
  :mod:`~candor.backends.engine.candidate_tokens`): the hidden states and
  candidate log-probs of many continuations with each prompt run once;
- :mod:`~candor.backends.engine.layer_states`: one layer's hidden states over
  given token ids, the forward stopped at that layer.

What it is not: a general inference server (no scheduler across models, no
paging, no network: :mod:`candor.serve` is the service), and not used by the
``vllm`` or ``openai`` backends, whose engines are their own. Design:
``docs/engine.md``.

The hf backend and :mod:`candor.serve` use only the names below (``from
candor.backends.engine import X``); they load lazily, so importing this
package costs nothing until a name is used.

May import: :mod:`candor.util`, and :mod:`candor.backends`' ``base`` and ``tokens``.
"""

from __future__ import annotations

from candor.util.lazy import lazy_exports

# public name -> module of this package that defines it
_EXPORTS = {
    "DEFAULT_PREFILL_CHUNK": ".chunked_prefill",
    "ChunkedPrefill": ".chunked_prefill",
    "chunking_runs": ".chunked_prefill",
    "continuation_hidden_states": ".continuation_states",
    "token_hidden_states": ".layer_states",
    "ChunkFeed": ".decode_loop",
    "DecodeJob": ".decode_loop",
    "DecodeLoop": ".decode_loop",
    "HFLiveEngine": ".live_engine",
    "LlamaDecodeStep": ".llama_step",
    "lean_decode_step": ".llama_step",
    "PackedLinears": ".packed_linear",
    "packed_linears_of": ".packed_linear",
    "with_packed_linears": ".packed_linear",
    "score_candidates": ".prefix_scoring",
    "score_candidates_pruned": ".prefix_scoring",
    "row_seed": ".sampling",
    "sample_tokens": ".sampling",
    "SharedPrefix": ".shared_prefix",
    "StopMatcher": ".stops",
    "StopMatchers": ".stops",
    "decoded_vocab": ".stops",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, also=__all__)
