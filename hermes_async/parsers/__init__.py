"""Tool-call parsers for every supported model family, streaming and whole-text.

Get a fresh parser per model output with :func:`get_parser`; feed it text as it streams
(``feed(text, token_ids=None) -> events``) and call ``finish()`` at the end, or parse a whole
output with ``parse(text)``. Both paths run the same engine, so they agree on every split of
the text.

Registered names: ``deepseek_dsml``, ``deepseek_v3``, ``deepseek_v31``, ``deepseek_v3_1``,
``deepseek_v4``, ``glm45``, ``glm47``, ``hermes``, ``kimi_k2``, ``llama3_json``,
``llama4_json``, ``longcat``, ``mistral``, ``qwen``, ``qwen3_coder``. Each format's module
documents its wire format with a literal example and what it does better than the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.parsers._engine import Format, ToolCallParser
from hermes_async.parsers.deepseek import DEEPSEEK_V3, DEEPSEEK_V3_1, DEEPSEEK_V4
from hermes_async.parsers.glm import GLM45, GLM47
from hermes_async.parsers.hermes import HERMES, LONGCAT
from hermes_async.parsers.kimi_k2 import KIMI_K2
from hermes_async.parsers.llama import LLAMA3_JSON, LLAMA4_JSON
from hermes_async.parsers.mistral import MISTRAL
from hermes_async.parsers.qwen3_coder import QWEN3_CODER
from hermes_async.parsers.types import (
    ArgumentsDelta,
    ContentDelta,
    FunctionCall,
    ParseResult,
    ParserEvent,
    ToolCall,
    ToolCallInvalid,
    ToolCallSealed,
    ToolCallStart,
    ToolCallTruncated,
)

__all__ = [
    "ArgumentsDelta",
    "ContentDelta",
    "FunctionCall",
    "ParseResult",
    "ParserEvent",
    "ToolCall",
    "ToolCallInvalid",
    "ToolCallParser",
    "ToolCallSealed",
    "ToolCallStart",
    "ToolCallTruncated",
    "get_parser",
    "list_parsers",
]

#: Registry name -> format. Aliases share the format object (``qwen`` is ``hermes``).
_FORMATS: dict[str, Format] = {
    "hermes": HERMES,
    "qwen": HERMES,
    "longcat": LONGCAT,
    "mistral": MISTRAL,
    "llama3_json": LLAMA3_JSON,
    "llama4_json": LLAMA4_JSON,
    "qwen3_coder": QWEN3_CODER,
    "deepseek_v3": DEEPSEEK_V3,
    "deepseek_v3_1": DEEPSEEK_V3_1,
    "deepseek_v31": DEEPSEEK_V3_1,
    "deepseek_v4": DEEPSEEK_V4,
    "deepseek_dsml": DEEPSEEK_V4,
    "kimi_k2": KIMI_K2,
    "glm45": GLM45,
    "glm47": GLM47,
}


def list_parsers() -> list[str]:
    """All registered parser names (aliases included), sorted."""
    return sorted(_FORMATS)


def get_parser(
    name: str,
    *,
    tools: Sequence[JSONObject] | None = None,
    tokenizer: Tokenizer | None = None,
) -> ToolCallParser:
    """A fresh parser for one model output.

    Args:
        name: A registered name (see :func:`list_parsers`).
        tools: The OpenAI-style tool definitions offered to the model; the XML formats
            (``qwen3_coder``, ``glm45``, ``glm47``) type parameter values from their schemas.
        tokenizer: Lets the parser recognize markers that arrive only as special token ids
            (when the text was decoded with special tokens skipped).

    Raises:
        KeyError: ``name`` is not registered; the message lists the available names.
    """
    fmt = _FORMATS.get(name)
    if fmt is None:
        raise KeyError(f"unknown tool-call parser {name!r}; available: {', '.join(list_parsers())}")
    return ToolCallParser(fmt, tools=tools, tokenizer=tokenizer)
