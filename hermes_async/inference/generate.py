"""Token clients: prompt ids in, a stream of exact completion ids and logprobs out.

One protocol, :class:`TokenClient`, and three adapters: vLLM, Atropos and SGLang. Every chunk is
checked (one logprob per id, ids in the vocabulary, finite logprobs <= 0); a failure raises a
:class:`~hermes_async.inference.ModelServerError` that carries the tokens received before it.
Nothing is retried after the first token.
Wire formats and rules: docs/decisions/060-token-clients.md.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol, Self, TypeGuard, Unpack, runtime_checkable

import anyio

from hermes_async._checks import Requirement, check_value
from hermes_async._otel import request_attributes, span
from hermes_async.inference._body import decode_line
from hermes_async.inference._errors import (
    DECODE_FAILURES,
    ModelServerError,
    ServerProtocolError,
    StreamInterruptedError,
)
from hermes_async.inference._http import (
    Connection,
    ConnectionKwargs,
    ConnectionSource,
    ServerClient,
    connect,
    encode_body,
)
from hermes_async.inference._sse import SSEJSONReader
from hermes_async.inference._token_chunks import (
    AtroposDecoder,
    ChunkDecoder,
    ChunkError,
    SGLangDecoder,
    TokenChunk,
    VLLMDecoder,
    ids_outside,
)
from hermes_async.inference.request_extras import split_extras
from hermes_async.jsontypes import JSON, JSONObject

__all__ = (
    "AtroposGenerateClient",
    "Completion",
    "GenerateClient",
    "InvalidTokenDataError",
    "SGLangGenerateClient",
    "SamplingParams",
    "TokenClient",
    "TokenDelta",
    "TokenStream",
    "VLLMGenerateClient",
)


class InvalidTokenDataError(ServerProtocolError):
    """The server sent an id outside the vocabulary or a NaN, infinite or positive logprob.

    Raised before the values reach any trajectory; the rollout ends as an ``infra`` failure.
    """


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling parameters, translated by each adapter into its server's names.

    Attributes:
        max_tokens: Completion length limit (SGLang: ``max_new_tokens``).
        temperature: 1.0 samples from the model's distribution, what on-policy RL wants.
        top_k, seed: ``None`` leaves the server's default.
        extra: Server-specific keys (``min_p``, ``structured_outputs``...), placed per server
            by :mod:`~hermes_async.inference.request_extras`; a key the server does not accept
            raises ``UnsupportedExtraError``.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    extra: Mapping[str, JSON] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _SAMPLING_RULES:
            self.check(name, getattr(self, name))

    @staticmethod
    def check(name: str, value: object, *, owner: str = "SamplingParams") -> None:
        """Raise ``ConfigError`` unless ``value`` is valid for field ``name`` on any server.

        ``owner`` names the holder. The rules: docs/decisions/060-token-clients.md.
        """
        check_value(f"{owner}.{name}", value, _SAMPLING_RULES[name])


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_sequence(value: object) -> TypeGuard[Sequence[object]]:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


#: What :meth:`SamplingParams.check` accepts per field.
_SAMPLING_RULES: dict[str, Requirement] = {
    "max_tokens": Requirement(lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    "temperature": Requirement(
        lambda v: _is_number(v) and math.isfinite(v) and v >= 0, "a finite number >= 0"
    ),
    "top_p": Requirement(lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "top_k": Requirement(lambda v: _is_int(v) and v >= -1, "an int >= -1").or_none(),
    "seed": Requirement(_is_int, "an int").or_none(),
    "stop_token_ids": Requirement(
        lambda v: _is_sequence(v) and all(_is_int(i) and i >= 0 for i in v),
        "a tuple of ints >= 0",
    ),
    "stop": Requirement(
        lambda v: _is_sequence(v) and all(isinstance(i, str) for i in v),
        "a tuple of strings (a bare string would stop at each of its characters)",
    ),
}


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """New completion tokens from one chunk; ``finish_reason`` is set on the last."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"TokenDelta needs one logprob per token id, got {len(self.token_ids)} ids and "
                f"{len(self.logprobs)} logprobs"
            )


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole completion; ``chunks`` counts the chunks that carried tokens."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    chunks: int


