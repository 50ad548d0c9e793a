"""``kimi_k2``: calls in a special-token section, each with the model's own id.

Wire format::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city":"NYC"}<|tool_call_end|><|tool_call_begin|>functions.ping:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>

-> ``get_weather({"city": "NYC"})`` and ``ping({})``. The singular section spelling
(``<|tool_call_section_begin|>``) is accepted too, and ``ping:0`` without the
``functions.`` prefix.

Better than the reference:

* Ids are unique per call (the reference used ``functions.get_weather:0`` itself, which
  repeats every turn); the model's id is kept in ``native_id`` for the chat template.
* The name is the id without its ``functions.`` prefix and ``:N`` suffix, so dotted tool
  names survive (the reference cut at the last dot).
* Arguments are validated; a malformed call is reported invalid and the others are kept.
* A call is sealed at ``<|tool_call_end|>`` (or when its JSON closes): a missing
  ``<|tool_calls_section_end|>`` at ``max_tokens`` loses nothing (the bug "copied into vLLM
  and SGLang"), and markers arriving bundled in one chunk (speculative decoding) are fine.
* Text before and after the section is kept; no size cap on a section; marker text never
  leaks into content.
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
