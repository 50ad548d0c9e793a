"""JSON to and from model servers: orjson where its result is the standard library's.

The corners where orjson's rules differ (lone surrogates, NaN, integers past 64 bits...) go to
the standard library, so what is sent and decoded is exactly what ``json`` gives.
Measurements and the corners: docs/decisions/062-orjson-on-the-wire.md.
"""

from __future__ import annotations

import json
import math

import orjson

from hermes_async.jsontypes import JSON

__all__ = ("UNDECIDED", "dumps", "loads", "loads_data_line")

# orjson turns these into TypeError; the standard library serializes neither.
_STRICT = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


# Digits as "0", what starts a fraction or an exponent as ".", anything else as " ": an integer
# of 19 or more digits (2**63 has 19) is then " " and nineteen "0"s, a float's digits never are.
# (One C-level pass, ~1 us for a chunk of 500 characters; a regular expression with lookarounds
# took 17.)
def _shape(c: int) -> str:
    return "0" if chr(c).isdigit() else "." if chr(c) in ".eE" else " "


_SHAPE = str.maketrans({chr(c): _shape(c) for c in range(128)})
_LONG_INTEGER = " " + "0" * 19
# The same for UTF-8 bytes, where every byte past ASCII is " ": this flags a superset of what
# the text's check flags (a flagged line goes the text's way).
_SHAPE_BYTES = "".join(_shape(c) if c < 128 else " " for c in range(256)).encode()
_LONG_INTEGER_BYTES = _LONG_INTEGER.encode()

#: :func:`loads_data_line` could not decide: decode the line's text and call :func:`loads`.
UNDECIDED = object()


def dumps(value: object) -> bytes | None:
    """``value`` as compact UTF-8 JSON, or ``None`` where only the standard library knows how."""
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
    """Whether ``value`` holds a NaN or infinite float."""
    # Recursion is bounded: orjson refused anything deeper than 254 levels before this runs.
    if type(value) is float:
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(map(_non_finite, value.values()))
    if isinstance(value, list | tuple):
        return any(map(_non_finite, value))
    return isinstance(value, float) and not math.isfinite(value)


def loads_data_line(line: bytes) -> object:
    """The JSON after ``data: `` in a raw SSE line, as :func:`loads` decodes its text; or
    :data:`UNDECIDED`.

    Decided only where orjson reads the bytes (so they are UTF-8 and JSON orjson takes) and no
    run of digits may be a long integer: the text would then decode to the same value.
    """
    if _LONG_INTEGER_BYTES in line.translate(_SHAPE_BYTES):  # "data: " reads as spaces
        return UNDECIDED
    try:
        return orjson.loads(memoryview(line)[6:])
    except orjson.JSONDecodeError:
        return UNDECIDED


def loads(text: str) -> JSON:
    """Decode JSON exactly as ``json.loads`` does, faster; ``ValueError`` if it cannot."""
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
