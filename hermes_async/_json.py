"""Decoding JSON the model wrote: bounded nesting, no ``NaN``, no lone surrogates.

Model text is hostile: it becomes a value or a ``ValueError``, and what decodes must encode
again. Used by the parsers and tool-argument decoding. Why each rule: docs/architecture.md,
"Model-written JSON".
"""

from __future__ import annotations

import json
import json.scanner
import math
import re
from collections.abc import Callable
from itertools import accumulate

from hermes_async.jsontypes import JSON

__all__ = (
    "MAX_JSON_DEPTH",
    "JSONDepthError",
    "decode_problem",
    "exceeds_depth",
    "finite_number",
    "loads",
    "object_members",
    "scrub_text",
)

#: Deepest nesting accepted in model-written JSON (a top-level object is depth 1). Far beyond
#: any tool schema (the built-in tools nest three levels) and far below the interpreter's
#: recursion limit (1,000), which recursive consumers of the value need a few frames per level
#: of.
MAX_JSON_DEPTH = 64

_SURROGATE = re.compile("[\ud800-\udfff]")
# A \u escape of a surrogate (a literal prefix: sre searches for it at memchr speed).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# A JSON string literal (escapes included), and what is left of the text between them.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_JSON_WS = re.compile(r"[ \t\n\r]*")


class JSONDepthError(ValueError):
    """JSON text is nested deeper than :data:`MAX_JSON_DEPTH` levels."""

    def __init__(self, limit: int = MAX_JSON_DEPTH) -> None:
        super().__init__(f"the JSON is nested deeper than {limit} levels")
        self.limit = limit


def _reject_constant(name: str) -> JSON:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf (1e999): json.dumps would write Infinity, not JSON
        raise ValueError(f"{text[:40]} is out of range for a JSON number")
    return value


#: One decoder for every call: ``json.loads`` with hooks builds a decoder and its scanner each time.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def exceeds_depth(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the brackets of JSON ``text`` nest deeper than ``limit`` (linear)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) > limit


def scrub_text(text: str) -> str:
    """``text`` with every surrogate code point replaced by U+FFFD (so it encodes as UTF-8)."""
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


def _scrub_json(value: JSON) -> JSON:
    """``value`` with :func:`scrub_text` on every string and key (recursive)."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, list):
        return [_scrub_json(v) for v in value]
    if isinstance(value, dict):
        return {scrub_text(k): _scrub_json(v) for k, v in value.items()}
    return value


def loads(text: str, *, depth_checked: bool = False) -> JSON:
    """Decode model-written JSON text: bounded depth, no ``NaN``, strings made encodable.

    ``depth_checked``: the caller already counted the nesting (the parsers' scanner does).

    Raises:
        JSONDepthError: Nested deeper than :data:`MAX_JSON_DEPTH` (a ``ValueError``).
        ValueError: Not valid JSON, or ``NaN`` / ``Infinity``.
    """
    if not depth_checked and exceeds_depth(text):
        raise JSONDepthError
    try:
        value = _DECODER.decode(text)
    except RecursionError as exc:  # within the limit, but the caller's stack was already deep
        raise JSONDepthError from exc
    if _may_hold_surrogates(text):
        value = _scrub_json(value)
    return value


def _may_hold_surrogates(text: str) -> bool:
    """Whether decoding ``text`` can put a surrogate into a string (only such a text pays for
    the scrubbing walk)."""
    # A surrogate escape (``\u`` escapes of ordinary characters are common, ``\ud800`` is
    # not), or a surrogate in the text itself.
    return bool(_SURROGATE_ESCAPE.search(text) or (not text.isascii() and _SURROGATE.search(text)))


#: The decoder's scanner: one value at an index, ``(value, end)``; StopIteration if none.
# (typeshed types make_scanner's argument as itself; it takes the decoder, as json does.)
_SCAN_ONCE: Callable[[str, int], tuple[JSON, int]] = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]


def _skip_ws(s: str, k: int) -> int:
    """The index of the first character at or after ``k`` that is not JSON whitespace."""
    match = _JSON_WS.match(s, k)
    assert match is not None  # the pattern matches the empty string
    return match.end()


#: A member of a JSON object: its key, its value, and where the value's text starts and ends.
Member = tuple[str, JSON, int, int]


def object_members(s: str, i: int) -> tuple[list[Member], int] | None:
    """The members of the JSON object that starts at ``s[i]`` and the index after it.

    ``None`` unless the object is complete and :func:`loads` would give its text as plain
    values: invalid or unfinished JSON, too deep, or text that needs scrubbing all say
    ``None`` (the caller then takes the general way). Each value is decoded by the C scanner
    once, so the object costs about one ``loads``.
    """
    scan, ws = _SCAN_ONCE, _skip_ws
    members: list[Member] = []
    try:
        if not s.startswith("{", i):
            return None
        k = ws(s, i + 1)
        if s.startswith("}", k):
            end = k + 1
        else:
            while True:
                if not s.startswith('"', k):
                    return None
                key, k = scan(s, k)
                k = ws(s, k)
                if not s.startswith(":", k):
                    return None
                start = ws(s, k + 1)
                value, k = scan(s, start)
                members.append((key, value, start, k))
                k = ws(s, k)
                if s.startswith(",", k):
                    k = ws(s, k + 1)
                    continue
                if not s.startswith("}", k):
                    return None
                end = k + 1
                break
    except (StopIteration, ValueError, RecursionError):
        return None
    text = s[i:end]
    if exceeds_depth(text) or _may_hold_surrogates(text):
        return None
    return members, end


def finite_number(value: object) -> float | None:
    """A JSON number read back as a finite float, else ``None`` (a string, a bool, NaN, an
    integer past a float's range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def decode_problem(exc: BaseException) -> str:
    """Why decoding outside text (JSON, TOML) failed, for a message: the decoder's own words,
    or, for a ``RecursionError``, that it is nested too deeply."""
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
