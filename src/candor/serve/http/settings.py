"""How ``candor serve`` behaves: its limits and modes, set once at startup (:class:`ServeSettings`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from candor.annotation.served_store import Retention
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
    log_records: Path | None = None  # also export served answers and labels as candor records (JSONL)
    store: str | None = None  # the served-answer store's URL; default with log_records: SQLite beside it
    retention: Retention = Retention()  # what the store keeps (rows, age, the remembered index's bytes)
    store_timeout_s: float = 5.0  # a store call not done in this time fails: the store is unavailable (record_log)
    conversations: str = "accept"  # "refuse": a chat request must hold exactly one user message
    stream: str = "buffered"  # "live": an answer-level source streams tokens before its decision
    docs: bool = False  # /docs and /openapi.json, behind the key
    body_timeout_s: float = 10.0  # a body not fully sent in this time answers 408
    honest_folder: Path | None = None  # what SIGHUP and POST /admin/reload load again (--honest DIR)
    # How an abstention is shown: "text": the refusal text is the answer's text (every client shows it);
    # "refusal": OpenAI's refusal field and content part (some frameworks raise on it). docs/serving.md
    abstain_as: str = "text"

    honest_root: Path | None = None  # POST /admin/reload may name folders inside it only (--honest-root)
    admin_key: str | None = None  # the operator key: /admin/*, trusted labels (None: those routes are off)

    def __post_init__(self) -> None:
        if self.admin_key is not None and self.admin_key == self.api_key:
            raise CandorError("the operator key must differ from the inference key (--admin-key-env, --api-key-env)")
        if not self.store_timeout_s > 0:
            raise CandorError(f"the store timeout must be positive, got {self.store_timeout_s}")
        if self.store is not None and "://" not in self.store:
            raise CandorError(f"--store must be a database URL (sqlite:///FILE.db, postgresql://…), got {self.store!r}")
        modes = (("conversations", CONVERSATION_MODES), ("stream", STREAM_MODES), ("abstain_as", ABSTAIN_AS_MODES))
        for name, allowed in modes:
            if getattr(self, name) not in allowed:
                flag = name.replace("_", "-")
                raise CandorError(f"--{flag} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        if self.stream == "live" and self.abstain_as == "text":
            # Streamed text cannot be taken back; only OpenAI's refusal field withdraws it.
            raise CandorError(
                "--stream live needs --abstain-as refusal: text streamed before an abstention can only be "
                "withdrawn by a refusal"
            )


CONVERSATION_MODES = ("accept", "refuse")
STREAM_MODES = ("buffered", "live")
ABSTAIN_AS_MODES = ("text", "refusal")
# A request's max_tokens cap where the backend does not say its context (an OpenAI-compatible server).
UNKNOWN_CONTEXT_MAX_TOKENS = 4096


def store_url(settings: ServeSettings) -> str | None:
    """Where served answers go: ``--store``, else a SQLite file beside ``--log-records`` (FILE.db), else nowhere."""
    if settings.store is not None:
        return settings.store
    if settings.log_records is None:
        return None
    beside = settings.log_records.with_suffix(".db")
    if beside == settings.log_records:
        beside = settings.log_records.with_name(settings.log_records.name + ".store.db")
    return f"sqlite:///{beside}"
