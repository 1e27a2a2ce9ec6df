"""How ``candor serve`` behaves: its limits and modes, set once at startup (:class:`ServeSettings`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from candor.serve.model import DEFAULT_REFUSAL
from candor.util.errors import CandorError


@dataclass(frozen=True)
class ServeSettings:
    """Limits and behaviour of the service; the defaults suit the embedded CPU model."""

    model_id: str = "candor"
    api_key: str | None = None
    refusal: str = DEFAULT_REFUSAL
    max_body_bytes: int = 256 * 1024
    max_question_chars: int = 32_000  # all of a request's messages (or prompts); tokens are bounded by the context
    max_n: int = 4
    max_tokens: int | None = None  # a request's max_tokens at most; None: bounded by the model's context alone
    max_prompts: int = 16  # prompts in one /v1/completions request
    queue_size: int = 64  # questions in flight (answering or waiting) before 503
    max_batch: int = 16  # questions decoded together (1 turns batching off)
    batch_wait_ms: float = 5.0
    cors_origins: tuple[str, ...] = ()  # browser origins allowed by CORS; none: no CORS headers
    log_prompts: bool = False  # the access log carries each request's messages or prompt
    log_records: Path | None = None  # append served answers as candor records (JSONL)
    conversations: str = "accept"  # "refuse": a chat request must hold exactly one user message
    stream: str = "buffered"  # "live": an answer-level source streams tokens before its decision
    docs: bool = False  # /docs and /openapi.json, behind the key
    body_timeout_s: float = 10.0  # a body not fully sent in this time answers 408
    honest_folder: Path | None = None  # what SIGHUP and POST /admin/reload load again (--honest DIR)
    honest_root: Path | None = None  # POST /admin/reload may name folders inside it only (--honest-root)
    admin_key: str | None = None  # the operator key: /admin/*, trusted labels (None: those routes are off)

    def __post_init__(self) -> None:
        if self.admin_key is not None and self.admin_key == self.api_key:
            raise CandorError("the operator key must differ from the inference key (--admin-key-env, --api-key-env)")
        for name, allowed in (("conversations", CONVERSATION_MODES), ("stream", STREAM_MODES)):
            if getattr(self, name) not in allowed:
                raise CandorError(f"--{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")


CONVERSATION_MODES = ("accept", "refuse")
STREAM_MODES = ("buffered", "live")
# A request's max_tokens cap where the backend does not say its context (an OpenAI-compatible server).
UNKNOWN_CONTEXT_MAX_TOKENS = 4096
