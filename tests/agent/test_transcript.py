"""The transcript's pure functions: messages, the interrupted turn, suffix ids, template check."""

from __future__ import annotations

import json
from typing import Any

from hermes_async.agent._tool_runner import ToolCall
from hermes_async.agent._transcript import (
    assistant_message,
    first_user_content,
    interrupted_turn,
    suffix_ids,
    template_matches,
)
from hermes_async.inference.tokenizer import load_tokenizer
from hermes_async.tools.registry import ToolOutcome

TOKENIZER = load_tokenizer()


def test_assistant_message_carries_calls_and_reasoning() -> None:
    call = ToolCall("c1", "terminal", '{"command": "ls"}')
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


def test_interrupted_turn_answers_every_call() -> None:
    done = ToolCall("c1", "a", "{}", outcome=ToolOutcome('{"ok": true}'))
    running = ToolCall("c2", "b", "{}")
    assistant = assistant_message("", [done, running], None)
    closed = interrupted_turn(assistant, [done, running], "deadline")
    assert closed[0] is assistant
    assert closed[1] == {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'}
    assert json.loads(str(closed[2]["content"])) == {"error": "Tool call not completed: deadline"}


def test_first_user_content_is_stripped_and_capped() -> None:
    assert first_user_content([{"role": "system", "content": "s"}]) is None
    text = first_user_content([{"role": "user", "content": "  " + "x" * 900}])
    assert text == "x" * 500


def test_suffix_ids_follow_the_end_of_turn_and_add_a_missing_one() -> None:
    messages: list[Any] = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
    ]
    ids, full = suffix_ids(messages, TOKENIZER, None, ended_on_eos=True)
    assert full.endswith("<|im_start|>assistant\n")
    assert TOKENIZER.eos_token_id not in ids[:1]
    assert "out" in TOKENIZER.decode(ids) and full.endswith(TOKENIZER.decode(ids))
    cut, _ = suffix_ids(messages, TOKENIZER, None, ended_on_eos=False)
    assert cut == [TOKENIZER.eos_token_id, *ids]


def test_template_check_allows_only_trailing_whitespace_after_the_final_turn() -> None:
    assert template_matches("abc", "abc", final=False)
    assert not template_matches("abc", "abc\n", final=False)
    assert template_matches("abc", "abc\n", final=True)
    assert not template_matches("abc", "abcd", final=True)
    assert not template_matches("abx", "abc", final=True)
