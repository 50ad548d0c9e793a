"""Chat client: OpenAI-compatible ``POST {base_url}/chat/completions``.

:class:`ChatClient` has ``async chat_completion(**kwargs)`` and returns a
:class:`ChatCompletion` shaped like the OpenAI SDK's, so the agent loop takes it, an atroposlib
``ServerManager`` or anything with that method. :class:`ChatStreamAssembler` (no I/O) folds a
stream into the same completion, within bounds. Every text out is encodable as UTF-8 (a lone
surrogate becomes U+FFFD).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Self, Unpack

from hermes_async._otel import request_attributes, span
from hermes_async.inference._errors import (
    DECODE_FAILURES,
    StreamInterruptedError,
)
from hermes_async.inference._http import (
    ConnectionKwargs,
    ConnectionSource,
    HTTPOptions,
    LineReader,
    ServerClient,
    connect,
)
from hermes_async.inference._sse import SSEJSONReader
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.parsers.types import FunctionCall as FunctionCall, ToolCall as ToolCall

__all__ = (
    "ChatClient",
    "ChatCompletion",
    "ChatMessage",
    "ChatStream",
    "ChatStreamAssembler",
    "Choice",
    "FunctionCall",
    "ToolCall",
    "Usage",
)


@dataclass(slots=True)
class ChatMessage:
    """The assistant's message; ``reasoning_content`` (vLLM) or ``reasoning`` (OpenRouter)."""

    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


@dataclass(slots=True)
class Choice:
    """One choice. ``token_ids`` is vLLM's ``return_token_ids`` extension, when present."""

    index: int
    message: ChatMessage
    finish_reason: str | None = None
    logprobs: JSON = None
    token_ids: list[int] | None = None


@dataclass(slots=True)
class Usage:
    """Token counts reported by the server."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(slots=True)
class ChatCompletion:
    """A chat completion, shaped like the OpenAI SDK's ``ChatCompletion``."""

    id: str
    choices: list[Choice]
    created: int = 0
    model: str = ""
    object: str = "chat.completion"
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = field(default=None)

    def model_dump(self) -> JSONObject:
        """A plain-dict copy (the OpenAI SDK's pydantic method of the same name)."""
        dumped = asdict(self)
        for choice, raw in zip(self.choices, dumped["choices"], strict=True):
            calls = choice.message.tool_calls
            if calls is not None:  # the SDK's shape: id, type, function
                raw["message"]["tool_calls"] = [call.to_dict() for call in calls]
        return dumped

    @classmethod
    def from_dict(cls, data: JSON) -> ChatCompletion:
        """Build from a decoded response body; ``ValueError`` if it is not a chat completion."""
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise ValueError("response has no 'choices' list")
        choices: list[Choice] = []
        for raw in data["choices"]:
            if not isinstance(raw, dict) or not isinstance(raw.get("message"), dict):
                raise ValueError("each choice needs a 'message' object")
            msg = raw["message"]
            calls = None
            if msg.get("tool_calls"):
                calls = [_tool_call_from_dict(c) for c in msg["tool_calls"]]
            choices.append(
                Choice(
                    index=int(raw.get("index", len(choices))),
                    message=ChatMessage(
                        role=str(msg.get("role") or "assistant"),
                        content=_encodable_or_none(msg.get("content")),
                        tool_calls=calls,
                        reasoning_content=_encodable_or_none(msg.get("reasoning_content")),
                        reasoning=_encodable_or_none(msg.get("reasoning")),
                    ),
                    finish_reason=_str_or_none(raw.get("finish_reason")),
                    logprobs=raw.get("logprobs"),
                    token_ids=raw.get("token_ids"),
                )
            )
        return cls(
            id=str(data.get("id") or ""),
            choices=choices,
            created=int(data.get("created") or 0),
            model=str(data.get("model") or ""),
            usage=_usage(data.get("usage")),
            prompt_token_ids=data.get("prompt_token_ids"),
        )


def _tool_call_from_dict(raw: JSON) -> ToolCall:
    if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
        raise ValueError("each tool call needs a 'function' object")
    fn = raw["function"]
    arguments = fn.get("arguments", "")
    if not isinstance(arguments, str):  # some servers send an object; the SDK shape is a string
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(
        id=str(raw.get("id") or _new_call_id()),
        function=FunctionCall(
            name=_encodable(str(fn.get("name") or "")), arguments=_encodable(arguments)
        ),
        type=str(raw.get("type") or "function"),
    )


def _str_or_none(value: JSON) -> str | None:
    """``value`` as the stream's assembler keeps it: a string, or ``None`` for null."""
    return None if value is None else str(value)


