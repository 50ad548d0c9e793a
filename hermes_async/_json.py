"""Decoding JSON the model wrote: bounded nesting, no ``NaN``, no lone surrogates.

Model text is hostile input (issue 16): whatever it holds must turn into a value or a
``ValueError`` the caller reports to the model, never another exception, and whatever is
decoded must be serializable again later (request bodies, JSONL, HTML). Three things in plain
``json.loads`` break that:

* **Nesting.** CPython's decoder recurses once per level: about 1,000 levels of ``[`` raise
  ``RecursionError``, and a value a little shallower than that decodes but breaks the next
  recursive consumer (``json.dumps``, a schema validator, a pretty-printer). Values nested
  deeper than :data:`MAX_JSON_DEPTH` are refused with :class:`JSONDepthError` (a
  ``ValueError``) *before* decoding.
* **Lone surrogates.** ``"\\ud800"`` decodes to a string no UTF-8 encoder accepts. Every
  surrogate code point in a decoded string (keys included) is replaced by U+FFFD. (A Python
  ``str`` never holds a valid surrogate *pair*: ``"\\ud83d\\ude00"`` decodes to one astral
  character, so any surrogate left in a string is unencodable.)
* **``NaN`` / ``Infinity``.** Python's extension, rejected by every other JSON consumer; a
  number too large for a float (``1e999``) is refused too, since it would be written back as
  ``Infinity``.

Used by the parsers (call bodies, XML parameter values) and by tool-argument decoding, so both
follow one rule. Standard library only.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate

from hermes_async.jsontypes import JSON

__all__ = ("MAX_JSON_DEPTH", "JSONDepthError", "exceeds_depth", "loads", "scrub_text")

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


def exceeds_depth(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the brackets of JSON ``text`` nest deeper than ``limit`` (strings skipped).

    Linear and cheap: a text with at most ``limit`` brackets is answered by two counts; else
    the string literals are cut out and the depth is a running sum over what is left (C-level
    loops throughout). Malformed text (an unterminated string) may be over-counted; it would not
    decode anyway.
    """
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
    """A decoded JSON value with :func:`scrub_text` applied to every string and key.

    Recursive: call it only on values whose depth is bounded (everything :func:`loads`
    returns).
    """
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, list):
        return [_scrub_json(v) for v in value]
    if isinstance(value, dict):
        return {scrub_text(k): _scrub_json(v) for k, v in value.items()}
    return value


def loads(text: str, *, depth_checked: bool = False) -> JSON:
    """Decode model-written JSON text: bounded depth, no ``NaN``, strings made encodable.

    Args:
        text: The JSON text.
        depth_checked: The caller already knows the nesting is within :data:`MAX_JSON_DEPTH`
            (the parsers' scanner counts it while streaming), so the pre-check is skipped.

    Raises:
        JSONDepthError: Nested deeper than :data:`MAX_JSON_DEPTH` (a ``ValueError``).
        ValueError: Not valid JSON (``json.JSONDecodeError``), or ``NaN`` / ``Infinity``.
    """
    if not depth_checked and exceeds_depth(text):
        raise JSONDepthError
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError as exc:  # within the limit, but the caller's stack was already deep
        raise JSONDepthError from exc
    # Only a text that could put a surrogate into a string pays for the walk: a surrogate
    # escape (``\u`` escapes of ordinary characters are common, ``\ud800`` is not), or a
    # surrogate in the text itself.
    if _SURROGATE_ESCAPE.search(text) or (not text.isascii() and _SURROGATE.search(text)):
        value = _scrub_json(value)
    return value
