"""The transcript's pure functions: messages and the interrupted turn."""

from __future__ import annotations

import json

from hermes_async.agent._tool_runner import PendingCall
from hermes_async.agent._transcript import (
    assistant_message,
    first_user_content,
    interrupted_turn,
)
from hermes_async.parsers.types import FunctionCall, ToolCall
from hermes_async.tools.registry import ToolOutcome


def pending(
    call_id: str,
    name: str,
    arguments: str,
    *,
    raw_arguments: str | None = None,
    raw: str | None = None,
    outcome: ToolOutcome | None = None,
) -> PendingCall:
    call = ToolCall(call_id, FunctionCall(name, arguments))
    return PendingCall(call, raw_arguments, raw, outcome=outcome)


def test_assistant_message_carries_calls_and_reasoning() -> None:
    call = pending("c1", "terminal", '{"command": "ls"}')
    assert assistant_message(None, [], None) == {"role": "assistant", "content": ""}
    message = assistant_message("ok", [call], "because")
    assert message["tool_calls"] == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
        }
    ]
    assert message["reasoning_content"] == "because"


def test_assistant_message_shows_the_arguments_as_written_and_the_raw_call() -> None:
    compact = '{"command":"echo compact"}'
    whole = '{"name":"terminal","arguments":' + compact + "}"
    call = pending(
        "c1", "terminal", '{"command": "echo compact"}', raw_arguments=compact, raw=whole
    )
    entry = assistant_message("", [call], None)["tool_calls"][0]
    assert entry["function"]["arguments"] == compact  # the model's words
    assert entry["raw"] == whole
    assert call.call.arguments == '{"command": "echo compact"}'  # what the tool receives


def test_interrupted_turn_answers_every_call() -> None:
    done = pending("c1", "a", "{}", outcome=ToolOutcome('{"ok": true}'))
    running = pending("c2", "b", "{}")
    assistant = assistant_message("", [done, running], None)
    closed = interrupted_turn(assistant, [done, running], "deadline")
    assert closed[0] is assistant
    assert closed[1] == {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'}
    assert json.loads(str(closed[2]["content"])) == {"error": "Tool call not completed: deadline"}


def test_first_user_content_is_stripped_and_capped() -> None:
    assert first_user_content([{"role": "system", "content": "s"}]) is None
    text = first_user_content([{"role": "user", "content": "  " + "x" * 900}])
    assert text == "x" * 500
