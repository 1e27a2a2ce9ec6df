"""How :class:`~candor.serve.model.HonestModel` answers an agent's turn: a tool call or a structured output.

The protocol is the question's (see :mod:`candor.serve.agent_turns`): a question-level source (a head)
decides on the question before anything is generated, so a declined turn calls no tool; an answer-level
source scores the greedy output and its samples, all decoded under the turn's grammar, after their texts
are put in canonical form. A consistency method's value on an agent turn is the share of samples whose
output is *equal* to the greedy one (:func:`~candor.serve.agent_turns.exact_agreement`), as the design
asks of a call (same function, arguments equal after normalisation), not a text similarity.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from candor.annotation.records import Record
from candor.backends.base import (
    CONSTRAINED,
    GENERATE,
    LIVE_DECODE,
    TOKENIZER,
    UPSTREAM_TOOLS,
    Completion,
    DecodeRequest,
    Generations,
    backend_capabilities,
)
from candor.serve.agent_turns import (
    AGENT_MAX_NEW_TOKENS,
    AgentReply,
    AgentTurn,
    call_values,
    canonical_text,
    exact_agreement,
    field_values,
    parsed_output,
)
from candor.serve.answering import (
    PROTOCOL_SAMPLES,
    Ask,
    ContextLengthExceeded,
    HonestAnswer,
    Prompted,
    question_seed,
    reply_seed,
)
from candor.serve.batching import done
from candor.serve.confidence_sources import answer_records
from candor.tool_calls import render_tool_prompt
from candor.util.errors import CandorError

LOCAL, REMOTE = "local", "remote"  # the turn decoded here under a grammar, or passed on to an upstream


def agent_path(backend: Any, turn: AgentTurn) -> str:
    """Where an agent turn is decoded: :data:`LOCAL` (an in-process engine under the grammar) or :data:`REMOTE`
    (an upstream's own tool calling and structured output); a :class:`CandorError` when neither can serve it."""
    caps = backend_capabilities(backend)
    if {CONSTRAINED, TOKENIZER, LIVE_DECODE} <= caps:
        return LOCAL
    needs = UPSTREAM_TOOLS if turn.calls_tools else CONSTRAINED if turn.output_schema is not None else GENERATE
    if needs in caps and hasattr(backend, "render_chat"):
        return REMOTE
    raise CandorError(
        "tool calls and structured output need a backend that decodes under a grammar (hf) or passes them on to "
        f"its upstream (openai with --endpoint chat); this {getattr(backend, 'name', type(backend).__name__)!r} "
        "backend cannot"
    )


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checked turns back in OpenAI's wire shape (calls' arguments as JSON text), for an upstream's chat endpoint."""
    out = []
    for m in messages:
        wire = {k: v for k, v in m.items() if k != "tool_calls"}
        if m.get("tool_calls"):
            wire["content"] = m["content"] or None
            wire["tool_calls"] = [
                {
                    "id": c["id"] or f"call_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for i, c in enumerate(m["tool_calls"])
            ]
        out.append(wire)
    return out


# A method whose value on an agent turn is not its own formula on the text: consistency is exact agreement.
AGENT_SCORES: dict[str, Callable[[Record], float]] = {
    "consis-lex": exact_agreement,
    "consis-sem": exact_agreement,
}


class AgentAnswers:
    """The agent half of :class:`~candor.serve.model.HonestModel` (a mixin: it uses the model's own state).

    The model's own steps it calls on itself are declared here and defined by the model.
    """

    async def _question_confidence(self, item: Any, engine: Any) -> float:
        raise NotImplementedError

    def _declines(self, confidence: float) -> bool:
        raise NotImplementedError

    def _abstention(self, confidence: float, reason: str, *args: Any, **kwargs: Any) -> HonestAnswer:
        raise NotImplementedError

    def _calibrated(self, raw: Any) -> Any:
        raise NotImplementedError

    def _answered(self, *args: Any, **kwargs: Any) -> HonestAnswer:
        raise NotImplementedError

    def prepare_agent(self, turn: AgentTurn, max_new_tokens: int | None = None) -> Prompted:
        """The turn rendered and counted; a backend that can neither constrain its decoding nor pass tools on is
        refused before any work.

        In process (``hf``): the model's chat template with its tools, or the documented tool prompt, decoded
        under the grammar. In front of an upstream (``--backend openai``): the conversation as chat messages,
        its tools passed on to the upstream's own tool calling, a structured output as its ``response_format``.
        """
        model: Any = self
        messages = list(turn.messages)
        if turn.output_schema is not None:
            schema = json.dumps(turn.output_schema, sort_keys=True)
            ask = {"role": "system", "content": f"Reply with only a JSON value that matches this JSON Schema: {schema}"}
            messages = [ask, *messages]
        if agent_path(model.backend, turn) == REMOTE:
            prompt = model.backend.render_chat(wire_messages(messages))
            return Prompted(question=turn.question(), prompt=prompt, history=turn.history()[:-1], agent=turn)
        tools = turn.offered() if turn.calls_tools else ()
        choice: Any = turn.tool_choice if turn.tool_choice in ("auto", "required") else tools[0] if tools else "none"
        prompt = render_tool_prompt(model.backend.tokenizer, messages, tools, choice)
        count = len(model.backend.tokenize(prompt))
        limit = model.context_length
        answer = max_new_tokens or AGENT_MAX_NEW_TOKENS
        if limit is not None and count + answer > limit:
            raise ContextLengthExceeded(
                f"the prompt is {count} tokens with its tools; with {answer} answer tokens it exceeds the "
                f"model's context of {limit} tokens"
            )
        return Prompted(
            question=turn.question(), prompt=prompt, prompt_tokens=count, history=turn.history()[:-1], agent=turn
        )

    async def _agent_generations(self, ask: Ask, engine: Any, greedy_only: bool = False) -> Generations:
        """The protocol's greedy output and samples: from the engine (under the grammar, or the upstream's
        structured output), or with the tools passed on to the upstream's own tool calling."""
        model: Any = self
        turn: AgentTurn = ask.prompted.agent
        request = self._agent_request(ask, greedy_only=greedy_only)
        if not (turn.calls_tools and agent_path(model.backend, turn) == REMOTE):
            return await done(engine.submit(request))
        choice: Any = turn.tool_choice
        if choice not in ("auto", "required", "none"):
            choice = {"type": "function", "function": {"name": choice}}
        gens = await asyncio.to_thread(
            model.backend.generate_tool_calls,
            [request.prompt],
            request.n,
            request.params,
            tools=[t.to_openai() for t in turn.tools],
            tool_choice=choice,
            parallel_tool_calls=turn.parallel,
            greedy=True,
            seeds=[request.seed],
        )
        return gens[0]  # type: ignore[no-any-return]

    async def _answer_agent(self, ask: Ask, engine: Any) -> list[HonestAnswer]:
        """An agent turn's ``n`` choices: declined before any call, or the protocol scored then replied."""
        model: Any = self
        turn: AgentTurn = ask.prompted.agent
        if model.source.before_generation:
            confidence = await self._question_confidence(ask.prompted.item(), engine)
            if self._declines(confidence):
                declined = self._abstention(confidence, "declined before generating (no tool is called)")
                ask.decided(declined)
                return [declined] * ask.reply.n
            protocol = await self._agent_generations(ask, engine, greedy_only=True)
            return [self._agent_answer(ask, protocol.greedy, confidence, [], None)] * ask.reply.n
        protocol = await self._agent_generations(ask, engine)
        ask.check_alive()
        greedy = canonical_text(turn, protocol.greedy)
        samples = [canonical_text(turn, s) for s in protocol.samples]
        rec = answer_records([ask.prompted.item()], [greedy], [samples], model.provenance())[0]
        score = AGENT_SCORES.get(model.method)
        try:
            raw = np.array([score(rec)]) if score is not None else model.source.score_records([rec], model.backend)
            confidence = float(self._calibrated(raw)[0])
        except CandorError as exc:
            return [self._abstention(0.0, f"the output could not be scored: {exc}", rec=rec, below=False)] * ask.reply.n
        if self._declines(confidence):
            declined = self._abstention(confidence, "output scored below the threshold (no tool is called)", None, rec)
            return [declined] * ask.reply.n
        replies = [protocol.greedy] * ask.reply.n
        if ask.reply.temperature > 0 and agent_path(model.backend, turn) == LOCAL:
            g = await done(engine.submit(self._agent_request(ask, reply=True)))
            replies = g.samples[: ask.reply.n]
        sample_texts = [s.text for s in protocol.samples]
        return [self._agent_answer(ask, c, confidence, sample_texts, rec) for c in replies]

    def _agent_request(self, ask: Ask, greedy_only: bool = False, reply: bool = False) -> DecodeRequest:
        model: Any = self
        turn: AgentTurn = ask.prompted.agent
        cap = ask.reply.max_new_tokens or AGENT_MAX_NEW_TOKENS
        if reply:
            params = replace(
                PROTOCOL_SAMPLES,
                max_new_tokens=cap,
                temperature=ask.reply.temperature,
                top_p=ask.reply.top_p,
                top_k=0,
                stop=ask.reply.stop,
            )
            return DecodeRequest(
                prompt=ask.prompted.prompt,
                n=ask.reply.n,
                params=params,
                greedy=False,
                seed=reply_seed(ask),
                constraint=turn.constraint(),
            )
        params = replace(PROTOCOL_SAMPLES, max_new_tokens=cap, stop=ask.reply.stop)
        return DecodeRequest(
            prompt=ask.prompted.prompt,
            n=0 if greedy_only else model.source.samples,
            params=params,
            greedy=True,
            seed=question_seed(ask.prompted.question, ask.prompted.history),
            constraint=turn.constraint(),
        )

    def _agent_answer(
        self, ask: Ask, completion: Completion, confidence: float, samples: list[str], rec: Record | None
    ) -> HonestAnswer:
        turn: AgentTurn = ask.prompted.agent
        calls = parsed_output(turn, completion.text)
        parsed_samples = [parsed_output(turn, s) for s in samples]
        agent = AgentReply()
        if calls is not None:
            agent.calls = calls
            agent.call_values = call_values(completion, calls, parsed_samples)
        elif turn.output_schema is not None:
            agent.fields = field_values(completion, samples)
        answer = self._answered(completion, confidence, ask, True, rec)
        finish = "tool_calls" if calls else answer.finish_reason
        return replace(answer, agent=agent, finish_reason=finish, calibrated=False)
