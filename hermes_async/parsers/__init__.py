"""Tool-call parsers for every supported model family, streaming and whole-text.

Get a fresh parser per model output with :func:`get_parser`; feed it text as it streams
(``feed(text, token_ids=None) -> events``) and call ``finish()`` at the end, or parse a whole
output with ``parse(text)``. Both paths run the same engine, so they agree on every split of
the text, and no model output makes either raise: whatever the text holds becomes content,
calls, or a :class:`ToolCallInvalid` / :class:`ToolCallTruncated` event to tell the model.

Registered names: ``deepseek_dsml``, ``deepseek_v3``, ``deepseek_v31``, ``deepseek_v3_1``,
``deepseek_v4``, ``glm45``, ``glm47``, ``hermes``, ``kimi_k2``, ``llama3_json``,
``llama4_json``, ``longcat``, ``mistral``, ``qwen``, ``qwen3_coder``. Each format's module
documents its wire format with a literal example and what it does better than the reference.
More formats join with :func:`register_parser` (see :mod:`hermes_async.parsers._registry`).

Importing this package imports neither the inference layer nor an HTTP library: the parsers
know the tokenizer protocol for typing only.
"""

from __future__ import annotations

from hermes_async._exports import fixup_module_metadata
from hermes_async.parsers import types as _types
from hermes_async.parsers._bodies import JsonCallSpec, NamedJsonSpec
from hermes_async.parsers._engine import Format, ToolCallParser
from hermes_async.parsers._registry import (
    PARSER_REGISTRY,
    get_parser,
    list_parsers,
    parser_class,
    register_parser,
)
from hermes_async.parsers.deepseek import DEEPSEEK_V3, DEEPSEEK_V3_1, DEEPSEEK_V4
from hermes_async.parsers.glm import GLM45, GLM47
from hermes_async.parsers.hermes import HERMES, LONGCAT
from hermes_async.parsers.kimi_k2 import KIMI_K2
from hermes_async.parsers.llama import LLAMA3_JSON, LLAMA4_JSON
from hermes_async.parsers.mistral import MISTRAL
from hermes_async.parsers.qwen3_coder import QWEN3_CODER
from hermes_async.parsers.types import *  # noqa: F403  (results and events: types.__all__)

__all__: tuple[str, ...] = (
    "PARSER_REGISTRY",
    "Format",
    "JsonCallSpec",
    "NamedJsonSpec",
    "ToolCallParser",
    "get_parser",
    "list_parsers",
    "register_parser",
)
__all__ += _types.__all__

# The built-in formats, each under its own name and its aliases (as in the reference: ``qwen``
# is ``hermes``; ``deepseek_v31`` and ``deepseek_dsml`` are the reference's spellings).
for _fmt, *_aliases in (
    (HERMES, "qwen"),
    (LONGCAT,),
    (MISTRAL,),
    (LLAMA3_JSON,),
    (LLAMA4_JSON,),
    (QWEN3_CODER,),
    (DEEPSEEK_V3,),
    (DEEPSEEK_V3_1, "deepseek_v31"),
    (DEEPSEEK_V4, "deepseek_dsml"),
    (KIMI_K2,),
    (GLM45,),
    (GLM47,),
):
    _cls = parser_class(_fmt)
    for _name in (_fmt.name, *_aliases):
        register_parser(_name)(_cls)
del _fmt, _aliases, _cls, _name


fixup_module_metadata(__name__, globals())
