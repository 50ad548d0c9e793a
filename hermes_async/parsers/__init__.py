"""Tool-call parsers for every supported model family, streaming and whole-text.

Get a fresh parser per output with :func:`get_parser`; ``feed(text)`` as it streams and
``finish()`` at the end, or ``parse(text)`` whole. Both run the same engine, so they agree
on every split, and no output makes either raise: text becomes content, calls, or a
:class:`ToolCallInvalid` / :class:`ToolCallTruncated` event for the model. Each format's
module shows its wire format; :func:`list_parsers` names them; :func:`register_parser`
adds more. Importing this package imports neither the inference layer nor an HTTP library.
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