@runtime_checkable
class TokenClient(Protocol):
    """What the Phase 2 agent loop needs from a token server."""

    def stream(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> AbstractAsyncContextManager[TokenStream]:
        """Start a generation; the context manager yields an async iterator of deltas."""
        ...

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> Completion:
        """Run a generation to its end. **Cancellation**: the connection is closed."""
        ...


# --------------------------------------------------------------------------------------------
# Sources: where the chunks come from. An SSE body (SSEJSONReader, read by the stream itself:
# the path of every streamed chunk), or one JSON body (below).

#: Decodes one JSON chunk (and the line it came from) into its tokens, or ``None`` for a chunk
#: without any (usage, keep-alive); raises the client error of a bad chunk.
_Decode = Callable[[JSON, str | None], TokenChunk | None]


class _JSONSource:
    def __init__(self, connection: Connection, path: str, body: JSONObject | bytes) -> None:
        self._connection = connection
        self._path = path
        self._body = body
        self._done = False

    async def next(self, decode: _Decode) -> TokenChunk | None:
        if self._done:
            return None
        self._done = True
        # Decoded within the request: a body the decoder refuses counts against its server.
        return await self._connection.post_json(
            self._path, self._body, lambda payload: decode(payload, None)
        )


def _line_text(line: str | bytes) -> str:
    """An event's line as an error shows it (raw lines come from ``ready_lines()``)."""
    return decode_line(line) if isinstance(line, bytes) else line


def _shown(payload: JSON) -> str:
    try:
        return json.dumps(payload)[:_SHOWN_CHARS]
    except DECODE_FAILURES:
        return "<a JSON value nested too deeply to show>"


_SHOWN_CHARS = 1000


class TokenStream:
    """An async iterator of :class:`TokenDelta` that keeps everything received so far.

    Iterate it inside its :meth:`TokenClient.stream` block. A server that sends more than
    ``max_tokens`` tokens is refused. ``first_token_at`` is ``anyio.current_time()`` then.
    """

    def __init__(
        self,
        source: SSEJSONReader | _JSONSource,
        decoder: ChunkDecoder,
        endpoint: str,
        *,
        max_tokens: int,
    ) -> None:
        self._sse = source if isinstance(source, SSEJSONReader) else None
        self._json = source if isinstance(source, _JSONSource) else None
        self._decoder = decoder
        self.endpoint = endpoint
        self._max_tokens = max_tokens
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason: str | None = None
        self.chunks = 0
        self.first_token_at: float | None = None
        self._ended = False
        # An error next_batch() found behind deltas it returned; raised by the next call.
        self._deferred: ModelServerError | None = None
        # A delta next_joined() took but did not join: returned by its next call.
        self._held: TokenDelta | None = None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> TokenDelta:
        """Return the next delta; a failure carries the ids yielded before it.

        **Cancellation**: the stream stays where it was; leaving ``stream()`` closes it.
        """
        if self._deferred is not None:
            exc, self._deferred = self._deferred, None
            raise exc
        if self._ended:
            raise StopAsyncIteration
        try:
            if self._sse is not None:  # inline: one coroutine frame less per chunk
                while (item := await self._sse.next()) is not None:
                    if (chunk := self._decode(item[0], item[1])) is not None:
                        break
                else:
                    chunk = None
            else:
                assert self._json is not None
                chunk = await self._json.next(self._decode)
        except ModelServerError as exc:
            self._ended = True
            raise exc.with_partial(self.token_ids, self.logprobs) from exc.__cause__
        if chunk is None:
            self._ended = True
            if self.finish_reason is None:
                raise StreamInterruptedError(
                    "the stream ended without a finish_reason; the server stopped early "
                    "or a proxy cut the response",
                    endpoint=self.endpoint,
                    token_ids=self.token_ids,
                    logprobs=self.logprobs,
                )
            raise StopAsyncIteration
        return self._accept(chunk)

    async def next_batch(self) -> list[TokenDelta] | None:
        """The next delta and those already received behind it; ``None`` at the end.

        The same deltas as iterating, in the same order: one wait for the network per batch.
        An error found in a later delta is raised by the next call, after the batch before it.

        **Cancellation**: as for iterating.
        """
        try:
            batch = [await self.__anext__()]
        except StopAsyncIteration:
            return None
        if self._sse is not None:
            batch += map(self._accept, self._received())
        return batch

    async def next_joined(self, id_limit: int) -> list[TokenDelta] | None:
        """:meth:`next_batch` as one delta (its ids and logprobs joined, its last
        ``finish_reason``) in a list; ``None`` at the end.

        A chunk with an id outside ``[0, id_limit)`` is not joined: it comes alone, in the next
        call, so a caller that refuses it has taken everything before it. Do not mix with
        :meth:`next_batch` or iterating on one stream.

        **Cancellation**: as for iterating.
        """
        held, self._held = self._held, None
        if held is not None:
            return [held]
        try:
            first = await self.__anext__()
        except StopAsyncIteration:
            return None
        if self._sse is None or ids_outside(first.token_ids, id_limit):
            return [first]
        ids: list[int] | None = None
        logprobs: list[float] = []
        finish = first.finish_reason
        for chunk in self._received():
            if ids_outside(chunk.token_ids, id_limit):
                self._held = self._accept(chunk)
                break
            self._record(chunk)
            if ids is None:
                ids, logprobs = list(first.token_ids), list(first.logprobs)
            ids += chunk.token_ids
            logprobs += chunk.logprobs
            if chunk.finish_reason is not None:
                finish = chunk.finish_reason
        if ids is None:
            return [first]
        return [TokenDelta(tuple(ids), tuple(logprobs), finish)]

    def _received(self) -> Iterator[TokenChunk]:
        """The chunks already received, in order, decoded and checked (no waiting): runs of
        one-line events without a call per event, anything else through ``next_ready()``. A
        caller that stops early leaves the rest buffered. An error ends the stream; the next
        call raises it, after the chunks before it.
        """
        sse = self._sse
        assert sse is not None
        try:
            while not self._ended:
                for raw in sse.ready_lines():
                    if (chunk := self._decode(sse.decoded_line(raw), raw)) is not None:
                        yield chunk
                if self._ended or (item := sse.next_ready()) is None:
                    return
                if (chunk := self._decode(*item)) is not None:
                    yield chunk
        except ModelServerError as exc:
            self._ended = True
            self._deferred = exc.with_partial(self.token_ids, self.logprobs)
            self._deferred.__cause__ = exc.__cause__

    def _accept(self, chunk: TokenChunk) -> TokenDelta:
        """Record a decoded chunk; its delta."""
        delta = TokenDelta(*chunk)
        self._record(chunk)
        return delta

    def _record(self, chunk: TokenChunk) -> None:
        """Record a decoded chunk."""
        if self.first_token_at is None and chunk.token_ids:
            self.first_token_at = anyio.current_time()
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        self.chunks += 1

    def _decode(self, payload: JSON, line: str | bytes | None) -> TokenChunk | None:
        """One chunk's tokens, checked against the stream so far."""
        try:
            chunk = self._decoder.feed(payload)
            if chunk is None or not chunk.token_ids:
                return chunk
            if self.finish_reason is not None:
                raise ChunkError(
                    f"chunk carries {len(chunk.token_ids)} tokens after finish_reason "
                    f"{self.finish_reason!r}"
                )
            if len(self.token_ids) + len(chunk.token_ids) > self._max_tokens:
                raise ChunkError(
                    f"the server sent {len(self.token_ids) + len(chunk.token_ids)} tokens for "
                    f"max_tokens={self._max_tokens}; the tokens past it are refused (the "
                    f"{len(self.token_ids)} before this chunk are kept on this error)"
                )
            return chunk
        except ChunkError as exc:
            cls: type[ModelServerError]
            if exc.invalid_tokens:
                cls = InvalidTokenDataError
            elif exc.server_error:
                cls = StreamInterruptedError
            else:
                cls = ServerProtocolError
            message = str(exc)
        except DECODE_FAILURES as exc:  # a hostile value the decoder did not foresee
            cls, message = ServerProtocolError, f"undecodable chunk: {exc}"
        self._ended = True
        raise cls(
            message,
            endpoint=self.endpoint,
            line=_shown(payload) if line is None else _line_text(line),
            token_ids=self.token_ids,
            logprobs=self.logprobs,
        ) from None

    def completion(self) -> Completion:
        """The completion so far (call after iteration ended)."""
        if self.finish_reason is None:
            raise RuntimeError("the stream has not finished; iterate it to the end first")
        return Completion(
            tuple(self.token_ids), tuple(self.logprobs), self.finish_reason, self.chunks
        )


# --------------------------------------------------------------------------------------------
# Clients


class GenerateClient(ServerClient, ABC):
    """Connection handling plus a protocol adapter; the base of the token clients.

    Args:
        base_url: The server's URL (``user:password@`` in it is Basic authentication, never
            shown) or a :class:`~hermes_async.inference.pool.ServerPool`.
        vocab_size: ``len(tokenizer)``; an id outside ``[0, vocab_size)`` is refused.
            ``None``: ids need only fit 32 bits.
        **connection: For :class:`~hermes_async.inference._http.ServerConnection`.
    """

    #: Path of the endpoint, relative to the base URL.
    path: str = ""
    #: Which table of :mod:`~hermes_async.inference.request_extras` checks and places
    #: ``SamplingParams.extra`` for this server.
    extras_kind: str = "vllm"

    def __init__(
        self,
        base_url: str | ConnectionSource,
        *,
        vocab_size: int | None = None,
        **connection: Unpack[ConnectionKwargs],
    ) -> None:
        if vocab_size is not None and vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1 or None, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self.connection = connect(base_url, connection, transform=self._base_url)

    def check_sampling(self, params: SamplingParams) -> None:
        """Raise ``UnsupportedExtraError`` for an extra key this server does not accept."""
        split_extras(self.extras_kind, params.extra)

    def _base_url(self, base_url: str) -> str:
        return base_url

    def _flat_tail(self, body: JSONObject, params: SamplingParams) -> JSONObject:
        """Sampling fields, ``seed`` and extras at the top level of a flat body."""
        body.update(_sampling_common(params))
        if params.seed is not None:
            body["seed"] = params.seed
        _, top = split_extras(self.extras_kind, params.extra)
        body.update(top)
        return body

    @abstractmethod
    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> JSONObject:
        """The JSON body this server expects (pure; handy to inspect in tests)."""

    @abstractmethod
    def _decoder(self) -> ChunkDecoder: ...

    streaming: bool = True

    @asynccontextmanager
    async def stream(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> AsyncIterator[TokenStream]:
        """Start a generation and yield its :class:`TokenStream`.

        A streaming server gets the request (and its retries) on entering the block.

        **Cancellation**: leaving the block closes the response, so the server stops
        generating; the close is shielded and bounded.
        """
        params = params or SamplingParams()
        max_tokens = params.max_tokens
        body = self.request_body(prompt_ids, params)
        sampling = body.get("sampling_params")
        attributes = request_attributes(
            "text_completion", body, sampling if isinstance(sampling, dict) else None
        )
        attributes["gen_ai.usage.input_tokens"] = len(prompt_ids)
        # Encoded before waiting for a slot: ids cost ~45 bytes each as objects, ~7 as JSON.
        payload = encode_body(body)
        del body, sampling
        attributes["hermes_async.endpoint"] = self.endpoint
        # Not the current span: the caller's work during the stream (early-dispatched tools)
        # belongs to its turn, not to the generation.
        with span("text_completion", attributes, kind="client", current=False) as traced:
            start = anyio.current_time()
            stream: TokenStream | None = None
            try:
                if not self.streaming:
                    stream = TokenStream(
                        _JSONSource(self.connection, self.path, payload),
                        self._decoder(),
                        self.endpoint,
                        max_tokens=max_tokens,
                    )
                    yield stream
                    return
                async with self.connection.open_lines(self.path, payload) as reader:
                    chunks = SSEJSONReader(
                        reader, max_event_bytes=self.connection.options.max_event_bytes
                    )
                    stream = TokenStream(
                        chunks, self._decoder(), self.endpoint, max_tokens=max_tokens
                    )
                    yield stream
            finally:
                if stream is not None:
                    traced.set("gen_ai.usage.output_tokens", len(stream.token_ids))
                    if stream.finish_reason is not None:
                        traced.set("gen_ai.response.finish_reasons", (stream.finish_reason,))
                    if stream.first_token_at is not None:
                        traced.set(
                            "hermes_async.time_to_first_token", stream.first_token_at - start
                        )

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> Completion:
        """Run a generation to its end. **Cancellation**: the connection is closed."""
        async with self.stream(prompt_ids, params) as deltas:
            async for _ in deltas:
                pass
            return deltas.completion()


def _sampling_common(params: SamplingParams) -> JSONObject:
    out: JSONObject = {"temperature": params.temperature, "top_p": params.top_p}
    if params.top_k is not None:
        out["top_k"] = params.top_k
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    return out


class VLLMGenerateClient(GenerateClient):
    """vLLM's ``POST /inference/v1/generate`` (needs ``--enable-scale-out``).

    Args:
        base_url: As for :class:`GenerateClient`.
        stream: ``True``: Server-Sent Events, a delta per chunk (early tool dispatch, time to
            first token, the tokens before a stall kept). ``False``: one JSON response per
            request, ~7% less client CPU per rollout at N=1,000 (``bench/README.md``); the
            read timeout then covers the whole generation.
        vocab_size: As for :class:`GenerateClient`.
        **connection: As for :class:`GenerateClient`.
    """

    path = "/inference/v1/generate"

    def __init__(
        self,
        base_url: str | ConnectionSource,
        *,
        stream: bool = True,
        vocab_size: int | None = None,
        **connection: Unpack[ConnectionKwargs],
    ) -> None:
        super().__init__(base_url, vocab_size=vocab_size, **connection)
        self.streaming = stream

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> JSONObject:
        sampling = _sampling_common(params)
        sampling["max_tokens"] = params.max_tokens
        sampling["logprobs"] = 0
        if params.seed is not None:
            sampling["seed"] = params.seed
        extra, top = split_extras(self.extras_kind, params.extra)
        sampling.update(extra)
        return {
            "token_ids": list(prompt_ids),
            "sampling_params": sampling,
            "stream": self.streaming,
            **top,
        }

    def _decoder(self) -> ChunkDecoder:
        return VLLMDecoder(vocab_size=self.vocab_size)


class AtroposGenerateClient(GenerateClient):
    """The Atropos reference server's ``POST /generate``: one delta, not streamed.

    A ``base_url`` ending in ``/v1`` (as atroposlib configs write it) is stripped.
    """

    path = "/generate"
    streaming = False
    extras_kind = "atropos"

    def _base_url(self, base_url: str) -> str:
        return base_url.rstrip("/").removesuffix("/v1")

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> JSONObject:
        body: JSONObject = {
            "prompt": {"prompt_token_ids": list(prompt_ids)},
            "logprobs": 0,
            "n": 1,
            "max_tokens": params.max_tokens,
        }
        return self._flat_tail(body, params)

    def _decoder(self) -> ChunkDecoder:
        return AtroposDecoder(vocab_size=self.vocab_size)


class SGLangGenerateClient(GenerateClient):
    """SGLang's ``POST /generate`` with ``input_ids``, streamed.

    SGLang streams cumulative chunks; pass ``incremental=True`` for a server started with
    ``--incremental-streaming-output``.
    """

    path = "/generate"
    extras_kind = "sglang"

    def __init__(
        self,
        base_url: str | ConnectionSource,
        *,
        incremental: bool = False,
        vocab_size: int | None = None,
        **connection: Unpack[ConnectionKwargs],
    ) -> None:
        super().__init__(base_url, vocab_size=vocab_size, **connection)
        self.incremental = incremental

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> JSONObject:
        sampling = _sampling_common(params)
        sampling["max_new_tokens"] = params.max_tokens
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        extra, top = split_extras(self.extras_kind, params.extra)
        sampling.update(extra)
        return {
            "input_ids": list(prompt_ids),
            "sampling_params": sampling,
            "return_logprob": True,
            "logprob_start_len": -1,
            "stream": True,
            **top,
        }

    def _decoder(self) -> ChunkDecoder:
        return SGLangDecoder(incremental=self.incremental, vocab_size=self.vocab_size)
