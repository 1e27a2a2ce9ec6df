"""Constrained decoding: answers that are JSON valid for a schema, compiled to token masks with xgrammar.

A :class:`JsonConstraint` asks for output that is JSON validating against a
JSON Schema; with ``allow_text`` the output may instead be plain text that does
not start with ``{`` or ``[`` (a tool call the model may choose not to make).
Backends that can decode under a constraint declare
:data:`candor.backends.base.CONSTRAINED`:

| backend | how |
|---|---|
| ``hf`` | a token bitmask per row per step (:mod:`candor.backends.engine.decode_loop`) |
| ``openai``, ``vllm``, ``sglang`` | the upstream's ``response_format`` ``json_schema``; ``allow_text`` refused |

On the ``hf`` backend a :class:`GrammarCache` (one per tokenizer) compiles
each (schema, allow_text) once and keeps the most recently used
:data:`GRAMMAR_CACHE_SIZE` of them: clients choose their schemas, so the cache
is bounded. JSON is generated compact, without free whitespace (``", "`` and
``": "`` between items), so a small model cannot spend its tokens on blank
space, and a schema's object keys are closed unless it says otherwise
(xgrammar's strict mode). An object's keys are generated in the order its
schema lists them (a tool call's ``name`` before its ``arguments``). An
answer that reaches the token cap before the JSON is complete ends there
(``finish_reason`` ``"length"``) and is not valid JSON.

xgrammar comes with the ``serve`` extra (``pip install 'candor-honesty[serve]'``);
it is imported when the first constraint is compiled.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from candor.util.errors import CandorError

# Compiled grammars kept per tokenizer (each a few hundred kB at a 49k vocabulary).
GRAMMAR_CACHE_SIZE = 64

# The plain-text branch of ``allow_text``: anything whose first character is not '{', '[' or blank space
# (so "  {" cannot slip a half-made call past the schema; the answer's text is stripped anyway).
TEXT_EBNF = "root ::= [^{[ \\t\\r\\n] [^]*"

# xgrammar's errors start with "[hh:mm:ss] /path/file.cc:line: "; the rest is the message.
_XGRAMMAR_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")


@dataclass(frozen=True)
class JsonConstraint:
    """The output must be JSON that validates against ``schema``; with ``allow_text``, OR plain text
    that does not start with '{' or '[' (tool_choice "auto": the model chooses to call or to answer)."""

    # The JSON text of a JSON Schema, its keys in their own order (the cache key). Not sorted: xgrammar generates an
    # object's properties in the schema's order, so a call must name its function before its arguments.
    schema: str
    allow_text: bool = False

    @classmethod
    def of(cls, schema: dict[str, Any], allow_text: bool = False) -> JsonConstraint:
        """The constraint of a JSON Schema given as a dict (its canonical text is the cache key)."""
        if not isinstance(schema, dict):
            raise CandorError(f"a JSON schema must be a JSON object, got {type(schema).__name__}")
        try:
            text = json.dumps(schema)
        except (TypeError, ValueError) as exc:
            raise CandorError(f"the JSON schema is not JSON: {exc}") from None
        return cls(schema=text, allow_text=bool(allow_text))

    @property
    def schema_dict(self) -> dict[str, Any]:
        """The schema as a dict."""
        return json.loads(self.schema)


def _one_line(exc: BaseException) -> str:
    """xgrammar's error message on one line, without its source location."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return _XGRAMMAR_PREFIX.sub("", lines[0]) if lines else type(exc).__name__


def import_xgrammar() -> Any:
    """The xgrammar module, or a CandorError saying how to install it."""
    try:
        import xgrammar
    except ImportError:
        raise CandorError(
            "constrained decoding on the hf backend needs xgrammar: pip install 'candor-honesty[serve]'"
        ) from None
    return xgrammar


