"""``kimi_k2``: calls in a special-token section, each with the model's own id.

``<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{...}<|tool_call_end|>``
inside ``<|tool_calls_section_begin|>...<|tool_calls_section_end|>``. Ids are unique per call
(the model's is kept in ``native_id``); a call is sealed at its end marker, so a missing
section end loses nothing. Against the reference: docs/architecture.md.
"""

from __future__ import annotations

from hermes_async.parsers._bodies import NamedJsonSpec
from hermes_async.parsers._engine import Format

__all__ = ("KIMI_K2",)


def _kimi_name(ident: str) -> tuple[str, str | None]:
    """``functions.get_weather:0`` -> ``("get_weather", "functions.get_weather:0")``."""
    ident = ident.strip()
    name = ident.removeprefix("functions.")
    head, sep, tail = name.rpartition(":")
    if sep and tail.strip().isdigit():
        name = head
    return name.strip(), ident


KIMI_K2 = Format(
    name="kimi_k2",
    section_open=("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"),
    section_close=("<|tool_calls_section_end|>", "<|tool_call_section_end|>"),
    call_open=("<|tool_call_begin|>",),
    body=NamedJsonSpec(
        name_end=("<|tool_call_argument_begin|>",),
        close=("<|tool_call_end|>",),
        name_from_id=_kimi_name,
    ),
)
