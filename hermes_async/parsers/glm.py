"""``glm45`` and ``glm47``: a name line, then ``<arg_key>``/``<arg_value>`` pairs.

Wire formats::

    <tool_call>get_weather
    <arg_key>city</arg_key><arg_value>NYC</arg_value>
    </tool_call>

    <tool_call>get_weather<arg_key>city</arg_key>
    <arg_value>NYC</arg_value></tool_call>                      (glm47)

Both names accept both shapes. Differences from the reference:
docs/decisions/008-parsers-versus-reference.md.
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
