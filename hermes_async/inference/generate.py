"""Phase 2 token clients: prompt ids in, a stream of exact completion ids and logprobs out.

Why one module of this size: one concept, the token client — its protocol, the values it takes
and gives (:class:`SamplingParams` with the rules every server accepts, :class:`TokenDelta`,
:class:`Completion`) and one base class whose three adapters differ only in their request body
and chunk shapes.

One interface, :class:`TokenClient`, three adapters for the token endpoints servers offer:

* :class:`VLLMGenerateClient`: vLLM ``POST /inference/v1/generate``, SSE, each chunk
  carries the new ids;
* :class:`AtroposGenerateClient`: the Atropos reference server's ``POST /generate`` (base URL
  minus ``/v1``), one JSON response;
* :class:`SGLangGenerateClient`: SGLang ``POST /generate``, SSE, cumulative chunks (default)
  or incremental ones.

Usage::

    async with VLLMGenerateClient("http://127.0.0.1:8000", limiter=limits.model_requests) as c:
        async with c.stream(prompt_ids, SamplingParams(max_tokens=512)) as deltas:
            async for delta in deltas:          # TokenDelta(token_ids, logprobs, finish_reason)
                ...
        completion = await c.generate(prompt_ids)   # the same, collected

Guarantees, per chunk: ``len(token_ids) == len(logprobs)`` (a mismatch is a
:class:`~hermes_async.inference.ServerProtocolError`, never padded); when the server names
the id of each logprob entry, it must equal the id it sits beside; no tokens after a
``finish_reason``; every id in ``[0, vocab_size)`` (pass the tokenizer's ``len()`` as
``vocab_size``; without it, ids must still fit 32 bits, ``[0, 2**31)``) and every logprob a
finite number ``<= 0`` — else :class:`InvalidTokenDataError`, naming the server (credentials
redacted) and the offending value and line. Concatenating the deltas gives exactly the ids the server sent. A stream
that ends without a ``finish_reason`` is an error (:class:`StreamInterruptedError`), not a
short completion.

What is returned and what is raised: a completed generation is returned whatever its
``finish_reason`` (``"stop"``, ``"length"``, ``"abort"``...). Every transport or format failure
raises a :class:`~hermes_async.inference.ModelServerError` that carries the tokens received
before it (``exc.token_ids`` / ``exc.logprobs``). Retries (connect errors, 429, 5xx) happen
before the first token; once a token was handed out nothing is retried.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol, Self, TypeGuard, Unpack, runtime_checkable

import anyio

from hermes_async._checks import Requirement, check_value
from hermes_async._otel import request_attributes, span
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
    """The server sent token ids or logprobs no trainer may use.

    An id outside ``[0, vocab_size)`` (or beyond 32 bits), a NaN, infinite or positive
    logprob: the wrong model behind the URL, a tokenizer that does not match the model, a
    numerics bug. Raised before the values reach any trajectory; the rollout ends as an
    ``infra`` failure. ``str()`` names the endpoint, the value and the offending line.
    """


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling parameters, translated by each adapter into its server's names.

    Attributes:
        max_tokens: Completion length limit (SGLang: ``max_new_tokens``).
        temperature: Sampling temperature (1.0: sample from the model's distribution, what
            on-policy RL wants).
        top_p: Nucleus sampling mass.
        top_k: Top-k cut-off; ``None`` leaves the server default.
        seed: Per-request seed; ``None`` leaves the server default.
        stop_token_ids: Ids that end the completion (typically the tokenizer's end of turn).
        stop: Strings that end the completion.
        extra: Server-specific request extras (e.g. vLLM ``{"structured_outputs": {"regex":
            ...}}``, ``min_p``, ``repetition_penalty``), checked and placed per server by
            :mod:`~hermes_async.inference.request_extras` (``structured_outputs`` is translated
            for SGLang); a key the server does not accept raises ``UnsupportedExtraError``
            instead of being dropped.
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
        """Raise :class:`~hermes_async.errors.ConfigError` (a ``ValueError``) unless ``value``
        is a valid ``name`` field; ``owner`` names the holder in the message
        (``AgentOptions`` checks its ``temperature`` and ``max_tokens`` with the same rules).

        The rules are what every supported server accepts: ``max_tokens`` an int >= 1;
        ``temperature`` a finite number >= 0; ``top_p`` in (0, 1]; ``top_k`` ``None`` or an int
        >= -1 (-1 and 0: no cut-off); ``seed`` ``None`` or an int; ``stop_token_ids`` a sequence
        of ints >= 0 and ``stop`` a sequence of strings (a bare string is refused: it would
        stop on each of its characters). Without this a bad value reached the server, which
        refused every request of every rollout with a 400.
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
    """New completion tokens from one chunk of a stream.

    Attributes:
        token_ids: The ids, exactly as the server sampled them.
        logprobs: The sampled tokens' logprobs, aligned one to one with ``token_ids``.
        finish_reason: ``None`` until the last chunk, then ``"stop"``, ``"length"``, ...
    """

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
    """A whole completion: the concatenated deltas of one stream.

    Attributes:
        token_ids: Every completion id, in order.
        logprobs: Their logprobs.
        finish_reason: Why generation stopped.
        chunks: How many chunks carried tokens (1 for non-streaming servers).
    """

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
        """Run a generation to its end and return it whole.

        **Cancellation**: the request is abandoned and its connection closed.
        """
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
        """The body's chunk, decoded; ``None`` after it."""
        if self._done:
            return None
        self._done = True
        # Decoded within the request: a body the decoder refuses counts against its server.
        return await self._connection.post_json(
            self._path, self._body, lambda payload: decode(payload, None)
        )


