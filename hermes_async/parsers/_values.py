"""Call ids, argument normalization, and schema-typed parameter values for the XML formats."""

from __future__ import annotations

import ast
import json
import math
import os
import secrets
import string
from collections.abc import Mapping, Sequence

from hermes_async._json import loads
from hermes_async.jsontypes import JSON, JSONObject

__all__ = ("ToolSchemas", "convert_value", "decode_arguments", "new_call_id", "new_mistral_id")

#: ``ast.literal_eval`` (the reference's fallback for untyped values) is only tried on values
#: up to this size: its cost and recursion depth grow with the input, and a value that long is
#: file content, which should stay a string anyway.
_LITERAL_EVAL_MAX_CHARS = 10_000

_ALNUM = string.ascii_letters + string.digits


def new_call_id() -> str:
    """A fresh call id, ``call_`` + 24 random hex digits (8 collided over long runs)."""
    return "call_" + os.urandom(12).hex()  # (a uuid4 object cost 5x as much, per call)


def new_mistral_id() -> str:
    """A fresh 9-character alphanumeric id (Mistral chat templates reject any other shape)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def decode_arguments(value: JSON) -> tuple[JSONObject | None, str | None]:
    """Normalize a call's ``arguments`` to a JSON object: ``(object, None)`` or ``(None, reason)``.

    ``None`` is ``{}``; a JSON string holding an object is decoded once.
    """
    if value is None:
        return {}, None
    if isinstance(value, dict):
        return value, None
    if isinstance(value, str):
        if not value.strip():
            return {}, None
        try:
            decoded = loads(value)
        except ValueError as exc:
            return None, f"arguments is a string that is not valid JSON ({exc})"
        if isinstance(decoded, dict):
            return decoded, None
        return (
            None,
            f"arguments must be a JSON object, got a string holding {type(decoded).__name__}",
        )
    return None, f"arguments must be a JSON object, got {type(value).__name__}"


class ToolSchemas:
    """Parameter schemas by tool and parameter name, from OpenAI-style or bare tool definitions."""

    __slots__ = ("_params",)

    def __init__(self, tools: Sequence[JSONObject] | None) -> None:
        self._params: dict[str, dict[str, JSONObject]] = {}
        for tool in tools or ():
            function = tool.get("function", tool) if isinstance(tool, Mapping) else None
            if not isinstance(function, Mapping):
                continue
            name = function.get("name")
            parameters = function.get("parameters")
            if not isinstance(name, str) or not isinstance(parameters, Mapping):
                continue
            properties = parameters.get("properties")
            if isinstance(properties, Mapping):
                self._params[name] = {
                    k: v
                    for k, v in properties.items()
                    if isinstance(k, str) and isinstance(v, dict)
                }

    def __bool__(self) -> bool:
        return bool(self._params)

    def param(self, tool: str, param: str) -> JSONObject | None:
        """The schema of ``tool``'s parameter ``param``, or None if unknown."""
        return self._params.get(tool, {}).get(param)


def _schema_types(schema: JSONObject) -> list[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    types: list[str] = []
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            for option in options:
                if isinstance(option, dict):
                    types.extend(_schema_types(option))
    if not types and "enum" in schema:
        enum = schema["enum"]
        if isinstance(enum, list) and all(isinstance(e, str) for e in enum):
            types.append("string")
    return types


def _untyped(raw: str) -> JSON:
    """The reference's rule without a schema: JSON, else a Python literal, else the string."""
    text = raw.strip()
    try:
        return loads(text)
    except ValueError:
        pass
    if len(text) <= _LITERAL_EVAL_MAX_CHARS:
        try:
            literal = ast.literal_eval(text)
            # Through JSON text: tuples become lists, the depth is checked, surrogates
            # (which json.dumps escapes) are scrubbed; a set or bytes is not JSON.
            return loads(json.dumps(literal, allow_nan=False))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, OverflowError):
            pass
    return raw


def _number(text: str) -> int | float | None:
    """``text`` as an int if it spells one, else as a finite float, else None."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _as_type(raw: str, kind: str) -> tuple[bool, JSON]:
    text = raw.strip()
    if kind == "string":
        return True, raw
    if kind in ("integer", "number"):
        number = _number(text)
        if number is None:
            return False, None
        if kind == "number" or isinstance(number, int):
            return True, number
        return (True, int(number)) if number.is_integer() else (False, None)
    if kind == "boolean":
        lowered = text.lower()
        if lowered in ("true", "false"):
            return True, lowered == "true"
        return False, None
    if kind == "null":
        return (True, None) if text.lower() in ("null", "none") else (False, None)
    if kind in ("object", "array"):
        value = _untyped(raw)
        wanted = dict if kind == "object" else list
        return (True, value) if isinstance(value, wanted) else (False, None)
    return False, None


def convert_value(raw: str, schema: JSONObject | None) -> JSON:
    """Type one XML parameter value: by its schema, else JSON, a literal or raw."""
    if schema is None:
        return _untyped(raw)
    types = _schema_types(schema)
    if not types:
        return _untyped(raw)
    # Try non-string types first so ["integer", "string"] prefers the number.
    for kind in sorted(types, key=lambda k: k == "string"):
        ok, value = _as_type(raw, kind)
        if ok:
            return value
    return raw
