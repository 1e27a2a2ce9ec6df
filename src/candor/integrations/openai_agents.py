"""openai-agents' models for ``candor serve``: an abstention is an answer, and each carries its confidence.

Install with ``pip install "candor-honesty[openai-agents]"``::

    from openai import AsyncOpenAI
    from agents import Agent, Runner
    from candor.integrations.openai_agents import CandorResponsesModel, served_answer

    client = AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="...")
    agent = Agent(name="qa", instructions="Answer briefly.", model=CandorResponsesModel("candor", client))
    result = await Runner.run(agent, "Who wrote Hamlet?")
    answer = served_answer(result)          # ServedAnswer: .text, .abstained, .confidence.value

``CandorResponsesModel`` (``/v1/responses``, the SDK's default model class) and
``CandorChatCompletionsModel`` (``/v1/chat/completions``) are the SDK's ``OpenAIResponsesModel`` and
``OpenAIChatCompletionsModel`` with two changes, for ``Runner.run`` and ``Runner.run_streamed`` alike:

- the ``confidence`` object candor puts on the response (or choice) is kept on the answer's message
  item (``raw_item.model_extra["confidence"]``), where ``served_answer`` reads it;
- with ``candor serve --abstain-as refusal``, a refusal is read as the answer's text (an
  ``output_text`` part), so an abstention is a result (``served_answer(result).abstained``)
  instead of the SDK's ``ModelRefusalError``. With ``--abstain-as text`` (the default) it is text already;
- with ``candor serve --stream live`` (chat completions), a refusal that withdraws text already streamed
  replaces it: the run's final output is the refusal alone, not the withdrawn text run into it.

Both read the provider's response where the SDK fetches it (``_fetch_response``, the one method both
classes obtain the OpenAI response through, plain or streamed); the ``openai-agents`` range of the
extra is the one this was tested with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextvars import ContextVar
from typing import Any

try:
    from agents import ItemHelpers, MessageOutputItem, OpenAIChatCompletionsModel, OpenAIResponsesModel
    from openai.types.responses import ResponseOutputText, ResponseTextDeltaEvent, ResponseTextDoneEvent
except ImportError as exc:  # the extra is optional; say how to get it
    raise ImportError(
        'candor.integrations.openai_agents needs openai-agents: pip install "candor-honesty[openai-agents]"'
    ) from exc

from candor.integrations.served import ServedAnswer, ServedConfidence, answer, choice_confidence, refusal_as_text

# The confidences the provider sent during one model call (get_response / stream_response), newest last.
SEEN: ContextVar[list[dict[str, Any]] | None] = ContextVar("candor_agents_confidences", default=None)
# A streamed call's text and refusal as they came (``--stream live``: a refusal after text withdraws it).
STREAMED: ContextVar[dict[str, str] | None] = ContextVar("candor_agents_streamed", default=None)


def output_text(refusal: str) -> ResponseOutputText:
    return ResponseOutputText(type="output_text", text=refusal, annotations=[], logprobs=[])


def text_parts(items: list[Any] | None) -> None:
    """Each Responses ``refusal`` content part of these output items as an ``output_text`` part, in place."""
    for item in items or []:
        content = getattr(item, "content", None)
        if isinstance(content, list):
            item.content = [output_text(p.refusal) if getattr(p, "type", None) == "refusal" else p for p in content]


def text_event(event: Any) -> Any:
    """A Responses stream event with its refusal read as text (a refusal delta/done becomes a text delta/done)."""
    kind = getattr(event, "type", None)
    if kind in ("response.refusal.delta", "response.refusal.done"):
        where = {k: getattr(event, k) for k in ("item_id", "output_index", "content_index", "sequence_number")}
        if kind == "response.refusal.delta":
            return ResponseTextDeltaEvent(type="response.output_text.delta", delta=event.delta, logprobs=[], **where)
        return ResponseTextDoneEvent(type="response.output_text.done", text=event.refusal, logprobs=[], **where)
    part = getattr(event, "part", None)
    if getattr(part, "type", None) == "refusal":
        event.part = output_text(part.refusal)
    if (item := getattr(event, "item", None)) is not None:
        text_parts([item])
    if (response := getattr(event, "response", None)) is not None:
        text_parts(response.output)
    return event


def text_response(response: Any) -> Any:
    """A Responses ``Response`` with its refusal parts read as text, in place."""
    text_parts(response.output)
    return response


def note(confidence: Mapping[str, Any] | None) -> None:
    if confidence is not None and (seen := SEEN.get()) is not None:
        seen.append(dict(confidence))


def keep_on_items(items: list[Any], confidence: Mapping[str, Any] | None) -> None:
    """Put the confidence on the answer's message items (an extra field the SDK carries along)."""
    if confidence is None:
        return
    for item in items:
        if getattr(item, "type", None) == "message":
            item.confidence = dict(confidence)