def _shown(payload: JSON) -> str:
    """``payload`` as JSON text for an error message (a value too deep to encode: a note)."""
    try:
        return json.dumps(payload)[:_SHOWN_CHARS]
    except DECODE_FAILURES:
        return "<a JSON value nested too deeply to show>"


_SHOWN_CHARS = 1000


class TokenStream:
    """An async iterator of :class:`TokenDelta`; also keeps everything received so far.

    Obtained from :meth:`TokenClient.stream`; iterate it inside that ``async with`` block.

    Args:
        source: Where the chunks come from.
        decoder: The server's chunk decoder.
        endpoint: ``METHOD URL`` of the request, for errors.
        max_tokens: The request's ``max_tokens``: a server that sends more is refused (a
            :class:`~hermes_async.inference.ServerProtocolError`), so the tokens kept are never
            more than were asked for.

    Attributes:
        endpoint: ``METHOD URL`` of the request.
        token_ids: Every id yielded so far.
        logprobs: Their logprobs.
        finish_reason: Set once the server reported it.
        chunks: How many deltas were yielded.
        first_token_at: Clock time (``anyio.current_time()``) of the first token, if any.
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

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> TokenDelta:
        """Return the next delta.

        Raises:
            StopAsyncIteration: After the last delta.
            ModelServerError: A failure; ``exc.token_ids`` holds the ids yielded before it.

        **Cancellation**: the stream is left where it was; leaving the ``stream()`` block
        closes the connection.
        """
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
        delta = TokenDelta(*chunk)
        if self.first_token_at is None and delta.token_ids:
            self.first_token_at = anyio.current_time()
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        self.chunks += 1
        return delta

    def _decode(self, payload: JSON, line: str | None) -> TokenChunk | None:
        """One chunk's tokens, checked against the stream so far.

        Raises:
            ModelServerError: The chunk is refused (:class:`InvalidTokenDataError` for ids or
                logprobs no trainer may use, :class:`StreamInterruptedError` for an error
                frame, :class:`ServerProtocolError` for anything else).
        """
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
            line=_shown(payload) if line is None else line,
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
    """Shared shape of the token clients: connection handling plus a protocol adapter.

    Args:
        base_url: The server's base URL (``user:password@`` in it: Basic authentication,
            never shown in errors or logs), or a
            :class:`~hermes_async.inference.pool.ServerPool` of several servers (which then
            owns the connection options).
        **connection: Passed to the :class:`~hermes_async.inference._http.ServerConnection`:
            ``options`` (deadlines, pool size, retry policy, line cap: :class:`HTTPOptions`),
            ``limiter`` (gate for concurrent requests, e.g. ``Limits().model_requests``; the
            pool is sized to at least its total), ``transport`` (an httpx transport to use
            instead of the network: tests, ASGI apps), ``api_key`` (sent as a bearer token)
            and ``rng`` (random source for retry jitter).
        vocab_size: The model's vocabulary size (``len(tokenizer)``): an id outside
            ``[0, vocab_size)`` is an :class:`InvalidTokenDataError`. ``None``: ids are only
            checked to be non-negative and to fit 32 bits.

    Raises:
        ValueError: ``vocab_size`` < 1.
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
        """Raise if this server cannot take ``params`` (an extra key it does not accept).

        Raises:
            UnsupportedExtraError: Names the key and what to use instead (see
                :func:`~hermes_async.inference.request_extras.split_extras`).
        """
        split_extras(self.extras_kind, params.extra)

    def _base_url(self, base_url: str) -> str:
        return base_url

    def _flat_tail(self, body: JSONObject, params: SamplingParams) -> JSONObject:
        """The sampling fields, ``seed`` and the extras at the top level of a flat body
        (Atropos, completions)."""
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
        """Start a generation; yield a :class:`TokenStream` of :class:`TokenDelta`.

        For a streaming server the request is sent (and retried) on entering the block.

        Raises:
            ModelServerError: On entry (the request failed) or while iterating.

        **Cancellation**: leaving the block, by cancellation or otherwise, closes the HTTP
        response, so the server sees the disconnect and stops generating; the close is
        shielded and bounded.
        """
        params = params or SamplingParams()
        max_tokens = params.max_tokens
        body = self.request_body(prompt_ids, params)
        sampling = body.get("sampling_params")
        attributes = request_attributes(
            "text_completion", body, sampling if isinstance(sampling, dict) else None
        )
        attributes["gen_ai.usage.input_tokens"] = len(prompt_ids)
        # Encoded now, before the request waits for a slot: thousands of rollouts wait there at
        # once, and the body's list of ids costs ~45 bytes a token as Python objects (its JSON
        # ~7).
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
        """Run a generation to its end and return the :class:`Completion`.

        Raises:
            ModelServerError: The generation failed (partial tokens on the error).

        **Cancellation**: the connection is closed; nothing is returned.
        """
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
    """vLLM's tokens-in/tokens-out endpoint, ``POST /inference/v1/generate``, streamed as SSE.

    The server must run with ``--enable-scale-out`` (it answers 403 otherwise; not retried).
    Wire format::

        > {"token_ids": [151644, ...], "sampling_params": {"max_tokens": 256, "logprobs": 0,
        >  ...}, "stream": true}
        < data: {"choices": [{"token_ids": [9707, 11], "finish_reason": null,
        <        "logprobs": {"content": [{"token_id": 9707, "logprob": -0.3}, ...]}}]}
        < data: [DONE]
    """

    path = "/inference/v1/generate"

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> JSONObject:
        sampling = _sampling_common(params)
        sampling["max_tokens"] = params.max_tokens
        sampling["logprobs"] = 0
        if params.seed is not None:
            sampling["seed"] = params.seed
        extra, top = split_extras(self.extras_kind, params.extra)
        sampling.update(extra)
        return {"token_ids": list(prompt_ids), "sampling_params": sampling, "stream": True, **top}

    def _decoder(self) -> ChunkDecoder:
        return VLLMDecoder(vocab_size=self.vocab_size)


