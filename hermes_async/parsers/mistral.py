"""``mistral``: calls after ``[TOOL_CALLS]``, in the pre-v11 or the v11+ shape.

Wire formats::

    content before[TOOL_CALLS] [{"name":"a","arguments":{"x":1}}, {"name":"b","arguments":{"y":2}}]
    pre[TOOL_CALLS]get_weather{"city":"NYC"}[TOOL_CALLS]ping{}
    pre[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city":"NYC"}

After ``[TOOL_CALLS]``, ``[`` starts an array of calls, ``{`` one call, anything else a
``name{arguments}`` call. Ids are 9 alphanumerics (Mistral's templates reject others); the
model's own id is kept as ``native_id``. Differences from the reference:
docs/decisions/008-parsers-versus-reference.md.
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
