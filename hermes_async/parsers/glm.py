"""``glm45`` and ``glm47``: a name line, then ``<arg_key>``/``<arg_value>`` pairs.

Wire formats::

    <tool_call>get_weather
    <arg_key>city</arg_key><arg_value>NYC</arg_value>
    <arg_key>days</arg_key><arg_value>3</arg_value>
    </tool_call>

    <tool_call>get_weather<arg_key>city</arg_key>
    <arg_value>NYC</arg_value></tool_call>                      (glm47)

Both names accept both shapes: the name may end at a newline or run straight into
``<arg_key>``, and anything between ``</arg_key>`` and ``<arg_value>`` is skipped.

Better than the reference:

* Values are typed from the tool schemas when ``tools`` are given (else the reference's JSON
  -> ``ast.literal_eval`` -> string guess).
* A name without a following newline is not skipped (glm45), and a call with no arguments is
  kept (vLLM #44326: zero-argument calls dropped).
* The name is announced whole, never a prefix (vLLM: ``run_in_terminal`` -> ``run_in``).
* A call without ``</tool_call>`` at the end of the stream is truncated, not executed.
* Calls inside ``<think>`` are never scanned; a ``<tool_call>`` right after ``</think>`` is
  found (vLLM: the reasoning parser swallowed it).
"""

from __future__ import annotations

import dataclasses

from hermes_async.parsers._engine import Format
from hermes_async.parsers._xml import GlmSpec

__all__ = (
    "GLM45",
    "GLM47",
)

GLM45 = Format(name="glm45", call_open=("<tool_call>",), body=GlmSpec())
#: One body accepts both shapes, so glm47 is glm45 under its own name.
GLM47 = dataclasses.replace(GLM45, name="glm47")