class AtroposGenerateClient(GenerateClient):
    """The Atropos reference server's ``POST /generate`` (``example_trainer/vllm_api_server.py``).

    Non-streaming (its stream mode returns text only): the whole completion arrives as one
    delta. ``base_url`` may end in ``/v1`` (as atroposlib configs do); it is stripped.
    Wire format::

        > {"prompt": {"prompt_token_ids": [...]}, "logprobs": 0, "n": 1, "max_tokens": 256, ...}
        < {"token_ids": [[9707, 11]], "logprobs": [[{"9707": -0.3}, {"11": -1.2}]],
        <  "finish_reasons": ["stop"], "text": [...], ...}
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
    """SGLang's native ``POST /generate`` with ``input_ids``, streamed as SSE.

    SGLang streams **cumulative** chunks by default (each carries all ids so far); a server
    started with ``--incremental-streaming-output`` sends deltas: pass ``incremental=True``.
    A cumulative chunk that does not extend the ids seen so far is a protocol error (the usual
    sign of the wrong mode). Wire format::

        > {"input_ids": [...], "sampling_params": {"max_new_tokens": 256, ...},
        >  "return_logprob": true, "logprob_start_len": -1, "stream": true}
        < data: {"output_ids": [9707, 11], "meta_info": {"finish_reason": null,
        <        "output_token_logprobs": [[-0.3, 9707, null], [-1.2, 11, null]]}}
        < data: [DONE]

    Args:
        base_url: The server's base URL.
        incremental: The server sends deltas instead of cumulative chunks.
        vocab_size: As for :class:`GenerateClient`.
        **connection: As for :class:`GenerateClient`.
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
