"""pydantic-ai's OpenAI chat model for ``candor serve``: an abstention is an answer, and each carries its confidence.

Install with ``pip install "candor-honesty[pydantic-ai]"``::

    from pydantic_ai import Agent
    from pydantic_ai.providers.openai import OpenAIProvider
    from candor.integrations.pydantic_ai import CandorChatModel, served_answer

    model = CandorChatModel("candor", provider=OpenAIProvider(base_url="http://127.0.0.1:8000/v1", api_key="..."))
    result = await Agent(model, instructions="Answer briefly.").run("Who wrote Hamlet?")
    answer = served_answer(result)          # ServedAnswer: .text, .abstained, .confidence.value

``CandorChatModel`` is pydantic-ai's ``OpenAIChatModel`` (every option of it works) through the two
hooks that class documents for subclasses (``_process_provider_details`` and
``_streamed_response_cls``) and its response processing:

- the ``confidence`` object candor puts on the choice is kept in the response's ``provider_details``,
  for ``run`` and ``run_stream``;
- with ``candor serve --abstain-as refusal``, the refusal is read as the answer's text, so an
  abstention is a result (``served_answer(result).abstained``) instead of pydantic-ai's
  ``ContentFilterError``. With ``--abstain-as text`` (the default) it is text already;
- with ``candor serve --stream live``, a refusal that withdraws text already streamed replaces it: the
  response's text (``run_stream``'s output) is the refusal alone, not the withdrawn text run into it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

try:
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIStreamedResponse
except ImportError as exc:  # the extra is optional; say how to get it
    raise ImportError(
        'candor.integrations.pydantic_ai needs pydantic-ai: pip install "candor-honesty[pydantic-ai]"'
    ) from exc

from candor.integrations.served import ServedAnswer, ServedConfidence, answer, choice_confidence, refusal_as_text


class CandorStreamedResponse(OpenAIStreamedResponse):
    """pydantic-ai's streamed OpenAI response, keeping candor's confidence and reading a refusal as text.

    A refusal after streamed text (``--stream live`` withdrawing it) is kept apart: ``get`` answers with the
    refusal as the response's only text, so the run's output is never the withdrawn text and the refusal joined.
    """

    def _map_chunk(self, chunk: ChatCompletionChunk) -> Iterator[Any]:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None and delta.content:
            self.candor_streamed_text = True
        if delta is not None and delta.refusal and getattr(self, "candor_streamed_text", False):
            self.candor_withdrawal = getattr(self, "candor_withdrawal", "") + delta.refusal
            quiet = delta.model_copy(update={"refusal": None, "content": None})
            return super()._map_chunk(
                chunk.model_copy(update={"choices": [chunk.choices[0].model_copy(update={"delta": quiet})]})
            )
        return super()._map_chunk(refusal_as_text(chunk))

    def get(self) -> ModelResponse:
        response = super().get()
        withdrawal = getattr(self, "candor_withdrawal", None)
        if not withdrawal:
            return response
        kept = [p for p in response.parts if not isinstance(p, TextPart)]
        return replace(response, parts=[*kept, TextPart(content=withdrawal)])

    def _map_chunk_provider_details(self, chunk: ChatCompletionChunk) -> dict[str, Any] | None:
        details = dict(super()._map_chunk_provider_details(chunk) or {})
        if chunk.choices and (confidence := choice_confidence(chunk.choices[0])) is not None:
            details["confidence"] = confidence  # the choice's last chunk carries it (a head's first one too)
        return details or None


class CandorChatModel(OpenAIChatModel):
    """``OpenAIChatModel`` that keeps candor's confidence and shows an abstention as an answer (module docstring)."""

    def _process_response(self, response: ChatCompletion | str, **kwargs: Any) -> Any:
        return super()._process_response(refusal_as_text(response), **kwargs)

    def _process_provider_details(self, response: ChatCompletion) -> dict[str, Any] | None:
        details = dict(super()._process_provider_details(response) or {})
        if response.choices and (confidence := choice_confidence(response.choices[0])) is not None:
            details["confidence"] = confidence
        return details or None

    @property
    def _streamed_response_cls(self) -> type[OpenAIStreamedResponse]:
        return CandorStreamedResponse


def served_confidence(result: Any) -> ServedConfidence | None:
    """The confidence of a run's last answer (an ``AgentRunResult`` or a finished ``StreamedRunResult``)."""
    details = getattr(result.response, "provider_details", None) or {}
    return ServedConfidence.from_object(details.get("confidence"))


def served_answer(result: Any, output: str | None = None) -> ServedAnswer:
    """The run's answer as the user sees it, whether it abstained, and its confidence.

    ``result`` is ``agent.run``'s result, or ``agent.run_stream``'s once consumed, with the text
    ``await stream.get_output()`` returned as ``output``.
    """
    if output is None:
        output = getattr(result, "output", None)
    return answer(output if isinstance(output, str) else None, served_confidence(result))
