"""``llama3_json`` and ``llama4_json``: bare JSON objects, optionally after ``<|python_tag|>``.

Wire format::

    <|python_tag|>{"name": "search", "parameters": {"q": "x"}}
    preamble {"name":"a","arguments":{"x":1}} {"name":"b","arguments":{"y":2}}

Any ``{`` may start a call; an object becomes one once it has a string ``name`` and
``arguments`` or ``parameters``. Anything else stays content. As in the reference, a ``{``
inside a rejected object is not looked at again. Differences from the reference:
docs/decisions/008-parsers-versus-reference.md.
"""

from __future__ import annotations

import dataclasses

from hermes_async.parsers._bodies import JsonCallSpec
from hermes_async.parsers._engine import Format

__all__ = (
    "LLAMA3_JSON",
    "LLAMA4_JSON",
)

LLAMA3_JSON = Format(
    name="llama3_json",
    call_open=("{",),
    drop=("<|python_tag|>",),
    body=JsonCallSpec(candidate=True),
    keep_call_open=True,
    separators=";",
)

#: The same format under the reference's second name.
LLAMA4_JSON = dataclasses.replace(LLAMA3_JSON, name="llama4_json")
