"""The text calls of a backend that holds its model's tokenizer (``hf``, ``vllm``): chat, tokens, text.

Both backends feed their engine token ids made by the same tokenizer the same
way, so a prompt, its tokens and a token count are the same on either engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from candor.backends.chat import TokenizerChat
from candor.backends.tokens import encode as encode_tokens


class TokenizerMixin:
    """``render_chat``, ``tokenize``, ``decode`` and ``encode`` from ``self.tokenizer`` (a transformers tokenizer)."""

    tokenizer: Any
    model_name: str

    def render_chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return TokenizerChat(self.tokenizer, self.model_name).render_chat(messages, add_generation_prompt)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids as the model is fed them: special tokens, without doubling a BOS the prompt already has."""
        return encode_tokens(self.tokenizer, prompts)
