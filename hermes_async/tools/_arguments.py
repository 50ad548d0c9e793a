"""Tool-call argument decoding, coercion and validation against a tool's JSON schema.

Models get argument types slightly wrong in harmless ways (``"timeout": "30"``, an array as
a JSON string, one path for a list). We coerce these as the reference did, then validate
with ``jsonschema`` and turn any remaining problem into one sentence naming the field. Pure;
raises :class:`~hermes_async.errors.ToolArgumentsError`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from hermes_async._json import JSONDepthError, loads, scrub_text
from hermes_async.errors import ConfigError, ToolArgumentsError
from hermes_async.jsontypes import JSONObject

__all__ = ("coerce_arguments", "decode_arguments", "parameters_validator", "validate_arguments")

_TRUE = {"true", "yes", "1"}
_FALSE = {"false", "no", "0"}


def decode_arguments(raw: str | bytes | Mapping[str, Any] | None) -> JSONObject:
    """Turn a tool call's ``arguments`` (a JSON object string or a mapping) into a dict.

    Empty means no arguments; a double-encoded object is decoded once more. Model text is
    hostile: nesting past 64 levels is refused (``json.loads`` would hit ``RecursionError``),
    lone surrogates and invalid UTF-8 become U+FFFD, so the result always serializes again.

    Raises:
        ToolArgumentsError: Not valid JSON, too deep, or not an object.
    """
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return _checked_mapping(raw)
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.strip()
    if not text:
        return {}
    try:
        value = loads(text)
    except ValueError as exc:
        raise ToolArgumentsError(
            f"Invalid JSON in tool arguments: {exc}. Please retry with valid JSON."
        ) from exc
    if isinstance(value, str):
        # Double-encoded: the arguments object was serialized twice.
        with contextlib.suppress(ValueError):
            value = loads(value)
    if not isinstance(value, dict):
        raise ToolArgumentsError(
            'Tool arguments must be a JSON object (e.g. {"name": value}), '
            f"got {type(value).__name__}: {_short(scrub_text(text))}"
        )
    return value


def _checked_mapping(raw: Mapping[str, Any]) -> JSONObject:
    """A mapping someone else decoded, held to :func:`loads`' rules (depth, encodability)."""
    try:
        # ensure_ascii escapes surrogates, so loads() sees (and scrubs) them.
        text = json.dumps(raw, ensure_ascii=True)
    except (TypeError, ValueError):  # not JSON-shaped (an object, a cycle): validation reports
        return dict(raw)
    except RecursionError as exc:
        raise ToolArgumentsError(f"Invalid tool arguments: {JSONDepthError()}") from exc
    try:
        value = loads(text)
    except ValueError as exc:  # too deep, or NaN
        raise ToolArgumentsError(f"Invalid tool arguments: {exc}") from exc
    return value if isinstance(value, dict) else dict(raw)


