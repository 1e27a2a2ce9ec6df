"""LangChain's chat model for ``candor serve``: each message carries its confidence; an abstention is a refusal.

Install with ``pip install "candor[langchain]"``::

    from candor.integrations.langchain import ChatCandor
    llm = ChatCandor(base_url="http://127.0.0.1:8000/v1", model="candor", api_key="...")
    msg = llm.invoke("Who wrote Hamlet?")
    msg.response_metadata["confidence"]["value"]   # the confidence object of the answer
    msg.additional_kwargs.get("refusal")           # the refusal text when the model abstained

It is LangChain's ``ChatOpenAI`` (every option of it works) with one addition: the
``confidence`` object candor puts on each choice is copied into the message's
``response_metadata``, for ``invoke`` and for ``stream`` (on the last chunk of
the answer, so that aggregated chunks hold it once), and a streamed refusal
(``delta.refusal``, which ``ChatOpenAI`` drops) is kept in ``additional_kwargs``.
"""

from __future__ import annotations

from typing import Any

try:
    from langchain_core.messages import BaseMessage
    from langchain_core.outputs import ChatGenerationChunk, ChatResult
    from langchain_openai import ChatOpenAI
except ImportError as exc:  # the extra is optional; say how to get it
    raise ImportError('candor.integrations.langchain needs langchain-openai: pip install "candor[langchain]"') from exc


class ChatCandor(ChatOpenAI):
    """``ChatOpenAI`` that keeps candor's confidence and refusals (see the module docstring)."""

    def _create_chat_result(self, response: Any, generation_info: dict[str, Any] | None = None) -> ChatResult:
        result = super()._create_chat_result(response, generation_info)
        data = response if isinstance(response, dict) else response.model_dump()
        for generation, choice in zip(result.generations, data.get("choices") or [], strict=False):
            refusal = (choice.get("message") or {}).get("refusal")
            keep_candor_fields(generation.message, choice.get("confidence"), refusal)
        return result

    def _convert_chunk_to_generation_chunk(
        self, chunk: dict[str, Any], default_chunk_class: type, base_generation_info: dict[str, Any] | None
    ) -> ChatGenerationChunk | None:
        out = super()._convert_chunk_to_generation_chunk(chunk, default_chunk_class, base_generation_info)
        choices = chunk.get("choices") or []
        if out is not None and choices and choices[0].get("finish_reason"):
            # Only the answer's last chunk: LangChain adds chunks' metadata together, and would
            # concatenate a confidence object seen twice (a head's sits on the first chunk too).
            delta = choices[0].get("delta") or {}
            keep_candor_fields(out.message, choices[0].get("confidence"), delta.get("refusal"))
        return out


def keep_candor_fields(message: BaseMessage, confidence: dict[str, Any] | None, refusal: str | None) -> None:
    """Put the confidence object in ``response_metadata`` and a refusal in ``additional_kwargs``."""
    if confidence is not None:
        message.response_metadata["confidence"] = confidence
    if refusal:
        message.additional_kwargs["refusal"] = refusal
