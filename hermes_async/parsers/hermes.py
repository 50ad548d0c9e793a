"""``hermes``, ``qwen`` and ``longcat``: one JSON object per ``<tool_call>`` tag.

Wire format (Hermes / Qwen2.5 / Qwen3 chat templates)::

    I'll list the files.<tool_call>{"name": "terminal", "arguments": {"command": "ls -la"}}</tool_call>
    <tool_call>{"name": "read_file", "arguments": {"path": "test.py"}}</tool_call>

``longcat`` uses ``<longcat_tool_call>``; ``qwen`` is an alias of ``hermes``. ``parameters``
is accepted for ``arguments``; a missing ``arguments`` is ``{}``; an empty tag is skipped.
Differences from the reference: docs/decisions/008-parsers-versus-reference.md.
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
