"""The parser registry: names -> parser classes, ``@register_parser``, ``get_parser``.

The reference's spellings work (``PARSER_REGISTRY``, a stackable ``@register_parser``). A
parser class describes its format instead of implementing ``parse``, so every registered
name runs on the one streaming engine; a class that does not fit is refused at
registration, with what to write instead::

    @register_parser("my_format")
    class MyParser(ToolCallParser):
        FORMAT = Format(
            name="my_format", call_open=("<call>",), body=JsonCallSpec(close=("</call>",))
        )

A taken name is replaced: the last registration wins, as in the reference.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from hermes_async.errors import UnknownParserError
from hermes_async.jsontypes import JSONObject
from hermes_async.parsers._engine import Format, ToolCallParser

if TYPE_CHECKING:  # typing only: importing the parsers must not import the inference layer
    from hermes_async.inference.tokenizer import Tokenizer

__all__ = ["PARSER_REGISTRY", "get_parser", "list_parsers", "parser_class", "register_parser"]

P = TypeVar("P", bound=type[ToolCallParser])

#: Registry name -> parser class. Aliases map to the same class (``qwen`` -> the ``hermes``
#: parser). Fill it with :func:`register_parser`, which checks the class.
PARSER_REGISTRY: dict[str, type[ToolCallParser]] = {}

_CONTRACT = (
    "a registered parser must subclass hermes_async.parsers.ToolCallParser and describe its "
    "format in a FORMAT class attribute, e.g. FORMAT = Format(name='x', call_open=('<call>',), "
    "body=JsonCallSpec(close=('</call>',))); the streaming engine runs it, and parse(text) is "
    "feed(text) + finish()"
)
_ENGINE_METHODS = ("feed", "finish", "parse")


def _contract_problem(cls: object) -> str | None:
    """What is wrong with ``cls`` as a parser class, or None."""
    if not (isinstance(cls, type) and issubclass(cls, ToolCallParser)):
        return f"{cls!r} is not a ToolCallParser subclass"
    overridden = [m for m in _ENGINE_METHODS if getattr(cls, m) is not getattr(ToolCallParser, m)]
    if overridden:
        names = ", ".join(f"{m}()" for m in overridden)
        return (
            f"{cls.__name__} overrides {names}; whole-text and streaming results must come from "
            "the same engine, so describe the format instead of parsing it by hand"
        )
    fmt = cls.FORMAT
    if not isinstance(fmt, Format):
        return f"{cls.__name__}.FORMAT is {fmt!r}, not a Format"
    body = fmt.body
    if not (callable(getattr(body, "new", None)) and callable(getattr(body, "spellings", None))):
        return (
            f"{cls.__name__}.FORMAT.body ({body!r}) does not implement new(sink) -> Body and "
            "spellings() -> tuple[str, ...] (use JsonCallSpec or NamedJsonSpec)"
        )
    try:
        hash(fmt)
    except TypeError:
        return f"{cls.__name__}.FORMAT must be hashable (frozen dataclasses throughout)"
    spellings = (*fmt.call_open, *fmt.section_open, *fmt.section_close, *fmt.drop)
    if not fmt.call_open or not all(isinstance(s, str) and s for s in spellings):
        return f"{cls.__name__}.FORMAT needs call_open markers, and no marker may be empty"
    try:
        inspect.signature(cls).bind(tools=None, tokenizer=None)
    except TypeError:
        return f"{cls.__name__}(tools=..., tokenizer=...) must work: get_parser() builds it so"
    return None


def register_parser(name: str) -> Callable[[P], P]:
    """Class decorator: register a parser class under ``name`` (stack it for aliases).

    Raises:
        TypeError: The class does not fit the engine's contract (the message says what to
            implement), or ``name`` is not a non-empty string.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_parser() needs a non-empty name string, got {name!r}")

    def decorate(cls: P) -> P:
        problem = _contract_problem(cls)
        if problem is not None:
            raise TypeError(f"cannot register {name!r}: {problem}; {_CONTRACT}")
        PARSER_REGISTRY[name] = cls
        return cls

    return decorate


def parser_class(fmt: Format) -> type[ToolCallParser]:
    """A :class:`ToolCallParser` subclass that runs ``fmt`` (how the built-in names are made)."""
    words = fmt.name.replace("-", "_").split("_")
    return type(
        "".join(w[:1].upper() + w[1:] for w in words) + "Parser",
        (ToolCallParser,),
        {"__slots__": (), "FORMAT": fmt, "__module__": "hermes_async.parsers"},
    )


def list_parsers() -> list[str]:
    """All registered parser names (aliases included), sorted."""
    return sorted(PARSER_REGISTRY)


def get_parser(
    name: str,
    *,
    tools: Sequence[JSONObject] | None = None,
    tokenizer: Tokenizer | None = None,
) -> ToolCallParser:
    """A fresh parser for one model output.

    Args:
        tools: The tool definitions offered to the model; the XML formats type parameter
            values from their schemas.
        tokenizer: Lets the parser see markers that arrive only as special token ids.

    Raises:
        UnknownParserError: ``name`` is not registered; the message lists the available names.
    """
    cls = PARSER_REGISTRY.get(name)
    if cls is None:
        raise UnknownParserError(name, PARSER_REGISTRY)
    return cls(tools=tools, tokenizer=tokenizer)
