"""Phase 1 turns: OpenAI-style chat completions, with the reference's ``<tool_call>`` fallback.

:class:`ChatTurns` runs one rollout's turns against anything with ``async
chat_completion(**kwargs)`` (our ``ChatClient``, an atroposlib ``ServerManager``, ...).
Without structured ``tool_calls``, the hermes parser recovers ``<tool_call>`` text; a cut call
is an error the next prompt carries (decision 001). Responses may be objects or dicts.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import anyio

from hermes_async._otel import span
from hermes_async.agent._reasoning import reasoning_request_fields
from hermes_async.agent._tool_runner import PendingCall, RunTools, record_cut_calls
from hermes_async.agent._transcript import assistant_message
from hermes_async.agent.failures import RolloutFailure, classify_exception
from hermes_async.agent.options import AgentOptions
from hermes_async.agent.result import AgentResult
from hermes_async.jsontypes import JSONObject
from hermes_async.parsers import get_parser
from hermes_async.parsers.types import FunctionCall, ToolCall, ToolCallTruncated

__all__ = ("ChatServer", "ChatTurns")

logger = logging.getLogger("hermes_async.agent.loop")


@runtime_checkable
class ChatServer(Protocol):
    """A Phase 1 model server: OpenAI-style chat completions."""

    async def chat_completion(self, **kwargs: Any) -> Any: ...


def _get(obj: object, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _extract_reasoning(message: object) -> str | None:
    """First non-empty of ``reasoning_content``, ``reasoning``, ``reasoning_details[].text``."""
    for attr in ("reasoning_content", "reasoning"):
        value = _get(message, attr)
        if isinstance(value, str) and value.strip():
            return value
    details = _get(message, "reasoning_details")
    if isinstance(details, Sequence) and not isinstance(details, str):
        for item in details:
            text = _get(item, "text")
            if isinstance(text, str) and text.strip():
                return text
    return None


def _normalize_tool_calls(raw_calls: Sequence[object]) -> list[ToolCall]:
    """Turn object- or dict-shaped tool calls into :class:`ToolCall` s (arguments as a string)."""
    calls: list[ToolCall] = []
    for raw in raw_calls:
        function = _get(raw, "function")
        name = _get(function, "name") if function is not None else _get(raw, "name")
        args = _get(function, "arguments") if function is not None else _get(raw, "arguments")
        if args is None:
            args_text = "{}"
        elif isinstance(args, str):
            args_text = args
        else:
            args_text = json.dumps(args, ensure_ascii=False)
        call_id = _get(raw, "id") or f"call_{uuid.uuid4().hex[:8]}"
        calls.append(ToolCall(str(call_id), FunctionCall(str(name or ""), args_text)))
    return calls


def _base_url(server: object) -> str | None:
    """The server's base URL, when it tells (our clients, atroposlib's server configs)."""
    for candidate in (server, getattr(server, "connection", None), getattr(server, "config", None)):
        url = getattr(candidate, "base_url", None)
        if isinstance(url, str):
            return url
    return None


def _fail(result: AgentResult, failure: RolloutFailure) -> None:
    result.failure = failure
    result.error = failure.message


class ChatTurns:
    """The Phase 1 turn strategy: one chat completion per turn, then that turn's tools."""

    def __init__(
        self, server: ChatServer, tool_schemas: Sequence[JSONObject], options: AgentOptions
    ) -> None:
        self._complete = server.chat_completion
        self._schemas = list(tool_schemas)
        self._max_turns = options.max_turns
        self._turn_timeout = options.turn_timeout
        # The request's fixed part, built once; each turn adds the (growing) message list.
        temperature = options.temperature if options.temperature is not None else 1.0
        request: dict[str, Any] = {"n": 1, "temperature": temperature}
        if self._schemas:
            request["tools"] = self._schemas
        if options.max_tokens is not None:
            request["max_tokens"] = options.max_tokens
        reasoning = reasoning_request_fields(
            options.thinking_mode,
            options.reasoning_effort,
            options.max_reasoning_tokens,
            base_url=_base_url(server),
        )
        # Reasoning fields win over extra_body on a clash, as in atroposlib.
        body = {**(options.extra_body or {}), **(reasoning or {})}
        if body:
            request["extra_body"] = body
        self._request = request

    async def run(self, result: AgentResult, tools: RunTools, *, seed: int | None = None) -> None:
        """Run the rollout's turns; stop on an answer without calls, a failure or max_turns.

        **Cancellation**: the model request is cancelled (its HTTP stream closed) and running
        tools are cancelled; the interrupted turn stays in flight on ``tools``.
        """
        messages = result.messages
        deadline = self._turn_timeout if self._turn_timeout is not None else math.inf
        for turn in range(self._max_turns):
            with span(
                "turn", {"hermes_async.task_id": tools.task_id, "hermes_async.turn": turn + 1}
            ):
                timing: dict[str, float] = {"turn": float(turn + 1)}
                result.timings.append(timing)
                result.turns_used = turn + 1
                start = anyio.current_time()
                try:
                    with anyio.fail_after(deadline):
                        response = await self._complete(messages=messages, **self._request)
                except TimeoutError:
                    _fail(
                        result,
                        RolloutFailure.of(
                            "agent_timeout",
                            f"model call timed out after {self._turn_timeout:g} s",
                            source="deadline",
                            deadline="turn_timeout",
                        ),
                    )
                    return
                except Exception as exc:
                    failure = classify_exception(exc, source="model_server")
                    logger.warning("task %s: %s", tools.task_id, failure.message)
                    _fail(result, failure)
                    return
                timing["generation_seconds"] = anyio.current_time() - start
                choices = _get(response, "choices") if response is not None else None
                if not choices:
                    _fail(
                        result,
                        RolloutFailure.of(
                            "infra", "model returned no choices", source="model_server"
                        ),
                    )
                    return
                message = _get(choices[0], "message")
                reasoning = _extract_reasoning(message)
                result.reasoning_per_turn.append(reasoning)
                content = _get(message, "content")
                calls = _normalize_tool_calls(_get(message, "tool_calls") or [])
                cut: tuple[ToolCallTruncated, ...] = ()
                if not calls and self._schemas and isinstance(content, str):
                    content, calls, cut = self._fallback_parse(content, tools.task_id)
                if not calls and not cut:
                    messages.append(assistant_message(content, (), reasoning))
                    result.finished_naturally = True
                    return
                pending = [PendingCall(call) for call in calls]
                assistant = assistant_message(content, pending, reasoning)
                if pending:
                    await tools.run_calls(result, turn + 1, pending, timing, assistant)
                else:
                    messages.append(assistant)
                # A call cut off by max_tokens: the next prompt says so (decision 001).
                record_cut_calls(result, turn + 1, cut)

    def _fallback_parse(
        self, content: str, task_id: str
    ) -> tuple[str | None, list[ToolCall], tuple[ToolCallTruncated, ...]]:
        """``(content, calls, cut calls)`` from ``<tool_call>`` blocks in Phase 1 content.

        With a cut call and no other, the content is the reply unchanged (what was sampled).
        """
        if "<tool_call>" not in content:
            return content, [], ()
        try:
            parsed = get_parser("hermes", tools=self._schemas).parse(content)
        except Exception:  # a parser bug must not end the rollout; the text stays content
            logger.warning("task %s: fallback tool-call parse failed", task_id, exc_info=True)
            return content, [], ()
        cut = parsed.truncated_calls
        if not parsed.tool_calls:
            return content, [], cut
        if cut:  # the cut text follows the calls, as in Phase 2
            text = "\n".join(part for part in (parsed.content, *(c.raw for c in cut)) if part)
            return text, list(parsed.tool_calls), cut
        return parsed.content, list(parsed.tool_calls), ()
