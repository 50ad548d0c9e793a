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

-> ``get_weather({"city": "NYC", "days": 3})``. ``<function=`` opens a call with or without the
``<tool_call>`` wrapper; a missing ``</parameter>`` (before the next parameter or the end of
the function) and a missing ``</function>`` (before ``</tool_call>``) are tolerated, as in the
reference. One leading and one trailing newline of a value are removed.

Better than the reference:

* Values are typed from the tool's JSON schema when ``tools`` are given: ``"3"`` stays a
  string for a ``string`` parameter and becomes ``3`` for an ``integer`` one (the reference
  guessed: JSON, then ``ast.literal_eval``, then the raw string — the fallback used here
  only without a schema).
* A ``</parameter>`` followed by anything other than the next parameter or the end of the
  function is part of the value (a file containing that text can be written).
* A call still open at the end of the stream is truncated, not executed.
* Arguments stream as one JSON fragment per finished parameter (vLLM #30439: none streamed).
* A call inside ``<think>`` is reasoning, never executed; one after ``</think>`` is found.
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
