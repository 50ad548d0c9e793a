"""The built-in chat template written out in Python, for speed.

Jinja costs ~20 µs per message in the sandbox, and Phase 2 renders after every turn.
Invariant: :func:`render_builtin` gives exactly the template's text (tests compare the two
on random conversations) or ``None`` for a shape where Jinja's own conversions would
decide; the caller then renders the Jinja template, which stays the definition.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hermes_async.jsontypes import JSONObject

__all__ = ("render_builtin",)

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more of the functions below to help with the task. Their "
    "signatures are listed inside <tools></tools> XML tags, one JSON object per line:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nTo call a function, reply with a JSON object holding the function's name and "
    "arguments inside <tool_call></tool_call> XML tags, one block per call:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


class _Unknown(Exception):
    """A message shape this renderer leaves to Jinja."""


# json.dumps(value, ensure_ascii=False) builds an encoder per call; this is its encoder, and a
# string goes straight to the function that encoder calls for one.
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode
_ENCODE_STRING: Any = json.encoder.encode_basestring


def _json(value: Any) -> str:
    if type(value) is str:
        return _ENCODE_STRING(value)  # type: ignore[no-any-return]
    return _ENCODE(value)


def _content(content: Any) -> str:
    if content is None:
        return ""
    if type(content) is str:
        return content
    if type(content) is not list:
        raise _Unknown
    out = []
    for part in content:
        if type(part) is not dict:
            raise _Unknown
        if part.get("type") == "text":
            text = part.get("text")
            if type(text) is not str:
                raise _Unknown
            out.append(text)
    return "".join(out)


def _calls(calls: Any, content: str) -> str:
    if type(calls) is not list:
        raise _Unknown
    out = []
    for index, tool_call in enumerate(calls):
        if type(tool_call) is not dict:
            raise _Unknown
        call = tool_call.get("function", tool_call)
        if type(call) is not dict:
            raise _Unknown
        if content or index:
            out.append("\n")
        raw = tool_call.get("raw")
        if type(raw) is str:
            out.append("<tool_call>\n" + raw + "\n</tool_call>")
            continue
        if raw is not None:
            raise _Unknown
        name = call.get("name")
        if type(name) is not str:
            raise _Unknown
        arguments = call.get("arguments")
        if type(arguments) is str:
            text = arguments
        elif arguments is None:
            text = "{}"
        elif type(arguments) is dict:
            text = _json(arguments)
        else:
            raise _Unknown
        out.append(
            '<tool_call>\n{"name": ' + _json(name) + ', "arguments": ' + text + "}\n</tool_call>"
        )
    return "".join(out)


def _assistant(message: JSONObject) -> str:
    content = _content(message.get("content"))
    reasoning = message.get("reasoning_content")
    head = "<|im_start|>assistant\n"
    if type(reasoning) is str and reasoning:
        head += "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
        content = content.lstrip("\n")
    elif reasoning is not None and type(reasoning) is not str:
        raise _Unknown
    calls = message.get("tool_calls")
    tail = _calls(calls, content) if calls else ""
    return head + content + tail + "<|im_end|>\n"


def render_builtin(
    messages: Sequence[JSONObject],
    tools: Sequence[JSONObject] | None,
    add_generation_prompt: bool,
) -> str | None:
    """The built-in template's text for these messages, or ``None`` (render the Jinja one)."""
    try:
        return _render(messages, tools, add_generation_prompt)
    except (_Unknown, TypeError, ValueError):
        return None


def _render(
    messages: Sequence[JSONObject], tools: Sequence[JSONObject] | None, generation: bool
) -> str:
    out: list[str] = []
    for message in messages:
        if type(message) is not dict or type(message.get("role")) is not str:
            raise _Unknown
    has_system = bool(messages) and messages[0]["role"] == "system"
    if tools or has_system:
        out.append("<|im_start|>system\n")
        if has_system:
            out.append(_content(messages[0].get("content")))
            if tools:
                out.append("\n\n")
        if tools:
            out.append(_TOOLS_INTRO)
            for tool in tools:
                out.append("\n" + _json(tool))
            out.append(_TOOLS_OUTRO)
        out.append("<|im_end|>\n")
    last = len(messages) - 1
    for index, message in enumerate(messages):
        role = message["role"]
        if index == 0 and has_system:
            continue
        if role == "assistant":
            out.append(_assistant(message))
        elif role == "tool":
            if index == 0 or messages[index - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append(
                "\n<tool_response>\n" + _content(message.get("content")) + "\n</tool_response>"
            )
            if index == last or messages[index + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
        else:
            out.append(
                "<|im_start|>" + role + "\n" + _content(message.get("content")) + "<|im_end|>\n"
            )
    if generation:
        out.append("<|im_start|>assistant\n")
    return "".join(out)
