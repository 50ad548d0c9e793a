"""``hermes``, ``qwen`` and ``longcat``: one JSON object per ``<tool_call>`` tag.

Wire format (Hermes / Qwen2.5 / Qwen3 chat templates)::

    I'll list the files.<tool_call>{"name": "terminal", "arguments": {"command": "ls -la"}}</tool_call>
    <tool_call>{"name": "read_file", "arguments": {"path": "test.py"}}</tool_call>

``longcat`` is the same with ``<longcat_tool_call>`` / ``</longcat_tool_call>``. ``qwen`` is an
alias of ``hermes`` (as in the reference). ``parameters`` is accepted for ``arguments``; a
missing ``arguments`` is ``{}``; an empty tag is skipped.

Better than the reference:

* A call is sealed the moment its JSON object closes (``</tool_call>`` may even be missing,
  as when a server stops on it); the object's end is found by scanning strings and escapes,
  so a literal ``</tool_call>`` inside a string value does not end the call (vLLM #45167).
* One malformed call is reported as :class:`~hermes_async.parsers.ToolCallInvalid`; the valid
  calls around it are kept (the reference returned the whole output as text).
* Text between and after calls stays in the content.
* ``"arguments": "{\\"x\\": 1}"`` (a JSON-encoded string) is decoded once, not re-encoded.
* An unclosed call whose JSON is incomplete at the end of the stream is
  :class:`~hermes_async.parsers.ToolCallTruncated`, not executed.
* Several objects inside one tag are several calls.
* ``<think>...</think>`` is never scanned for calls.
* Ids are ``call_<24 hex>`` (the reference's 8 hex digits collide over a training run).
"""

from __future__ import annotations

from hermes_async.parsers._bodies import JsonCallSpec
from hermes_async.parsers._engine import Format

__all__ = (
    "HERMES",
    "LONGCAT",
)

HERMES = Format(
    name="hermes",
    call_open=("<tool_call>",),
    body=JsonCallSpec(close=("</tool_call>",), multi=True),
)

LONGCAT = Format(
    name="longcat",
    call_open=("<longcat_tool_call>",),
    body=JsonCallSpec(close=("</longcat_tool_call>",), multi=True),
)
