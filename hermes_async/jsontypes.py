"""Named JSON aliases, the only place ``Any`` appears in public signatures."""

from __future__ import annotations

from typing import Any, TypeAlias

__all__ = (
    "JSON",
    "JSONObject",
)

#: Any value ``json.loads`` can return.
JSON: TypeAlias = Any
#: A decoded JSON object (tool arguments, tool results, OpenAI messages).
JSONObject: TypeAlias = dict[str, Any]
