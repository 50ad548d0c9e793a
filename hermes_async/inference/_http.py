"""The HTTP layer the model-server clients share: one pool, a limiter, deadlines, retries.

One :class:`ServerConnection` per server. Its job, and nothing else:

* one connection pool (the lean HTTP/1.1 client of :mod:`._wire` over the network, httpx for
  an injected transport or behind a proxy) at least as large as the request limiter, so a
  request that got a limiter slot never waits for a connection;
* requests gated by a :class:`~hermes_async.limits.NamedLimiter` (``Limits().model_requests``).
  The slot is held for the whole request, retries and back-off included: when a server answers
  429, fewer concurrent requests is exactly what it asked for;
* three deadlines: connect, read (the longest silence between two chunks) and the overall
  request deadline (retries and streaming included);
* retries with exponential back-off and jitter on connection failures, 429 (``Retry-After``
  honoured) and 5xx. Never on other 4xx, never once a response body has started. A kept-alive
  connection found closed when reused is retried at once on a new one (no back-off, no
  attempt used: it says nothing about the server);
* translation of transport errors into :mod:`hermes_async.inference._errors` at this boundary.

Decisions (delays, ``Retry-After`` parsing) are pure functions; the async shell only sleeps,
sends and reads.
"""

from __future__ import annotations

import codecs
import collections
import email.utils
import functools
import json
import logging
import math
import random
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, Self

import anyio
import httpx

from hermes_async.inference import _wire
from hermes_async.inference._errors import (
    ModelServerError,
    ServerConnectError,
    ServerProtocolError,
    ServerStatusError,
    ServerTimeoutError,
    StreamInterruptedError,
)
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.limits import DEFAULT_LIMITS, NamedLimiter

__all__ = [
    "CLOSE_GRACE_SECONDS",
    "HTTPOptions",
    "LineReader",
    "RetryPolicy",
    "ServerConnection",
    "parse_retry_after",
]

logger = logging.getLogger("hermes_async.inference")

#: Bound on closing a response (and draining its iterator chain) during cleanup.
CLOSE_GRACE_SECONDS = 2.0

