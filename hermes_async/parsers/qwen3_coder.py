"""``qwen3_coder``: XML-style calls with one tag per parameter.

Wire format (Qwen3-Coder chat template)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    NYC
    </parameter>
    <parameter=days>3</parameter>
    </function>
    </tool_call>

-> ``get_weather({"city": "NYC", "days": 3})``. The ``<tool_call>`` wrapper and missing
closing tags are tolerated, as in the reference. Differences from the reference:
docs/decisions/008-parsers-versus-reference.md.
"""

from __future__ import annotations

from hermes_async.parsers._engine import Format
from hermes_async.parsers._xml import Qwen3CoderSpec

__all__ = ("QWEN3_CODER",)

QWEN3_CODER = Format(
    name="qwen3_coder",
    call_open=("<function=",),
    section_open=("<tool_call>",),
    section_close=("</tool_call>",),
    body=Qwen3CoderSpec(),
)
