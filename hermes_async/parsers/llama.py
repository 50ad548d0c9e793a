"""``llama3_json`` and ``llama4_json``: bare JSON objects, optionally after ``<|python_tag|>``.

Wire format::

    <|python_tag|>{"name": "search", "parameters": {"q": "x"}}
    preamble {"name":"a","arguments":{"x":1}} {"name":"b","arguments":{"y":2}}

Any ``{`` in the text may start a call. An object becomes a call once it has a string
``name`` and an ``arguments`` or ``parameters`` key (from that moment it streams as one); an
object that is not a call, or text that is not JSON, stays content — its text is held back
only until that is decided. As in the reference, a ``{`` inside an object that turned out
not to be a call is not looked at again. ``;`` between calls is dropped from the content.

Better than the reference:

* Content is the text outside the calls, not "everything before the first ``{``" (the
  reference dropped text after a non-call ``{``, and everything after the calls).
* A call whose arguments are invalid is reported invalid; the other calls are kept.
* An object cut off at the end of the stream after it became a call is reported truncated.
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