_BODY_EXCERPT_CHARS = 500


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how long to wait before retrying a failed request.

    Retried: connection failures (refused, reset, closed before any response), HTTP 429 and
    HTTP 5xx. Never retried: other 4xx, timeouts, and anything once a response body started
    (tokens may already have been handed out).

    Attributes:
        max_attempts: Total attempts, the first included (4: three retries, ~1.75 s of back-off
            with the defaults, enough to ride out a server restart's connection refusals).
        initial_backoff_seconds: Delay before the first retry.
        max_backoff_seconds: Cap on one delay.
        multiplier: Growth of the delay per attempt.
        jitter: Fraction of each delay that is random (0.5: a delay ``d`` becomes uniform in
            ``[d/2, d]``), so clients that failed together do not retry together.
        max_retry_after_seconds: A ``Retry-After`` longer than this is not waited for; the
            error is raised at once (a server asking for minutes is not coming back soon).
    """

    max_attempts: int = 4
    initial_backoff_seconds: float = 0.25
    max_backoff_seconds: float = 8.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_retry_after_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts!r}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be within [0, 1], got {self.jitter!r}")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Delay after failed attempt number ``attempt`` (1-based), jitter applied."""
        delay = min(
            self.max_backoff_seconds,
            self.initial_backoff_seconds * self.multiplier ** (attempt - 1),
        )
        return delay * (1.0 - self.jitter * rng.random())

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Delay before the next attempt: ``Retry-After`` when the server gave one (plus a
        little jitter), else the exponential back-off."""
        if retry_after is not None:
            return retry_after + self.initial_backoff_seconds * self.jitter * rng.random()
        return self.backoff(attempt, rng)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date).

    Fractional seconds are accepted (not in the RFC, but harmless and handy in tests). Returns
    ``None`` when the header is absent or unreadable, 0 for a date in the past.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        current = time.time() if now is None else now
        return max(0.0, when.timestamp() - current)
    if seconds != seconds or seconds < 0:  # NaN or negative
        return None
    return seconds


@dataclass(frozen=True, slots=True)
class HTTPOptions:
    """Connection, deadline and retry settings for one model server.

    Attributes:
        connect_timeout_seconds: TCP (+TLS) connect deadline per attempt.
        read_timeout_seconds: Longest silence allowed between two chunks of a response, and
            before the response headers. 300 s: a loaded vLLM can queue a request for minutes
            before its first token.
        request_timeout_seconds: Overall deadline per request, retries and streaming included.
            1200 s is atroposlib's ``ServerBaseline.timeout``.
        max_connections: Pool size; raised to the limiter's total if that is larger.
        retry: The retry policy.
        headers: Extra headers sent with every request (never logged).
        ssl_context: TLS settings for ``https`` servers (e.g. a private CA:
            ``ssl.create_default_context(cafile=...)``). Default: the system's trust store.
    """

    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 300.0
    request_timeout_seconds: float = 1200.0
    max_connections: int = DEFAULT_LIMITS["model_requests"]
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    headers: Mapping[str, str] = field(default_factory=dict)
    ssl_context: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        for name in ("connect_timeout_seconds", "read_timeout_seconds", "request_timeout_seconds"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"HTTPOptions.{name} must be > 0 seconds, got {value!r}")
        if self.max_connections < 1:
            raise ValueError(
                f"HTTPOptions.max_connections must be >= 1, got {self.max_connections!r}"
            )


@functools.cache
def _shared_ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context()


#: Seconds an idle pooled connection is kept (below servers' usual 5 s keep-alive timeout).
KEEPALIVE_EXPIRY_SECONDS = 2.0

_JSON_HEADERS: Mapping[str, str] = {"Content-Type": "application/json"}

#: Immediate retries per request after a kept-alive connection turned out closed.
_MAX_STALE_RETRIES = 8


class _Response(Protocol):
    """What the connection needs of a response, from either transport."""

    status_code: int
    reason_phrase: str

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def receive_some(self, timeout: float = math.inf) -> bytes | None: ...

    async def aclose(self) -> None: ...


def _proxy_applies(base_url: str) -> bool:
    """True if the environment routes ``base_url`` through an HTTP proxy (httpx's rules)."""
    proxies = urllib.request.getproxies_environment()
    parts = urllib.parse.urlsplit(base_url)
    if not (proxies.get(parts.scheme.lower()) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.netloc)


class ServerConnection:
    """One model server: base URL, connections, limiter, deadlines and retries.

    Over the network the connection uses the lean HTTP/1.1 client of
    :mod:`hermes_async.inference._wire` (one keep-alive pool per server). With an injected
    ``transport``, or when an HTTP proxy from the environment applies to the server's host, it
    uses httpx instead. Either way the behaviour (deadlines, retries, errors) is the same.

    Use as an async context manager; requests outside it raise ``RuntimeError``.

    Args:
        base_url: The server's base URL (``http://host:port``).
        options: Deadlines, pool size and retry policy.
        limiter: Gate for concurrent requests (e.g. ``limits.model_requests``). Default: a
            private limiter sized like the pool.
        transport: An httpx transport to use instead of the network (``httpx.MockTransport``,
            :func:`hermes_async.testing.http.open_asgi_transport`).
        api_key: Sent as ``Authorization: Bearer ...`` when given.
        rng: Random source for back-off jitter (seed it in tests).
    """

    def __init__(
        self,
        base_url: str,
        *,
        options: HTTPOptions | None = None,
        limiter: NamedLimiter | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.options = options or HTTPOptions()
        self.limiter = limiter or NamedLimiter("model_requests", self.options.max_connections)
        self._rng = rng or random.Random()
        pool = max(self.options.max_connections, self.limiter.total)
        headers = dict(self.options.headers)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._headers = headers
        self._pool_size = pool
        #: "wire" (the lean client) or "httpx".
        self.transport_kind = (
            "wire" if transport is None and not _proxy_applies(self.base_url) else "httpx"
        )
        if self.transport_kind == "wire":
            _wire.check_base_url(base_url)
            _wire.check_headers(headers)
        self._client_kwargs: dict[str, object] = {
            "base_url": self.base_url,
            "headers": headers,
            "timeout": httpx.Timeout(
                connect=self.options.connect_timeout_seconds,
                read=self.options.read_timeout_seconds,
                write=self.options.read_timeout_seconds,
                pool=self.options.request_timeout_seconds,
            ),
            # Idle connections are dropped after 2 s, before common servers' 5 s keep-alive
            # timeout (uvicorn, hypercorn), so a reused connection is rarely a closed one.
            "limits": httpx.Limits(
                max_connections=pool,
                max_keepalive_connections=pool,
                keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
            ),
            "transport": transport,
            "verify": self.options.ssl_context or True,
        }
        self._client: httpx.AsyncClient | None = None
        self._wire: _wire.WirePool | None = None
        self._closed = False

    def _ssl_context_factory(self) -> Callable[[], ssl.SSLContext]:
        context = self.options.ssl_context
        if context is None:
            return _shared_ssl_context  # built once per process (~20 ms), on first use
        return lambda: context

    def url(self, path: str) -> str:
        """Absolute URL of ``path`` on this server."""
        return f"{self.base_url}/{path.lstrip('/')}"

    async def __aenter__(self) -> Self:
        """Open the connection pool.

        **Cancellation**: nothing is opened before the first await, so nothing leaks.
        """
        if self._closed:
            raise RuntimeError("cannot reopen a closed model-server client; create a new one")
        if self._client is None and self._wire is None:
            if self.transport_kind == "wire":
                self._wire = _wire.WirePool(
                    self.base_url,
                    connect_timeout=self.options.connect_timeout_seconds,
                    read_timeout=self.options.read_timeout_seconds,
                    keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
                    max_idle=self._pool_size,
                    headers={**self._headers, **_JSON_HEADERS},
                    ssl_context=self._ssl_context_factory(),
                )
            else:
                self._client = httpx.AsyncClient(**self._client_kwargs)  # type: ignore[arg-type]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the connection pool.

        **Cancellation**: the close is shielded and bounded.
        """
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pool (idempotent).

        **Cancellation**: closing runs shielded, bounded by :data:`CLOSE_GRACE_SECONDS`.
        """
        self._closed = True
        client, self._client = self._client, None
        pool, self._wire = self._wire, None
        with anyio.move_on_after(CLOSE_GRACE_SECONDS, shield=True):
            if client is not None:
                await client.aclose()
            if pool is not None:
                await pool.aclose()

    def _require_open(self) -> None:
        if self._client is None and self._wire is None:
            state = "closed" if self._closed else "not open"
            raise RuntimeError(
                f"model-server client for {self.base_url} is {state}; "
                "use it inside `async with client:`"
            )

    # ---------------------------------------------------------------- public requests

    async def post_json(self, path: str, body: JSONObject) -> JSON:
        """POST ``body`` as JSON and return the decoded JSON response (with retries).

        Raises:
            ModelServerError: A subclass describing the failure.

        **Cancellation**: the request is abandoned and its connection closed; the limiter
        slot is released.
        """
        endpoint = f"POST {self.url(path)}"
        deadline = anyio.current_time() + self.options.request_timeout_seconds
        async with self.limiter:
            response, attempt = await self._send(path, body, endpoint, deadline)
            try:
                content = await self._read_body(response, endpoint, attempt, deadline)
            finally:
                with anyio.move_on_after(CLOSE_GRACE_SECONDS, shield=True):
                    await response.aclose()
        text = content.decode("utf-8", errors="replace")
        try:
            return json.loads(text)
        except ValueError:
            raise ServerProtocolError(
                "response body is not valid JSON; is base_url pointing at the right server?",
                endpoint=endpoint,
                attempt=attempt,
                status=response.status_code,
                line=text,
            ) from None

    @asynccontextmanager
    async def open_lines(self, path: str, body: JSONObject) -> AsyncIterator[LineReader]:
        """POST ``body`` and yield a :class:`LineReader` over the streamed response body.

        Retries happen before the response headers arrive; once this yields, nothing is
        retried. The limiter slot is held until the block exits.

        **Cancellation**: leaving the block early (cancelled, an error, a ``break``) closes the
        HTTP response, so the server sees the client disconnect; the close is shielded and
        bounded by :data:`CLOSE_GRACE_SECONDS`.
        """
        endpoint = f"POST {self.url(path)}"
        deadline = anyio.current_time() + self.options.request_timeout_seconds
        async with self.limiter:
            response, attempt = await self._send(path, body, endpoint, deadline)
            reader = LineReader(
                response,
                endpoint=endpoint,
                attempt=attempt,
                deadline=deadline,
                read_timeout=self.options.read_timeout_seconds,
            )
            try:
                yield reader
            finally:
                await reader.aclose()

    # ---------------------------------------------------------------- internals

    async def _open(self, path: str, payload: bytes) -> _Response:
        """One attempt: send the request, return once the response head is in.

        Raises the transport-neutral errors of :mod:`~hermes_async.inference._wire`.
        """
        if self._wire is not None:
            return await self._wire.post(path, payload)  # JSON content type: a pool header
        client = self._client
        assert client is not None  # _require_open ran
        request = client.build_request("POST", path, content=payload, headers=_JSON_HEADERS)
        try:
            response = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.WriteError) as exc:
            raise _wire.WireConnectError(f"{type(exc).__name__}: {exc}") from exc
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise _wire.WireClosedError(str(exc)) from exc
        except httpx.TimeoutException as exc:
            raise _httpx_timeout(exc, self.options) from exc
        except httpx.TransportError as exc:
            raise _wire.WireError(f"{type(exc).__name__}: {exc}") from exc
        return _HttpxResponse(response, self.options.read_timeout_seconds)

    async def _send(
        self, path: str, body: JSONObject, endpoint: str, deadline: float
    ) -> tuple[_Response, int]:
        self._require_open()
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        policy = self.options.retry
        attempt = 0
        stale_retries = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            error: ModelServerError
            remaining = deadline - anyio.current_time()
            try:
                with anyio.fail_after(max(remaining, 0.0)):
                    response = await self._open(path, payload)
            except TimeoutError:
                raise self._request_deadline_error(endpoint, attempt) from None
            except _wire.WireConnectError as exc:
                error = ServerConnectError(
                    f"cannot connect to the model server ({exc}); "
                    "check that it is running and that base_url is right",
                    endpoint=endpoint,
                    attempt=attempt,
                )
                error.__cause__ = exc
            except _wire.WireClosedError as exc:
                # Closed or reset before any response byte (typically a keep-alive connection
                # the server timed out just as it was reused): nothing was received, so a
                # retry is safe. Seen at 2000 concurrent rollouts against a 5 s keep-alive.
                error = ServerConnectError(
                    f"the server closed the connection before responding ({exc})",
                    endpoint=endpoint,
                    attempt=attempt,
                )
                error.__cause__ = exc
                if exc.reused and stale_retries < _MAX_STALE_RETRIES:
                    # A stale kept-alive connection says nothing about the server: retry at
                    # once, without back-off and without using up an attempt (bounded, since
                    # each failure discards one idle connection).
                    stale_retries += 1
                    attempt -= 1
                    logger.debug("%s: stale kept-alive connection; retrying at once", endpoint)
                    continue
            except _wire.WireTimeoutError as exc:
                raise _wire_timeout(exc, endpoint, attempt) from exc
            except _wire.WireError as exc:
                raise ServerConnectError(
                    f"request failed: {exc}",
                    endpoint=endpoint,
                    attempt=attempt,
                ) from exc
            else:
                if response.status_code < 400:
                    return response, attempt
                try:
                    content = await self._read_body(response, endpoint, attempt, deadline)
                finally:
                    with anyio.move_on_after(CLOSE_GRACE_SECONDS, shield=True):
                        await response.aclose()
                status = response.status_code
                retryable = status == 429 or status >= 500
                if status in (429, 503):
                    retry_after = parse_retry_after(response.headers.get("retry-after"))
                text = content.decode("utf-8", errors="replace")
                hint = (
                    "the server is overloaded or failing"
                    if retryable
                    else "the request was rejected; fix the request or the server configuration"
                )
                error = ServerStatusError(
                    f"HTTP {status} {response.reason_phrase}: {hint}",
                    endpoint=endpoint,
                    attempt=attempt,
                    status=status,
                    line=text[:_BODY_EXCERPT_CHARS] or None,
                )
                if not retryable:
                    raise error
            # A retryable failure: decide whether and when to try again.
            if attempt >= policy.max_attempts:
                error.message += f" (gave up after {attempt} attempts)"
                raise error
            if retry_after is not None and retry_after > policy.max_retry_after_seconds:
                error.message += (
                    f" (Retry-After asks for {retry_after:g} s, more than "
                    f"max_retry_after_seconds={policy.max_retry_after_seconds:g}; not waiting)"
                )
                raise error
            delay = policy.delay(attempt, retry_after, self._rng)
            if anyio.current_time() + delay >= deadline:
                error.message += (
                    f" (next retry in {delay:.2g} s would pass the request deadline of "
                    f"{self.options.request_timeout_seconds:g} s)"
                )
                raise error
            logger.warning(
                "%s failed (%s); retry %d/%d in %.2f s",
                endpoint,
                error.message,
                attempt,
                policy.max_attempts - 1,
                delay,
            )
            await anyio.sleep(delay)

    async def _read_body(
        self, response: _Response, endpoint: str, attempt: int, deadline: float
    ) -> bytes:
        """The whole body, each wait bounded by the read timeout and the request deadline."""
        parts: list[bytes] = []
        while (
            part := await _receive_body_part(
                response,
                endpoint=endpoint,
                attempt=attempt,
                deadline=deadline,
                read_timeout=self.options.read_timeout_seconds,
            )
        ) is not None:
            parts.append(part)
        return b"".join(parts)

    def _request_deadline_error(self, endpoint: str, attempt: int) -> ServerTimeoutError:
        seconds = self.options.request_timeout_seconds
        return ServerTimeoutError(
            f"no complete response within the request deadline of {seconds:g} s; raise "
            "HTTPOptions.request_timeout_seconds or check the server's load",
            kind="request",
            timeout_seconds=seconds,
            endpoint=endpoint,
            attempt=attempt,
        )


def _httpx_timeout(exc: httpx.TimeoutException, options: HTTPOptions) -> _wire.WireTimeoutError:
    if isinstance(exc, httpx.ConnectTimeout):
        kind, seconds = "connect", options.connect_timeout_seconds
    elif isinstance(exc, httpx.PoolTimeout):
        kind, seconds = "pool", options.request_timeout_seconds
    else:
        kind, seconds = "read", options.read_timeout_seconds
    return _wire.WireTimeoutError(f"{type(exc).__name__}: {exc}", kind=kind, seconds=seconds)


def _wire_timeout(exc: _wire.WireTimeoutError, endpoint: str, attempt: int) -> ServerTimeoutError:
    return ServerTimeoutError(
        f"{exc.kind} timeout after {exc.seconds:g} s",
        kind=exc.kind,
        timeout_seconds=exc.seconds,
        endpoint=endpoint,
        attempt=attempt,
    )


async def _receive_body_part(
    response: _Response, *, endpoint: str, attempt: int, deadline: float, read_timeout: float
) -> bytes | None:
    """The next piece of a response body (``None`` at its end), within the read timeout and
    the request deadline, with transport errors translated."""
    remaining = deadline - anyio.current_time()
    if read_timeout <= remaining:
        timeout, kind = read_timeout, "read"
    else:
        timeout, kind = max(remaining, 0.0), "request"
    try:
        # The timeout applies to waiting on the network only: buffered data comes at once.
        return await response.receive_some(timeout)
    except TimeoutError:
        what = (
            f"no data for {timeout:g} s (read timeout)"
            if kind == "read"
            else "the request deadline passed while reading the response"
        )
        raise ServerTimeoutError(
            f"{what}; the server stalled or is overloaded",
            kind=kind,
            timeout_seconds=timeout,
            endpoint=endpoint,
            attempt=attempt,
        ) from None
    except _wire.WireTimeoutError as exc:
        raise _wire_timeout(exc, endpoint, attempt) from exc
    except _wire.WireError as exc:
        raise StreamInterruptedError(
            f"the connection was closed before the response body ended ({exc})",
            endpoint=endpoint,
            attempt=attempt,
            status=response.status_code,
        ) from exc


class _HttpxResponse:
    """An httpx streamed response behind the transport-neutral :class:`_Response` interface.

    Why :meth:`aclose` drains: httpx streams a body through a chain of nested async generators.
    Leaving one early (a ``break``, an error between chunks) leaves the inner generators
    suspended, and trio warns about each when it is garbage collected. Closing the response
    and then pulling once more makes the chain raise and finish, on both backends.
    """

    def __init__(self, response: httpx.Response, read_timeout: float) -> None:
        self._response = response
        self._read_timeout = read_timeout
        self._chunks = response.aiter_bytes()
        self._started = False
        self._eof = False
        self.status_code = response.status_code
        self.reason_phrase = response.reason_phrase

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def receive_some(self, timeout: float = math.inf) -> bytes | None:
        self._started = True
        try:
            with anyio.fail_after(timeout):
                return await self._chunks.__anext__()
        except StopAsyncIteration:
            self._eof = True
            return None
        except httpx.TimeoutException as exc:
            raise _wire.WireTimeoutError(
                f"{type(exc).__name__}: {exc}", kind="read", seconds=self._read_timeout
            ) from exc
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.DecodingError) as exc:
            raise _wire.WireReadError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        with anyio.move_on_after(CLOSE_GRACE_SECONDS, shield=True):
            await self._response.aclose()
            if self._started and not self._eof:
                # Pull until the closed chain raises or ends (see the class docstring).
                self._eof = True
                try:
                    while True:
                        await self._chunks.__anext__()
                except StopAsyncIteration:
                    pass
                except Exception:  # the closed chain's own error is the expected way out
                    pass


class LineReader:
    """Lines of a streamed response body, each read under the read and request deadlines.

    Lines are split on ``\\n`` only (a trailing ``\\r`` is stripped), never on the other Unicode
    line separators that may legitimately appear inside JSON strings.
    """

    def __init__(
        self,
        response: _Response,
        *,
        endpoint: str,
        attempt: int,
        deadline: float,
        read_timeout: float,
    ) -> None:
        self.response = response
        self.endpoint = endpoint
        self.attempt = attempt
        self._deadline = deadline
        self._read_timeout = read_timeout
        self._eof = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._lines: collections.deque[str] = collections.deque()

    async def readline(self) -> str | None:
        """Return the next line (terminator stripped), or ``None`` at the end of the body.

        Raises:
            ServerTimeoutError: The read or request deadline passed.
            StreamInterruptedError: The connection was closed mid-body.

        **Cancellation**: safe; the reader can still be closed afterwards.
        """
        while not self._lines:
            if self._eof:
                if self._pending:
                    line, self._pending = self._pending, ""
                    return line.removesuffix("\r")
                return None
            chunk = await self._read_chunk()
            if chunk is None:
                self._eof = True
                text = self._decoder.decode(b"", final=True)
            else:
                text = self._decoder.decode(chunk)
            if text:
                parts = (self._pending + text).split("\n")
                self._pending = parts.pop()
                self._lines.extend(part.removesuffix("\r") for part in parts)
        return self._lines.popleft()

    async def _read_chunk(self) -> bytes | None:
        return await _receive_body_part(
            self.response,
            endpoint=self.endpoint,
            attempt=self.attempt,
            deadline=self._deadline,
            read_timeout=self._read_timeout,
        )

    async def aclose(self) -> None:
        """Close the response (the connection is reused only if the body was read to its end).

        **Cancellation**: shielded, bounded by :data:`CLOSE_GRACE_SECONDS`.
        """
        with anyio.move_on_after(CLOSE_GRACE_SECONDS, shield=True):
            await self.response.aclose()


class ServerClient:
    """Base of the model-server clients: owns one :class:`ServerConnection` and its lifecycle.

    Subclasses set :attr:`path` and build requests; opening, closing and the ``endpoint`` label
    live here once.
    """

    #: Path of the client's endpoint, relative to the base URL.
    path: str = ""
    connection: ServerConnection

    @property
    def endpoint(self) -> str:
        """``POST URL`` of the client's endpoint."""
        return f"POST {self.connection.url(self.path)}"

    async def __aenter__(self) -> Self:
        """Open the connection pool.

        **Cancellation**: nothing is opened before the first await.
        """
        await self.connection.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the connection pool.

        **Cancellation**: the close is shielded and bounded.
        """
        await self.connection.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (idempotent).

        **Cancellation**: shielded and bounded.
        """
        await self.connection.aclose()
