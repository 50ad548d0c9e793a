"""Result and event types shared by every tool-call parser.

A parser turns model output into two things:

* **events**, produced while the text streams in (:meth:`ToolCallParser.feed`):
  :class:`ContentDelta`, :class:`ToolCallStart`, :class:`ArgumentsDelta`,
  :class:`ToolCallSealed`, :class:`ToolCallInvalid`, :class:`ToolCallTruncated`;
* a :class:`ParseResult` once the stream has ended (:meth:`ToolCallParser.finish`), which is
  also what the whole-text :meth:`ToolCallParser.parse` returns.

Every call attempt gets exactly one terminal event: sealed (complete, validated, ready to
execute), invalid (malformed; the model should be told) or truncated (still open when the stream
ended; never executed). Call indices count call attempts in the order they appear, so a sealed
call and an invalid one share one index space.
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
        name: The tool name as the model wrote it.
        arguments: The arguments as a string: from a parser, a JSON object serialized with
            ``ensure_ascii=False``; from a chat server, as it sent them.
    """

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call, shaped like OpenAI's ``ChatCompletionMessageToolCall``.

    The one tool-call type of the package: parsers make it, the chat client reads it from
    responses, the agent loop runs it. Attribute access matches the OpenAI client types
    (``call.function.name``), and :meth:`to_dict` gives the message form.

    Attributes:
        id: The call's id: a chat server's, or from a parser a fresh one (``call_<24 hex>``;
            9 alphanumerics for ``mistral``, whose chat templates require that shape).
        function: Name and JSON-object argument string.
        type: Always ``"function"``.
        index: Position among the call attempts of this output (0-based).
        native_id: The id the model itself wrote, when the format has one (``kimi_k2``:
            ``functions.get_weather:0``; ``mistral`` v13 ``[CALL_ID]``). Chat templates that
            re-render the assistant turn need it; the model never sees :attr:`id` twice.
    """

    id: str
    function: FunctionCall
    type: str = "function"
    index: int = 0
    native_id: str | None = None

    @property
    def name(self) -> str:
        """Shortcut for ``function.name``."""
        return self.function.name

    @property
    def arguments(self) -> str:
        """Shortcut for ``function.arguments``."""
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
        text: The new text (never empty).
        reasoning: True inside a ``<think>...</think>`` block (the tags are included in the
            text). Reasoning is passed through verbatim and never scanned for calls.
    """

    text: str
    reasoning: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call has begun and its name is known.

    Attributes:
        index: The call's position among this output's call attempts.
        id: The id the sealed call will carry.
        name: The tool name (whole, never a prefix).
    """

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    """A preview fragment of a call's arguments, for display.

    For JSON formats the fragments are the argument text as the model writes it; for the XML
    formats (``qwen3_coder``, ``glm45``/``glm47``) one JSON fragment per finished parameter.
    Fragments may be coalesced differently for different chunkings. The authoritative value is
    :attr:`ToolCallSealed.arguments`.

    Attributes:
        index: The call the fragment belongs to.
        fragment: The new text (never empty).
    """

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class ToolCallSealed:
    """A complete, validated tool call: dispatch it now.

    Attributes:
        index: The call's position among this output's call attempts.
        id: Unique call id (use it for the ``tool`` result message).
        name: The tool name.
        arguments: The arguments, a JSON object serialized with ``ensure_ascii=False``.
        native_id: The model's own id for the call, if the format has one (see
            :attr:`ToolCall.native_id`).
        raw: The call's JSON exactly as the model wrote it (whitespace and key order kept):
            for formats that write a call as one JSON object (``hermes``, ``llama3_json``,
            Mistral's object form) the whole object, for formats that write a name and then a
            JSON object (Mistral v11, DeepSeek, Kimi K2) that arguments object; ``""`` for the
            XML formats and calls without arguments. A chat template that renders it gives
            back the model's own text (the agent loop keeps it in the message).
    """

    index: int
    id: str
    name: str
    arguments: str
    native_id: str | None = None
    raw: str = ""

    @property
    def call(self) -> ToolCall:
        """The same call as a :class:`ToolCall`."""
        return ToolCall(
            id=self.id,
            function=FunctionCall(self.name, self.arguments),
            index=self.index,
            native_id=self.native_id,
        )


@dataclass(frozen=True, slots=True)
class ToolCallInvalid:
    """A call the model attempted but wrote malformed; it is not executed.

    The agent loop should tell the model (see :attr:`message`) rather than drop it silently.

    Attributes:
        index: The call's position among this output's call attempts.
        id: Unique id (usable for a ``tool`` message carrying the error).
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
    """A call still open when the stream ended (``max_tokens``); it is not executed.

    Attributes:
        index: The call's position among this output's call attempts.
        id: Unique id.
        name: The tool name if it was complete, else None.
        raw: The call's text so far (markers removed).
    """

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
    """What a whole output parsed to.

    Keeps the reference's contract: ``content, tool_calls = result`` unpacks, plain text gives
    ``(text, None)``, and ``tool_calls`` is None (not empty) when there are no valid calls.

    Attributes:
        content: With no call attempts, the text unchanged. Otherwise the text outside the
            calls — before, between and after them — each piece stripped, joined with
            newlines; None when nothing is left.
        tool_calls: The sealed calls in order, or None.
        invalid_calls: Malformed call attempts (tell the model).
        truncated_calls: Calls cut off by the end of the stream (tell the model).
        final_events: Events produced by :meth:`ToolCallParser.finish` itself (flushed
            content, truncated calls); not part of equality.
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
