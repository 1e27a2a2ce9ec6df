"""A chat-template renderer from a tokenizer alone, for code that has no backend (training, diagnostics).

The ``hf`` and ``vllm`` backends render their ``render_chat`` through it
(:class:`candor.backends.tokenizer_mixin.TokenizerMixin`), so
a prompt built from a tokenizer is exactly the prompt a backend scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from candor.util.errors import CandorError


class TokenizerChat:
    """The one backend call a prompt needs (``render_chat``), from a tokenizer alone (training, diagnostics)."""

    def __init__(self, tokenizer: Any, model_name: str = "model") -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name

    def render_chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise CandorError(
                f"model {self.model_name!r} has no chat template; use a completion prompt template such as 'fewshot'"
            )
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
