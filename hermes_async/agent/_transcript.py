"""The transcript, as pure functions: messages, the interrupted turn, suffix ids, template check.

Everything the loop decides about *what the conversation looks like* lives here, free of I/O,
so both turn strategies share it and tests can call it directly:

* :func:`assistant_message` / :func:`tool_message` — the OpenAI-format messages of one turn;
* :func:`interrupted_turn` — how a turn cut short by a deadline or a cancellation is closed
  (the assistant message plus one result per call, so no call is left without a result);
* :func:`suffix_ids` — Phase 2: the token ids between a sampled completion and the next
  generation (tool responses and the next generation prompt), never re-tokenizing sampled ids;
* :func:`template_matches` — Phase 2: whether the decoded trajectory is what the chat template
  renders for the messages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.registry import ToolOutcome

__all__ = (
    "USER_TASK_MAX_CHARS",
    "CallRecord",
    "assistant_message",
    "first_user_content",
    "interrupted_turn",
    "suffix_ids",
    "template_matches",
    "tool_message",
)

#: The first user message is passed to tools as task context, capped like the reference.
USER_TASK_MAX_CHARS = 500


class CallRecord(Protocol):
    """What the transcript needs of a tool call (the agent's ``ToolCall`` has it)."""

    @property
    def call_id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def arguments(self) -> str: ...

    @property
    def outcome(self) -> ToolOutcome | None: ...


def assistant_message(
    content: str | None, calls: Sequence[CallRecord], reasoning: str | None
) -> JSONObject:
    """The assistant message of one turn: content, ``tool_calls`` if any, reasoning if any."""
    message: JSONObject = {"role": "assistant", "content": content or ""}
    if calls:
        message["tool_calls"] = [
            {
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in calls
        ]
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def tool_message(call_id: str, content: str) -> JSONObject:
    """The ``tool`` message answering call ``call_id``."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def interrupted_turn(
    assistant: JSONObject, calls: Sequence[CallRecord], reason: str
) -> list[JSONObject]:
    """The messages that close a turn cut short: the assistant message, one result per call.

    Calls that finished keep their results; the others get ``{"error": ...}`` naming why they
    were cut short (``reason``), so every ``tool_calls`` entry has its ``tool`` message.
    """
    closed: list[JSONObject] = [assistant]
    for call in calls:
        content = (
            call.outcome.content
            if call.outcome is not None
            else json.dumps({"error": f"Tool call not completed: {reason}"})
        )
        closed.append(tool_message(call.call_id, content))
    return closed


def first_user_content(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The first user message's text, stripped and capped (tools get it as task context)."""
    for message in messages:
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"]).strip()[:USER_TASK_MAX_CHARS]
    return None


def suffix_ids(
    messages: Sequence[JSONObject],
    tokenizer: Tokenizer,
    tools: Sequence[JSONObject] | None,
    *,
    ended_on_eos: bool,
) -> tuple[list[int], str]:
    """Ids between the sampled completion and the next generation, and the full rendering.

    The template renders an assistant turn as ``...<|im_end|>`` + separator; what follows the
    assistant's end-of-turn token in the full rendering (tool responses, the next generation
    prompt) is the suffix. If the model did not stop on the end-of-turn token (length), the
    suffix starts with it (it is masked like every suffix id).

    Returns:
        ``(suffix ids, the rendering of all messages with a generation prompt)``.
    """
    tool_list = list(tools) if tools else None
    last_assistant = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
    before = tokenizer.apply_chat_template(
        messages[: last_assistant + 1], tool_list, add_generation_prompt=False
    )
    full = tokenizer.apply_chat_template(messages, tool_list, add_generation_prompt=True)
    eos_text = tokenizer.decode([tokenizer.eos_token_id])
    cut = before.rfind(eos_text) + len(eos_text)
    prefix = [] if ended_on_eos else [tokenizer.eos_token_id]
    return prefix + tokenizer.encode(full[cut:]), full


def template_matches(decoded: str, rendered: str, *, final: bool) -> bool:
    """Whether the decoded trajectory ``decoded`` is the template's ``rendered`` text.

    After the final turn the template's separator following the end-of-turn token (whitespace)
    was never sampled: only that may remain of the rendering.
    """
    if final:
        return rendered.startswith(decoded) and not rendered[len(decoded) :].strip()
    return decoded == rendered
