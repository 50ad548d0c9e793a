"""The transcript, as pure functions: the turn's messages and the interrupted turn.

Both turn strategies share it; an interrupted turn still gives every call a result. Phase 2's
suffixes are in :mod:`hermes_async.agent._segments`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hermes_async.jsontypes import JSONObject
from hermes_async.parsers.types import ToolCall
from hermes_async.tools.registry import ToolOutcome

__all__ = ("assistant_message", "first_user_content", "interrupted_turn", "tool_message")

#: The first user message is passed to tools as task context, capped like the reference.
_USER_TASK_MAX_CHARS = 500


class _CallRecord(Protocol):
    """What the transcript needs of a call in flight (the agent's ``PendingCall`` has it)."""

    @property
    def call(self) -> ToolCall: ...

    @property
    def raw_arguments(self) -> str | None: ...

    @property
    def raw(self) -> str | None: ...

    @property
    def outcome(self) -> ToolOutcome | None: ...


def assistant_message(
    content: str | None, calls: Sequence[_CallRecord], reasoning: str | None
) -> JSONObject:
    """The assistant message of one turn: content, ``tool_calls`` if any, reasoning if any.

    Arguments are the model's text when known, else canonical; ``raw`` and ``native_id`` are kept
    for templates that render them.
    """
    message: JSONObject = {"role": "assistant", "content": content or ""}
    if calls:
        entries: list[JSONObject] = []
        for c in calls:
            entry = c.call.to_dict()
            if c.raw_arguments is not None:
                entry["function"] = {"name": c.call.name, "arguments": c.raw_arguments}
            if c.raw is not None:
                entry["raw"] = c.raw
            if c.call.native_id is not None:
                entry["native_id"] = c.call.native_id
            entries.append(entry)
        message["tool_calls"] = entries
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def tool_message(call_id: str, content: str) -> JSONObject:
    """The ``tool`` message answering call ``call_id``."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def interrupted_turn(
    assistant: JSONObject, calls: Sequence[_CallRecord], reason: str
) -> list[JSONObject]:
    """Close a cut-short turn: the assistant message, one result per call."""
    closed: list[JSONObject] = [assistant]
    for call in calls:
        content = (
            call.outcome.content
            if call.outcome is not None
            else json.dumps({"error": f"Tool call not completed: {reason}"})
        )
        closed.append(tool_message(call.call.id, content))
    return closed


def first_user_content(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The first user message's text, stripped and capped (tools get it as task context)."""
    for message in messages:
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"]).strip()[:_USER_TASK_MAX_CHARS]
    return None