def special_ids(tokenizer: Any) -> set[int]:
    """The ids of the tokenizer's special tokens (end of sequence, chat markers): never part of an answer's text."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
    for token_id, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(token_id))
    return ids


def tokenizer_info(xgr: Any, tokenizer: Any, vocab_size: int, stop_ids: Iterable[int]) -> Any:
    """xgrammar's view of ``tokenizer``, its special tokens made empty.

    xgrammar reads a byte-level vocabulary's special tokens as their text
    (``<|im_end|>`` is ten characters to it), so a JSON string could take the
    end-of-sequence token and end the row inside the JSON; a token of empty
    text is one it never allows, but as a stop token once the grammar is done.
    """
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    vocab = list(info.decoded_vocab)
    for token_id in special_ids(tokenizer):
        if token_id < len(vocab):
            vocab[token_id] = b""
    return xgr.TokenizerInfo(
        vocab,
        xgr.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=sorted(int(i) for i in stop_ids),
        add_prefix_space=info.add_prefix_space,
    )


class GrammarCache:
    """Compiled grammars of one tokenizer by constraint, the :data:`GRAMMAR_CACHE_SIZE` most recently used kept.

    ``vocab_size`` is the width of the model's logits (it may exceed the
    tokenizer's length); ``stop_ids`` are the tokens that end a row, which a
    matcher accepts once the JSON is complete. Thread-safe: the live engine
    compiles on its builder thread while ``generate`` may compile on another.
    """

    def __init__(
        self, tokenizer: Any, vocab_size: int, stop_ids: Iterable[int], size: int = GRAMMAR_CACHE_SIZE
    ) -> None:
        if size < 1:
            raise CandorError(f"the grammar cache must hold at least 1 grammar, got {size}")
        self.size = size
        self.vocab_size = int(vocab_size)
        self._xgr = import_xgrammar()
        info = tokenizer_info(self._xgr, tokenizer, self.vocab_size, stop_ids)
        # xgrammar's own cache is off: this one is the bound.
        self._compiler = self._xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._grammars: OrderedDict[JsonConstraint, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # grammars compiled so far (a cache miss each)

    def __len__(self) -> int:
        return len(self._grammars)

    def cached(self, constraint: JsonConstraint) -> Any | None:
        """The compiled grammar of ``constraint`` if kept (marked as just used), else None."""
        with self._lock:
            grammar = self._grammars.get(constraint)
            if grammar is not None:
                self._grammars.move_to_end(constraint)
            return grammar

    def get(self, constraint: JsonConstraint) -> Any:
        """The compiled grammar of ``constraint``, compiled now if not kept; CandorError if it cannot be."""
        grammar = self.cached(constraint)
        if grammar is not None:
            return grammar
        grammar = self._compile(constraint)
        with self._lock:
            self._grammars[constraint] = grammar
            self._grammars.move_to_end(constraint)
            while len(self._grammars) > self.size:
                self._grammars.popitem(last=False)
            self.compiled += 1
        return grammar

    def matcher(self, constraint: JsonConstraint) -> Any:
        """A fresh xgrammar ``GrammarMatcher`` of ``constraint`` (one per generated row)."""
        return self._xgr.GrammarMatcher(self.get(constraint))

    def _compile(self, constraint: JsonConstraint) -> Any:
        xgr = self._xgr
        try:
            grammar = xgr.Grammar.from_json_schema(constraint.schema, any_whitespace=False, strict_mode=True)
            if constraint.allow_text:
                grammar = xgr.Grammar.union(grammar, xgr.Grammar.from_ebnf(TEXT_EBNF))
            return self._compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise CandorError(f"the JSON schema cannot be compiled to a grammar: {_one_line(exc)}") from None


def bitmask_for(matchers: list[Any], vocab_size: int) -> Any:
    """The allowed next tokens of each matcher as one xgrammar bitmask (one int32 row per matcher)."""
    xgr = import_xgrammar()
    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab_size)
    for i, matcher in enumerate(matchers):
        matcher.fill_next_token_bitmask(bitmask, i)
    return bitmask


def apply_bitmask(logits: Any, bitmask: Any) -> None:
    """Set the logits of the tokens ``bitmask`` forbids to -inf, in place (row i of both is one matcher).

    The 32 bits of each int32 word are unpacked with one shift and one ``masked_fill_`` for all rows, on the
    logits' device (xgrammar's own CPU kernel took about six times as long at a 49k vocabulary).
    """
    import torch

    bitmask = bitmask.to(logits.device)
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = (bitmask.unsqueeze(-1) >> shifts).bitwise_and_(1).view(bitmask.shape[0], -1)[:, : logits.shape[-1]]
    logits.masked_fill_(allowed == 0, float("-inf"))