def _usage(raw: JSON) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    return Usage(
        prompt_tokens=int(raw.get("prompt_tokens") or 0),
        completion_tokens=int(raw.get("completion_tokens") or 0),
        total_tokens=int(raw.get("total_tokens") or 0),
    )


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# --------------------------------------------------------------------------------------------
# Streaming assembly (no I/O)


def _encodable(text: str) -> str:
    """``text`` with surrogate pairs joined and lone surrogates replaced by U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # UTF-16 is where surrogates mean something: a pair becomes its one character, a lone
        # half fails to decode and is replaced.
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _encodable_or_none(value: JSON) -> JSON:
    return _encodable(value) if isinstance(value, str) else value


@dataclass(slots=True)
class _ToolCallParts:
    id: str = ""
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _ChoiceParts:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    reasoning_content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class _TooLong(ValueError):
    """A streamed completion went past its bound (see :class:`ChatStreamAssembler`)."""


class ChatStreamAssembler:
    """Fold ``chat.completion.chunk`` objects into one :class:`ChatCompletion`, in linear time.

    Tool-call deltas are keyed by ``index``: the first sets ``id``, ``type`` and ``name``, each
    appends its ``arguments``. A chunk past ``max_chars`` (all text of all choices),
    ``max_tokens`` (token ids per choice) or ``max_choices`` raises ``ValueError``.
    """

    def __init__(
        self,
        *,
        max_chars: int | None = None,
        max_tokens: int | None = None,
        max_choices: int | None = None,
    ) -> None:
        self.id = ""
        self.model = ""
        self.created = 0
        self.usage: Usage | None = None
        self.prompt_token_ids: list[int] | None = None
        self._choices: dict[int, _ChoiceParts] = {}
        self._max_chars = max_chars
        self._max_tokens = max_tokens
        self._max_choices = max_choices
        self._chars = 0  # content, reasoning, tool names and arguments so far

    @property
    def finished(self) -> bool:
        """Every choice seen so far has a finish_reason (and there is at least one)."""
        return bool(self._choices) and all(
            c.finish_reason is not None for c in self._choices.values()
        )

    def feed(self, chunk: JSON) -> None:
        """Fold one decoded chunk in; ``ValueError`` for an error frame or anything else."""
        if not isinstance(chunk, dict):
            raise ValueError(f"expected a JSON object, got {type(chunk).__name__}")
        if chunk.get("error") is not None or chunk.get("object") == "error":
            error = chunk.get("error") or chunk
            detail = error.get("message", error) if isinstance(error, dict) else error
            raise _ServerErrorFrame(f"the server reported an error mid-stream: {detail}")
        self.id = self.id or str(chunk.get("id") or "")
        self.model = self.model or str(chunk.get("model") or "")
        self.created = self.created or int(chunk.get("created") or 0)
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_token_ids = chunk["prompt_token_ids"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise ValueError("choices must be a list")
        for raw in choices:
            self._feed_choice(raw)

    def _feed_choice(self, raw: JSON) -> None:
        if not isinstance(raw, dict):
            raise ValueError("each choice must be an object")
        index = int(raw.get("index", 0))
        parts = self._choices.get(index)
        if parts is None:
            limit = self._max_choices
            if limit is not None and len(self._choices) >= limit:
                raise _TooLong(f"more than the {limit} choices asked for (n)")
            parts = self._choices[index] = _ChoiceParts()
        delta = raw.get("delta") or {}
        if not isinstance(delta, dict):
            raise ValueError("choices[].delta must be an object")
        if delta.get("role"):
            parts.role = str(delta["role"])
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if value:
                if not isinstance(value, str):
                    raise ValueError(f"delta.{key} must be a string, got {type(value).__name__}")
                self._count(len(value))
                getattr(parts, key).append(value)
        for call in delta.get("tool_calls") or []:
            self._feed_tool_call(parts, call)
        token_ids = raw.get("token_ids")
        if token_ids:
            if not isinstance(token_ids, list):
                raise ValueError("choices[].token_ids must be a list")
            if parts.token_ids is None:
                parts.token_ids = []
            parts.token_ids.extend(token_ids)  # not list + list: quadratic over a stream
            limit = self._max_tokens
            if limit is not None and len(parts.token_ids) > limit:
                raise _TooLong(
                    f"the server sent {len(parts.token_ids)} token ids in one choice, more than "
                    f"its bound of {limit}"
                )
        if raw.get("finish_reason") is not None:
            parts.finish_reason = str(raw["finish_reason"])

    def _count(self, chars: int) -> None:
        self._chars += chars
        limit = self._max_chars
        if limit is not None and self._chars > limit:
            raise _TooLong(
                f"the streamed completion has {self._chars}+ characters, more than its bound "
                f"of {limit}"
            )

    def _feed_tool_call(self, parts: _ChoiceParts, call: JSON) -> None:
        if not isinstance(call, dict):
            raise ValueError("each tool-call delta must be an object")
        index = call.get("index")
        if not isinstance(index, int):
            # Some servers omit the index when there is one call per chunk: append a new one
            # when an id arrives, else extend the last.
            if call.get("id") or not parts.tool_calls:
                index = len(parts.tool_calls)
            else:
                index = max(parts.tool_calls)
        acc = parts.tool_calls.get(index)
        if acc is None:
            if len(parts.tool_calls) >= _MAX_CALL_INDEXES:
                raise ValueError(f"more than {_MAX_CALL_INDEXES} tool-call indexes in one choice")
            acc = parts.tool_calls[index] = _ToolCallParts()
        if call.get("id") and not acc.id:
            acc.id = str(call["id"])
        if call.get("type"):
            acc.type = str(call["type"])
        fn = call.get("function") or {}
        if not isinstance(fn, dict):
            raise ValueError("tool_calls[].function must be an object")
        name = fn.get("name")
        if name and name != acc.name:
            name = str(name)
            self._count(len(name))
            acc.name += name
        arguments = fn.get("arguments")
        if arguments:
            text = arguments if isinstance(arguments, str) else json.dumps(arguments)
            self._count(len(text))
            acc.arguments.append(text)

    def result(self) -> ChatCompletion:
        """The assembled completion (whatever has arrived so far)."""
        choices = []
        for index in sorted(self._choices):
            parts = self._choices[index]
            calls = [
                ToolCall(
                    id=acc.id or _new_call_id(),
                    type=acc.type,
                    function=FunctionCall(
                        name=_encodable(acc.name), arguments=_encodable("".join(acc.arguments))
                    ),
                )
                for _, acc in sorted(parts.tool_calls.items())
            ]
            choices.append(
                Choice(
                    index=index,
                    message=ChatMessage(
                        role=parts.role,
                        content=_encodable("".join(parts.content)) if parts.content else None,
                        tool_calls=calls or None,
                        reasoning_content=_encodable("".join(parts.reasoning_content)) or None,
                        reasoning=_encodable("".join(parts.reasoning)) or None,
                    ),
                    finish_reason=parts.finish_reason,
                    token_ids=parts.token_ids,
                )
            )
        return ChatCompletion(
            id=self.id,
            choices=choices,
            created=self.created,
            model=self.model,
            usage=self.usage,
            prompt_token_ids=self.prompt_token_ids,
        )


class _ServerErrorFrame(ValueError):
    pass


#: Most distinct tool-call indexes one streamed choice may open (each is a call to assemble,
#: even with nothing in it).
_MAX_CALL_INDEXES = 1024


class ChatStream:
    """An async iterator over the decoded chunks of a streaming chat completion.

    Each chunk is folded into :attr:`assembler`; :meth:`completion` gives the whole. A choice
    longer than ``options.max_completion_chars`` (or ``max_tokens x
    options.max_chars_per_token``) is a ``ServerProtocolError`` naming the option; so is one
    with more token ids than ``max_tokens`` (without it, than that character bound).
    """

    def __init__(
        self, reader: LineReader, options: HTTPOptions, *, max_tokens: int | None, n: int = 1
    ) -> None:
        self._chunks = SSEJSONReader(reader, max_event_bytes=options.max_event_bytes)
        self._done = False
        per_choice = options.max_completion_chars
        if max_tokens is not None:
            per_choice = min(per_choice, max_tokens * options.max_chars_per_token)
        # Without max_tokens, a choice's token ids are bounded as its characters are (millions,
        # past any context length): else a stream of ids alone grows until the deadline.
        self.assembler = ChatStreamAssembler(
            max_chars=per_choice * n,
            max_tokens=per_choice if max_tokens is None else max_tokens,
            max_choices=n,
        )
        self._bounds = (
            f"HTTPOptions.max_completion_chars={options.max_completion_chars}, or "
            f"max_tokens={max_tokens} x HTTPOptions.max_chars_per_token="
            f"{options.max_chars_per_token}, per choice"
        )
        self.endpoint = reader.endpoint

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> JSONObject:
        """Return the next decoded chunk.

        **Cancellation**: leaving the ``stream_chat`` block closes the connection.
        """
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._chunks.next()
        except Exception:  # a failed stream is over (a cancellation leaves it as it was)
            self._done = True
            raise
        if item is None:
            self._done = True
            if not self._chunks.saw_done and not self.assembler.finished:
                raise StreamInterruptedError(
                    "the stream ended without [DONE] or a finish_reason",
                    endpoint=self.endpoint,
                )
            raise StopAsyncIteration
        chunk, line = item
        try:
            self.assembler.feed(chunk)
        except _ServerErrorFrame as exc:
            self._done = True
            raise StreamInterruptedError(str(exc), endpoint=self.endpoint, line=line) from None
        except _TooLong as exc:
            self._done = True
            raise self._chunks.protocol_error(
                f"{exc} ({self._bounds}); a server that never ends its stream is refused. "
                "Raise the option if real completions are this long",
                line,
            ) from None
        except DECODE_FAILURES as exc:
            self._done = True
            raise self._chunks.protocol_error(f"unexpected chunk shape: {exc}", line) from None
        return chunk  # type: ignore[no-any-return]

    def completion(self) -> ChatCompletion:
        """The completion assembled from the chunks received so far."""
        return self.assembler.result()


# --------------------------------------------------------------------------------------------
# Client

_UNSUPPORTED_KWARGS = ("extra_headers", "extra_query", "timeout")


class ChatClient(ServerClient):
    """An OpenAI-compatible chat-completions client on the shared HTTP layer.

    Args:
        base_url: API root with its version prefix (``http://127.0.0.1:8000/v1``), or a
            :class:`~hermes_async.inference.pool.ServerPool` of them.
        stream: Default of ``stream``; streaming keeps the read timeout meaningful for long
            generations.
        **connection: For :class:`~hermes_async.inference._http.ServerConnection`.
    """

    path = "/chat/completions"

    def __init__(
        self,
        base_url: str | ConnectionSource,
        *,
        model: str = "default",
        stream: bool = False,
        **connection: Unpack[ConnectionKwargs],
    ) -> None:
        self.model = model
        self.stream_by_default = stream
        self.connection = connect(base_url, connection)

    def request_body(self, **kwargs: JSON) -> JSONObject:
        """The JSON body for ``kwargs``, ``extra_body`` merged last at the top level."""
        for name in _UNSUPPORTED_KWARGS:
            if name in kwargs:
                raise TypeError(
                    f"ChatClient.chat_completion does not support {name!r}; set headers and "
                    "deadlines on the client (HTTPOptions) instead"
                )
        extra = kwargs.pop("extra_body", None) or {}
        if not isinstance(extra, Mapping):
            raise TypeError(f"extra_body must be a mapping, got {type(extra).__name__}")
        body: JSONObject = {"model": self.model}
        body.update({k: v for k, v in kwargs.items() if v is not None})
        body.update(extra)
        body.setdefault("stream", self.stream_by_default)
        if body["stream"]:
            body.setdefault("stream_options", {"include_usage": True})
        return body

    async def chat_completion(self, **kwargs: JSON) -> ChatCompletion:
        """Send the OpenAI request fields in ``kwargs``; return the :class:`ChatCompletion`.

        **Cancellation**: the request or stream is closed; the server sees the disconnect.
        """
        body = self.request_body(**kwargs)
        attributes = request_attributes("chat", body)
        attributes["hermes_async.endpoint"] = self.endpoint
        with span(f"chat {body.get('model')}", attributes, kind="client") as traced:
            completion = await self._complete(body)
            if completion.usage is not None:
                traced.set("gen_ai.usage.input_tokens", completion.usage.prompt_tokens)
                traced.set("gen_ai.usage.output_tokens", completion.usage.completion_tokens)
            reasons = tuple(str(c.finish_reason) for c in completion.choices if c.finish_reason)
            traced.set("gen_ai.response.finish_reasons", reasons or None)
            traced.set("gen_ai.response.id", completion.id or None)
            return completion

    async def _complete(self, body: JSONObject) -> ChatCompletion:
        if not body["stream"]:
            # Decoded within the request: a body that is no chat completion counts against
            # its server in a pool.
            return await self.connection.post_json(self.path, body, ChatCompletion.from_dict)
        async with self._open_stream(body) as chunks:
            async for _ in chunks:
                pass
            return chunks.completion()

    @asynccontextmanager
    async def stream_chat(self, **kwargs: JSON) -> AsyncIterator[ChatStream]:
        """Stream a chat completion; yield a :class:`ChatStream` of decoded chunks.

        **Cancellation**: leaving the block closes the stream; the server sees the disconnect.
        """
        kwargs["stream"] = True
        async with self._open_stream(self.request_body(**kwargs)) as chunks:
            yield chunks

    @asynccontextmanager
    async def _open_stream(self, body: JSONObject) -> AsyncIterator[ChatStream]:
        max_tokens = _positive_int(body.get("max_completion_tokens", body.get("max_tokens")))
        async with self.connection.open_lines(self.path, body) as reader:
            yield ChatStream(
                reader,
                self.connection.options,
                max_tokens=max_tokens,
                n=_positive_int(body.get("n")) or 1,
            )


def _positive_int(value: JSON) -> int | None:
    """``value`` if it is an int >= 1, else ``None``."""
    return value if type(value) is int and value >= 1 else None