async def text_events(events: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for event in events:
        response = getattr(event, "response", None)
        if response is not None:
            note((response.model_extra or {}).get("confidence"))
        yield text_event(event)


async def text_chunks(chunks: Any) -> AsyncIterator[Any]:
    streamed = STREAMED.get()
    async for chunk in chunks:
        for choice in chunk.choices or []:
            note(choice_confidence(choice))
            if streamed is not None and choice.index == 0 and choice.delta is not None:
                streamed["text"] += choice.delta.content or ""
                if streamed["text"] and choice.delta.refusal:
                    streamed["withdrawal"] += choice.delta.refusal
        yield refusal_as_text(chunk)


def withdraw(items: list[Any], refusal: str) -> None:
    """The answer's message items with the refusal as their only text (the streamed text it withdrew dropped)."""
    for item in items:
        if getattr(item, "type", None) == "message":
            item.content = [output_text(refusal)]


class CandorModelCalls:
    """What both models add: each call collects the confidences its provider sent and keeps the last."""

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        seen: list[dict[str, Any]] = []
        SEEN.set(seen)
        response = await super().get_response(*args, **kwargs)
        keep_on_items(response.output, seen[-1] if seen else None)
        return response

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        seen: list[dict[str, Any]] = []
        streamed = {"text": "", "withdrawal": ""}
        SEEN.set(seen)
        STREAMED.set(streamed)
        async for event in super().stream_response(*args, **kwargs):
            if getattr(event, "type", None) in ("response.completed", "response.incomplete"):
                if streamed["withdrawal"]:
                    withdraw(event.response.output, streamed["withdrawal"])
                keep_on_items(event.response.output, seen[-1] if seen else None)
            yield event


class CandorResponsesModel(CandorModelCalls, OpenAIResponsesModel):
    """``OpenAIResponsesModel`` that keeps candor's confidence and shows an abstention as an answer."""

    async def _fetch_response(self, *args: Any, **kwargs: Any) -> Any:
        fetched = await super()._fetch_response(*args, **kwargs)
        if hasattr(fetched, "__aiter__"):  # stream=True: the API's events
            return text_events(fetched)
        note((fetched.model_extra or {}).get("confidence"))
        return text_response(fetched)


class CandorChatCompletionsModel(CandorModelCalls, OpenAIChatCompletionsModel):
    """``OpenAIChatCompletionsModel`` that keeps candor's confidence and shows an abstention as an answer."""

    async def _fetch_response(self, *args: Any, **kwargs: Any) -> Any:
        fetched = await super()._fetch_response(*args, **kwargs)
        if isinstance(fetched, tuple):  # stream=True: (the response being built, the chunks)
            response, chunks = fetched
            return response, text_chunks(chunks)
        for choice in fetched.choices or []:
            note(choice_confidence(choice))
        return refusal_as_text(fetched)


def answer_item(result: Any) -> Any:
    """The run's last message item (``Runner.run``'s result, or ``Runner.run_streamed``'s once consumed)."""
    messages = [item for item in result.new_items if isinstance(item, MessageOutputItem)]
    return messages[-1] if messages else None


def served_confidence(result: Any) -> ServedConfidence | None:
    """The confidence of the run's last answer."""
    item = answer_item(result)
    extra = (getattr(item.raw_item, "model_extra", None) or {}) if item is not None else {}
    return ServedConfidence.from_object(extra.get("confidence"))


def served_answer(result: Any) -> ServedAnswer:
    """The run's answer as the user sees it (the refusal text for an abstention) and its confidence."""
    item = answer_item(result)
    text = ItemHelpers.text_message_output(item) if item is not None else None
    return answer(text, served_confidence(result))
