"""``mistral``: calls after ``[TOOL_CALLS]``, in the pre-v11 or the v11+ shape.

Wire formats::

    content before[TOOL_CALLS] [{"name":"a","arguments":{"x":1}}, {"name":"b","arguments":{"y":2}}]
    pre[TOOL_CALLS]get_weather{"city":"NYC"}[TOOL_CALLS]ping{}
    pre[TOOL_CALLS]get_weather[ARGS]{"city":"NYC"}
    pre[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city":"NYC"}

After ``[TOOL_CALLS]``: ``[`` starts an array of call objects, ``{`` a single call object,
anything else a ``name{arguments}`` call (v11+, with optional ``[CALL_ID]`` / ``[ARGS]``). A
call ends with its JSON; text after it is content. Ids are 9 alphanumerics (Mistral's chat
templates reject other shapes); the model's own ``[CALL_ID]`` or ``"id"`` is kept as
``native_id``.

Better than the reference:

* v11 arguments are validated (the reference passed them through unchecked).
* A malformed element no longer drops the others, nested argument objects are fine (the
  reference's fallback scan only handled flat ``{...}``), and a missing ``name`` in one call
  does not drop all calls.
* Integer and other non-string argument values are kept as written (vLLM #13622).
* Text after the calls is kept as content.
"""

from __future__ import annotations

from hermes_async.parsers._bodies import MistralSpec, NamedJsonSpec
from hermes_async.parsers._engine import Format

__all__ = ("MISTRAL",)

MISTRAL = Format(
    name="mistral",
    call_open=("[TOOL_CALLS]",),
    body=MistralSpec(
        named=NamedJsonSpec(name_end=("[ARGS]",), id_marker=("[CALL_ID]",), brace_ends_name=True)
    ),
    short_ids=True,
)