def _types(schema: Mapping[str, Any]) -> set[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return set()


def _coerce_value(value: Any, schema: Mapping[str, Any]) -> Any:
    types = _types(schema)
    if not types:
        return value
    if isinstance(value, str):
        if "string" in types:
            return value
        stripped = value.strip()
        lowered = stripped.lower()
        if "integer" in types:
            try:
                return int(stripped)
            except ValueError:
                try:
                    as_float = float(stripped)
                except ValueError:
                    pass
                else:
                    if as_float.is_integer():
                        return int(as_float)
        if "number" in types:
            try:
                as_float = float(stripped)
            except ValueError:
                pass
            else:
                return int(as_float) if as_float.is_integer() and "." not in stripped else as_float
        if "boolean" in types:
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
        if "null" in types and lowered in {"null", "none", ""}:
            return None
        if types & {"array", "object"} and stripped[:1] in "[{":
            try:
                decoded = loads(stripped)
            except ValueError:
                decoded = None
            if isinstance(decoded, list) and "array" in types:
                return _coerce_value(decoded, schema)
            if isinstance(decoded, dict) and "object" in types:
                return _coerce_value(decoded, schema)
        if "array" in types:
            return [_coerce_value(value, schema.get("items", {}))]
        return value
    if "array" in types and isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [_coerce_value(v, items) for v in value]
        return value
    if (
        "array" in types
        and not isinstance(value, list)
        and value is not None
        and not ("object" in types and isinstance(value, dict))
    ):
        return [_coerce_value(value, schema.get("items", {}))]
    if "object" in types and isinstance(value, dict):
        return coerce_arguments(schema, value)
    if "number" in types and isinstance(value, bool) is False and isinstance(value, int):
        return value
    if "integer" in types and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def coerce_arguments(schema: Mapping[str, Any], args: Mapping[str, Any]) -> JSONObject:
    """Apply the reference's lenient coercions to ``args`` as described by an object ``schema``.

    Numeric and boolean strings, JSON-encoded arrays and objects, and a scalar for an array
    are converted; undescribed properties are left alone.
    """
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return dict(args)
    out: JSONObject = {}
    for key, value in args.items():
        sub = props.get(key)
        out[key] = _coerce_value(value, sub) if isinstance(sub, Mapping) else value
    return out


#: Validators of the parameter schemas seen so far, by the schema's canonical JSON text.
_VALIDATORS: dict[str, Draft202012Validator] = {}

#: The type names JSON Schema knows (for the message about a misspelt one).
_JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")

#: The JSON Schema 2020-12 meta-schema's own validator (what ``check_schema`` builds per call).
_META_VALIDATOR = Draft202012Validator(Draft202012Validator.META_SCHEMA)


def parameters_validator(tool_name: str, schema: object) -> Draft202012Validator:
    """The validator of a tool's ``parameters``, checked and built once per distinct schema.

    The first check against the 2020-12 meta-schema costs ~0.7 ms; ``ToolRegistry.register``
    calls this, so a broken schema fails at registration, not at the model's first call.

    Raises:
        ConfigError: ``schema`` is not a valid JSON Schema of an object; the message names
            the tool and where.
    """
    where = f"tool {tool_name!r}: parameters"
    if not isinstance(schema, Mapping):
        raise ConfigError(
            f"{where} must be a JSON Schema object (a dict), got {type(schema).__name__}"
        )
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where} must be JSON (dicts, lists, strings, numbers): {exc}") from None
    validator = _VALIDATORS.get(key)
    if validator is not None:
        return validator
    error = best_match(_META_VALIDATOR.iter_errors(schema))
    if error is not None:
        hint = ""
        if error.absolute_path and error.absolute_path[-1] == "type":
            hint = f"; 'type' takes one of {', '.join(_JSON_TYPES)} (or a list of them)"
        raise ConfigError(
            f"{where} is not a valid JSON Schema (draft 2020-12): at {error.json_path}: "
            f"{_short(error.message, 200)}{hint}"
        )
    root_type = schema.get("type", "object")
    if root_type != "object" and not (isinstance(root_type, list) and "object" in root_type):
        raise ConfigError(
            f"{where} must describe an object (the call's arguments are one): its root "
            f"'type' is {root_type!r}; put the fields under 'properties' of an object schema"
        )
    validator = Draft202012Validator(schema)
    _VALIDATORS[key] = validator
    return validator


def validate_arguments(tool_name: str, validator: Draft202012Validator, args: JSONObject) -> None:
    """Validate ``args`` with the tool's :func:`parameters_validator`.

    Raises:
        ToolArgumentsError: With a message naming the tool, the field and the problem.
    """
    error = best_match(validator.iter_errors(args))
    if error is None:
        return
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    if error.validator == "required":
        where = "arguments"
    elif path:
        where = f"field '{path.lstrip('.')}'"
    else:
        where = "arguments"
    raise ToolArgumentsError(
        f"Invalid arguments for tool '{tool_name}': {where}: {error.message}",
        field="$" + path,
    )


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
