"""JSON to and from model servers: orjson where its result is the standard library's, the
standard library where not.

Every request body (the prompt's ids: ~0.1 us a token through ``json.dumps``) and every streamed
chunk (``json.loads`` per event) passes here, so at thousands of rollouts this is client CPU
that shows. orjson encodes a body of 600 prompt ids ~4x faster and decodes a chunk ~3x faster,
but its rules differ from the standard library's in a few corners; those corners go to the
standard library, so what is sent and what is decoded stay exactly what they were:

* **Encoding.** A lone surrogate, a key that is not a string, an integer past 64 bits, a
  dataclass or a datetime make orjson refuse (the standard library's rules then apply:
  :func:`~hermes_async.inference._http.encode_body` replaces the surrogate, converts the key,
  writes the integer, refuses the rest). orjson writes ``NaN`` and the infinities as ``null``;
  a body holding one of those is encoded by the standard library, which keeps the value a
  caller gave (the search for them runs only where the encoding has a ``null``: chat bodies
  often do, ``"content": null`` beside tool calls, token bodies never). The separators are
  compact (``{"a":1}``): the same JSON value.
  orjson's result keeps the buffer it grew (tracemalloc: ~2 MB for a 70 KB body); bodies are
  copied to their own size (a few microseconds), since a body is held while its request waits
  for a model-request slot.
* **Decoding.** ``NaN``, ``Infinity``, numbers out of a float's range and lone surrogate
  escapes make orjson refuse (the standard library decodes them, as before; the chunk
  decoders then reject what a trainer may not use, with their own messages). orjson reads an
  integer past 64 bits as a float, so a text with a run of 19 or more digits that is not a
  fraction goes to the standard library directly.
"""

from __future__ import annotations

import json
import math

import orjson

from hermes_async.jsontypes import JSON

__all__ = ("dumps", "loads")

# orjson turns these into TypeError; the standard library serializes neither.
_STRICT = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME

# Digits as "0", what starts a fraction or an exponent as ".", anything else as " ": an integer
# of 19 or more digits (2**63 has 19) is then " " and nineteen "0"s, a float's digits never are.
# (One C-level pass, ~1 us for a chunk of 500 characters; a regular expression with lookarounds
# took 17.)
_SHAPE = str.maketrans(
    {chr(c): "0" if chr(c).isdigit() else "." if chr(c) in ".eE" else " " for c in range(128)}
)
_LONG_INTEGER = " " + "0" * 19


def dumps(value: object) -> bytes | None:
    """``value`` as compact UTF-8 JSON, or ``None`` where only the standard library knows the
    answer (see the module doc)."""
    try:
        data = orjson.dumps(value, option=_STRICT)
    except TypeError:
        return None
    if b"null" in data and _non_finite(value):
        return None
    # Copied to its own size: orjson's bytes keep the buffer it grew (up to ~30x the JSON),
    # and a body is held while its request waits for a slot, thousands of them at once.
    return bytes(memoryview(data))


def _non_finite(value: object) -> bool:
    """Whether ``value`` holds a float that is NaN or infinite (nesting bounded: orjson refused
    anything deeper than 254 levels before this runs)."""
    if type(value) is float:
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(map(_non_finite, value.values()))
    if isinstance(value, list | tuple):
        return any(map(_non_finite, value))
    return isinstance(value, float) and not math.isfinite(value)


def loads(text: str) -> JSON:
    """Decode JSON exactly as ``json.loads`` does, faster.

    Raises:
        ValueError: Not JSON (``json.JSONDecodeError``), or nested past what the standard
            library's decoder can recurse into.
    """
    try:
        if len(text) >= 19 and _LONG_INTEGER in " " + text.translate(_SHAPE):
            return json.loads(text)
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return json.loads(text)
    except RecursionError:
        # orjson refuses past 1,024 levels; the standard library then recurses once a level.
        raise ValueError("JSON nested too deeply to decode") from None
