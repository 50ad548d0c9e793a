"""Result and event types shared by every tool-call parser.

While text streams in, :meth:`ToolCallParser.feed` yields events; at the end
:meth:`ToolCallParser.finish` gives a :class:`ParseResult`. Every call attempt gets exactly one
terminal event: sealed (run it), invalid (tell the model) or truncated (never run). Sealed and
invalid calls share one index space.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

from hermes_async.jsontypes import JSONObject

__all__ = (
    "ArgumentsDelta",
    "ContentDelta",
    "FunctionCall",
    "ParseResult",
    "ParserEvent",
    "ToolCall",
    "ToolCallInvalid",
    "ToolCallSealed",
    "ToolCallStart",
    "ToolCallTruncated",
)


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """The ``function`` member of an OpenAI tool call.

    Attributes:
        arguments: From a parser, a JSON object (``ensure_ascii=False``); from a chat server,
            as it sent them.
    """

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call, shaped like OpenAI's ``ChatCompletionMessageToolCall``; the package's only one.

    Attributes:
        id: A chat server's id, or a fresh ``call_<24 hex>`` (9 alphanumerics for ``mistral``,
            whose templates require that shape).
        native_id: The id the model itself wrote, when the format has one (``kimi_k2``,
            ``mistral`` v13); templates that re-render the turn need it.
    """

    id: str
    function: FunctionCall
    type: str = "function"
    index: int = 0
    native_id: str | None = None

    @property
    def name(self) -> str:
        return self.function.name

    @property
    def arguments(self) -> str:
        return self.function.arguments

    def to_dict(self) -> JSONObject:
        """The OpenAI message form: ``{"id", "type", "function": {"name", "arguments"}}``."""
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.function.name, "arguments": self.function.arguments},
        }


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Text outside tool calls, as it arrives (markers removed).

    Attributes:
        reasoning: True inside ``<think>...</think>`` (tags included); never scanned for calls.
    """

    text: str
    reasoning: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call has begun and its whole name is known."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    """A preview fragment of a call's arguments, for display only.

    Chunking may change the fragments; :attr:`ToolCallSealed.arguments` is the real value.
    """

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class ToolCallSealed:
    """A complete, validated tool call: dispatch it now.

    Attributes:
        arguments: A JSON object serialized with ``ensure_ascii=False``.
        raw: The call's JSON exactly as the model wrote it (the object, or the arguments object
            for name-then-JSON formats); ``""`` for XML formats and calls without arguments.
    """

    index: int
    id: str
    name: str
    arguments: str
    native_id: str | None = None
    raw: str = ""

    @property
    def call(self) -> ToolCall:
        return ToolCall(
            id=self.id,
            function=FunctionCall(self.name, self.arguments),
            index=self.index,
            native_id=self.native_id,
        )


@dataclass(frozen=True, slots=True)
class ToolCallInvalid:
    """A call the model attempted but wrote malformed; it is not executed.

    Attributes:
        name: The tool name if it could be read, else None.
        raw: The call's text as the model wrote it (markers removed).
        reason: What is wrong, for the model and for logs.
    """

    index: int
    id: str
    name: str | None
    raw: str
    reason: str

    @property
    def message(self) -> str:
        """A model-facing explanation of why the call was not executed."""
        what = f"tool call '{self.name}'" if self.name else "tool call"
        return f"Error: the {what} could not be parsed and was not executed: {self.reason}"


@dataclass(frozen=True, slots=True)
class ToolCallTruncated:
    """A call still open when the stream ended (``max_tokens``); it is not executed."""

    index: int
    id: str
    name: str | None
    raw: str

    @property
    def message(self) -> str:
        """A model-facing explanation of why the call was not executed."""
        what = f"tool call '{self.name}'" if self.name else "tool call"
        return (
            f"Error: the {what} was cut off before it was complete (output length limit) "
            "and was not executed"
        )


#: Everything :meth:`ToolCallParser.feed` can return.
ParserEvent: TypeAlias = (
    ContentDelta
    | ToolCallStart
    | ArgumentsDelta
    | ToolCallSealed
    | ToolCallInvalid
    | ToolCallTruncated
)


@dataclass(frozen=True, slots=True)
class ParseResult:
    """What a whole output parsed to; unpacks as the reference's ``content, tool_calls``.

    Attributes:
        content: With no call attempts, the text unchanged. Otherwise the stripped text pieces
            outside the calls, joined with newlines; None when nothing is left.
        tool_calls: The sealed calls in order, or None (not empty) when there are none.
        final_events: Events :meth:`ToolCallParser.finish` produced; not part of equality.
    """

    content: str | None
    tool_calls: list[ToolCall] | None
    invalid_calls: tuple[ToolCallInvalid, ...] = ()
    truncated_calls: tuple[ToolCallTruncated, ...] = ()
    final_events: tuple[ParserEvent, ...] = field(default=(), compare=False, repr=False)

    def __iter__(self) -> Iterator[str | list[ToolCall] | None]:
        """Unpack as the reference's ``(content, tool_calls)`` tuple."""
        yield self.content
        yield self.tool_calls
