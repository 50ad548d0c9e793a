"""The HTTP layer the model-server clients share: one transport, a limiter, deadlines, retries.

One :class:`ServerConnection` per server. A request holds its limiter slot for all its retries;
retries are decided by :func:`~hermes_async.inference._retry.decide_retry`, and transport
outcomes become the errors of :mod:`._errors` once, where the request fails. No URL in an error
or log line carries credentials. docs/decisions/040-model-server-connection.md has the design.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import random
import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol, Self, TypedDict, TypeVar, overload, runtime_checkable

import anyio
import httpx

from hermes_async._checks import INTEGER_AT_LEAST_ONE, check_fields
from hermes_async._net import default_ssl_context, redact_url, redact_urls
from hermes_async._resource import AsyncResource
from hermes_async.inference import _wire, _wirejson as wirejson
from hermes_async.inference._body import BodyContext, LineReader, read_body, read_excerpt
from hermes_async.inference._errors import (
    DECODE_FAILURES,
    ModelServerError,
    ServerConnectError,
    ServerProtocolError,
    ServerStatusError,
    ServerTimeoutError,
)
from hermes_async.inference._httpx import HttpxTransport
from hermes_async.inference._retry import (
    GiveUp,
    HTTPStatus,
    Outcome,
    Retry,
    RetryPolicy,
    decide_retry,
    parse_retry_after,
)
from hermes_async.inference._transport import (
    ClosedBeforeResponse,
    ConnectFailed,
    Response,
    ResponseTooLarge,
    Transport,
    TransportError,
    TransportTimeout,
)
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.limits import DEFAULT_LIMITS, NamedLimiter

__all__ = (
    "DEFAULT_MAX_LINE_BYTES",
    "KEEPALIVE_EXPIRY_SECONDS",
    "AttemptFailure",
    "Connection",
    "ConnectionKwargs",
    "ConnectionSource",
    "HTTPOptions",
    "LineReader",
    "RetryPolicy",
    "ServerClient",
    "ServerConnection",
    "as_json",
    "connect",
    "decode_json_body",
    "encode_body",
    "parse_retry_after",
    "probe_server",
    "request_error",
)

logger = logging.getLogger("hermes_async.inference")

_BODY_EXCERPT_CHARS = 500

#: Seconds an idle pooled connection is kept (below servers' usual 5 s keep-alive timeout:
#: uvicorn, hypercorn), so a reused connection is rarely a closed one.
KEEPALIVE_EXPIRY_SECONDS = 2.0

#: Default cap on one line of a streamed response. Generous: a long completion in one SSE
#: chunk is a few hundred KB; 16 MiB only stops a server that is not sending lines at all.
DEFAULT_MAX_LINE_BYTES = 16 * 2**20

#: Bytes of an error response's body read for its excerpt (500 characters of UTF-8 at most
#: take 2,000); the rest is not read and the connection is dropped.
_ERROR_BODY_BYTES = 4 * _BODY_EXCERPT_CHARS

#: Sent with every request: every body the clients send is JSON (encoded once per transport).
_JSON_HEADERS: Mapping[str, str] = {"Content-Type": "application/json"}


#: The fields of :class:`HTTPOptions` that bound what a response may hold.
_BOUNDS = (
    "max_line_bytes",
    "max_head_bytes",
    "max_header_lines",
    "max_body_bytes",
    "max_event_bytes",
    "max_completion_chars",
    "max_chars_per_token",
)


@dataclass(frozen=True, slots=True)
class HTTPOptions:
    """Connection, deadline and retry settings for one model server.

    Every ``max_*`` bounds what a server can make the client hold; crossing one is a
    :class:`~hermes_async.inference.ServerProtocolError` naming the option. The defaults'
    reasons are in docs/decisions/040; ``docs/security.md`` lists every bound.

    Attributes:
        read_timeout: Longest silence between two chunks, and before the response head.
        request_timeout: Overall deadline per request, retries and streaming included.
        max_connections: Pool size; raised to the limiter's total if that is larger.
        headers: Extra headers sent with every request (never logged).
        ssl_context: TLS settings for ``https``. Default: the system's trust store plus
            certifi's bundle.
        max_body_bytes: Longest whole body; a larger ``Content-Length`` is refused unread.
        max_event_bytes: Longest Server-Sent Event (its ``data`` lines together).
        max_completion_chars: Longest streamed chat completion per choice, all fields.
        max_chars_per_token: With ``max_tokens``, a streamed choice holds at most
            ``max_tokens`` x this many characters.
    """

    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    request_timeout: float = 1200.0
    max_connections: int = DEFAULT_LIMITS["model_requests"]
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    headers: Mapping[str, str] = field(default_factory=dict)
    ssl_context: ssl.SSLContext | None = None
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_head_bytes: int = 64 * 2**10
    max_header_lines: int = 128
    max_body_bytes: int = 64 * 2**20
    max_event_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_completion_chars: int = 16 * 2**20
    max_chars_per_token: int = 1024

    @classmethod
    def for_probe(cls, timeout: float) -> HTTPOptions:
        """One connection, one attempt, every deadline ``timeout``: for a reachability probe."""
        return cls(
            connect_timeout=timeout,
            read_timeout=timeout,
            request_timeout=timeout,
            max_connections=1,
            retry=RetryPolicy(max_attempts=1),
        )

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "read_timeout", "request_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"HTTPOptions.{name} must be > 0 seconds, got {value!r}")
        if self.max_connections < 1:
            raise ValueError(
                f"HTTPOptions.max_connections must be >= 1, got {self.max_connections!r}"
            )
        check_fields(self, _BOUNDS, INTEGER_AT_LEAST_ONE, error=ValueError)

    def __repr__(self) -> str:  # header values are often credentials: never in a log line
        shown = {
            f.name: {name: "<redacted>" for name in self.headers}
            if f.name == "headers"
            else getattr(self, f.name)
            for f in dataclasses.fields(self)
        }
        return f"HTTPOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


class ConnectionKwargs(TypedDict, total=False):
    """The keyword arguments every client passes through to its :class:`ServerConnection`."""

    options: HTTPOptions | None
    limiter: NamedLimiter | None
    transport: httpx.AsyncBaseTransport | None
    api_key: str | None
    rng: random.Random | None


@dataclass(frozen=True, slots=True)
class AttemptFailure:
    """How one attempt failed; ``cause`` is ``None`` for an HTTP error status."""

    outcome: Outcome
    cause: BaseException | None = None


class Attempts:
    """One request's attempts across retries (stale kept-alive connections do not count)."""

    __slots__ = ("_deadline", "_policy", "_request_timeout", "_rng", "number", "stale_retries")

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        deadline: float,
        request_timeout: float,
        rng: random.Random,
    ) -> None:
        self._policy = policy
        self._deadline = deadline
        self._request_timeout = request_timeout
        self._rng = rng
        self.number = 0
        self.stale_retries = 0

    def next(self) -> int:
        self.number += 1
        return self.number

    def uncount(self) -> None:
        self.number -= 1

    def after(
        self, failure: AttemptFailure, endpoint: str, *, judged_as: Outcome | None = None
    ) -> Retry:
        """The retry to make after ``failure``.

        Args:
            judged_as: The outcome to decide on instead (a pool retries a timeout elsewhere as
                it would a failed connect).

        Raises:
            ModelServerError: No retry: the request's error for ``failure``.
        """
        decision = decide_retry(
            failure.outcome if judged_as is None else judged_as,
            attempt=self.number,
            stale_retries=self.stale_retries,
            policy=self._policy,
            remaining_seconds=self._deadline - anyio.current_time(),
            request_timeout=self._request_timeout,
            rng=self._rng,
        )
        if isinstance(decision, GiveUp):
            raise request_error(
                failure.outcome, endpoint=endpoint, attempt=self.number, note=decision.note
            ) from failure.cause
        if not decision.uses_attempt:
            self.stale_retries += 1
            self.uncount()
        return decision


def encode_body(body: JSONObject | bytes) -> bytes:
    """A request body as sent: JSON in UTF-8, ``bytes`` as they are; a lone surrogate becomes
    U+FFFD (docs/decisions/040)."""
    if isinstance(body, bytes):
        return body
    data = wirejson.dumps(body)  # orjson where it gives the same JSON value (most bodies)
    if data is not None:
        return data
    text = json.dumps(body, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode()


_T = TypeVar("_T")


def as_json(value: JSON) -> JSON:
    """The decoded body as it is (what :meth:`Connection.post_json` returns by default)."""
    return value


def decode_json_body(
    content: bytes, endpoint: str, attempt: int, status: int, decode: Callable[[JSON], _T]
) -> _T:
    """A whole response body decoded as JSON, then by ``decode``.

    Raises:
        ServerProtocolError: Not JSON (often a wrong ``base_url``), or ``decode`` failed on it.
    """
    text = content.decode("utf-8", errors="replace")
    try:
        value = wirejson.loads(text)
    except ValueError:
        raise ServerProtocolError(
            "response body is not valid JSON; is base_url pointing at the right server?",
            endpoint=endpoint,
            attempt=attempt,
            status=status,
            line=text[:_BODY_EXCERPT_CHARS],
        ) from None
    try:
        return decode(value)
    except DECODE_FAILURES as exc:
        raise ServerProtocolError(
            f"unexpected response body: {exc}",
            endpoint=endpoint,
            attempt=attempt,
            status=status,
            line=text[:_BODY_EXCERPT_CHARS],
        ) from None


@runtime_checkable
class Connection(Protocol):
    """What a client needs from the connection under it: one server, or a pool of them."""

    options: HTTPOptions

    def endpoint(self, path: str, method: str = "POST") -> str:
        """``METHOD URL`` of ``path``, credentials redacted (the label of errors and logs)."""
        ...

    @overload
    async def post_json(self, path: str, body: JSONObject | bytes) -> JSON: ...

    @overload
    async def post_json(
        self, path: str, body: JSONObject | bytes, decode: Callable[[JSON], _T]
    ) -> _T: ...

    async def post_json(
        self,
        path: str,
        body: JSONObject | bytes,
        decode: Callable[[JSON], object] = as_json,
    ) -> object:
        """POST ``body`` and return the JSON response decoded by ``decode`` (with retries).

        What ``decode`` raises is that server's protocol failure, which a pool counts.

        **Cancellation**: the request is abandoned and its connection closed.
        """
        ...

    def open_lines(
        self, path: str, body: JSONObject | bytes
    ) -> AbstractAsyncContextManager[LineReader]:
        """POST ``body`` and yield a :class:`LineReader` over the streamed response body."""
        ...

    async def __aenter__(self) -> Self:
        """Open the connection.

        **Cancellation**: nothing is held before the first request.
        """
        ...

    async def aclose(self) -> None:
        """Close it (idempotent).

        **Cancellation**: shielded and bounded.
        """
        ...


@runtime_checkable
class ConnectionSource(Protocol):
    """Something a client can be built on instead of a base URL (a server pool)."""

    def connection(self, transform: Callable[[str], str] | None = None) -> Connection:
        """A connection for one client; ``transform`` maps each base URL as the client would."""
        ...


def connect(
    target: str | ConnectionSource,
    connection: ConnectionKwargs,
    *,
    transform: Callable[[str], str] | None = None,
) -> Connection:
    """The connection a client uses for ``target``: a base URL, or a pool.

    Raises:
        TypeError: Neither a URL nor a pool, or connection options given with a pool.
    """
    if isinstance(target, str):
        return ServerConnection(transform(target) if transform else target, **connection)
    if not isinstance(target, ConnectionSource):
        raise TypeError(
            "a model-server client needs a base URL string (http://host:port) or a ServerPool, "
            f"got {type(target).__name__}"
        )
    if connection:
        raise TypeError(
            f"connection options {sorted(connection)} cannot be combined with a server pool; "
            "give them to the ServerPool instead"
        )
    return target.connection(transform)


def _proxy_applies(base_url: str) -> bool:
    """True if the environment routes ``base_url`` through an HTTP proxy (httpx's rules)."""
    proxies = urllib.request.getproxies_environment()
    parts = urllib.parse.urlsplit(base_url)
    if not (proxies.get(parts.scheme.lower()) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.netloc)


def _split_credentials(base_url: str) -> tuple[str, str | None]:
    """``base_url`` without ``user:password@``, and the Basic credentials it carried."""
    scheme, sep, rest = base_url.partition("://")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return base_url, None
    userinfo, _, host = authority.rpartition("@")
    user, _, password = userinfo.partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
    token = base64.b64encode(pair.encode("utf-8")).decode("ascii")
    return f"{scheme}://{host}{slash}{path}", token


class ServerConnection(AsyncResource):
    """One model server: base URL, transport, limiter, deadlines and retries.

    Uses the lean client of :mod:`._wire`, or httpx with an injected ``transport`` or behind
    an HTTP proxy from the environment; the behaviour is the same. Use as an async context
    manager.

    Args:
        base_url: ``http://host:port``; ``user:password@`` in it is sent as Basic
            authentication (``api_key`` wins) and never shown.
        limiter: Gate for concurrent requests. Default: a private one sized like the pool.
        transport: An httpx transport to use instead of the network.
        api_key: Sent as ``Authorization: Bearer ...``.
        rng: Random source for back-off jitter.

    Raises:
        ValueError: ``base_url`` or a header cannot be used (never shows a value).
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
        url, basic = _split_credentials(base_url)
        if "://" in url.rstrip("/"):  # keep "http://" whole, for its error message
            url = url.rstrip("/")
        #: The base URL, without credentials.
        self.base_url = url
        self._shown_url = redact_url(url)
        self.options = options or HTTPOptions()
        self.limiter = limiter or NamedLimiter("model_requests", self.options.max_connections)
        self._rng = rng or random.Random()
        headers = dict(self.options.headers)
        if basic is not None and not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = f"Basic {basic}"
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        _wire.check_headers(headers)
        #: Pool size: the options' ``max_connections``, raised to the limiter's total.
        self.pool_size = max(self.options.max_connections, self.limiter.total)
        self.transport: Transport = self._choose_transport(
            url, {**headers, **_JSON_HEADERS}, transport
        )
        self._state = "new"

    def _choose_transport(
        self,
        url: str,
        headers: Mapping[str, str],
        injected: httpx.AsyncBaseTransport | None,
    ) -> Transport:
        options = self.options
        if injected is None and not _proxy_applies(url):
            return _wire.WirePool(
                url,
                connect_timeout=options.connect_timeout,
                read_timeout=options.read_timeout,
                keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
                max_idle=self.pool_size,
                max_head_bytes=options.max_head_bytes,
                max_header_lines=options.max_header_lines,
                headers=headers,
                ssl_context=self._ssl_context_factory(),
            )
        return HttpxTransport(
            url,
            connect_timeout=options.connect_timeout,
            read_timeout=options.read_timeout,
            pool_timeout=options.request_timeout,
            max_connections=self.pool_size,
            keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
            headers=headers,
            ssl_context=options.ssl_context or default_ssl_context(),
            transport=injected,
        )

    def _ssl_context_factory(self) -> Callable[[], ssl.SSLContext]:
        context = self.options.ssl_context
        if context is None:
            return default_ssl_context  # built once per process (~20 ms), on first use
        return lambda: context

    @property
    def transport_kind(self) -> str:
        """``"wire"`` or ``"httpx"``."""
        return self.transport.kind

    def url(self, path: str) -> str:
        """Absolute URL of ``path`` on this server (without credentials)."""
        return f"{self.base_url}/{path.lstrip('/')}"

    def endpoint(self, path: str, method: str = "POST") -> str:
        """``METHOD URL`` of ``path``, credentials redacted."""
        return f"{method} {self._shown_url}/{path.lstrip('/')}"

    async def __aenter__(self) -> Self:
        """Open the connection (the transport connects on the first request).

        **Cancellation**: nothing is opened here, so nothing leaks.
        """
        if self._state == "closed":
            raise RuntimeError("cannot reopen a closed model-server client; create a new one")
        self._state = "open"
        return self

    async def aclose(self) -> None:
        """Close the transport's pool (idempotent).

        **Cancellation**: each close is shielded and bounded by the transport.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        await self.transport.aclose()

    def _require_open(self) -> None:
        if self._state != "open":
            state = "closed" if self._state == "closed" else "not open"
            raise RuntimeError(
                f"model-server client for {self._shown_url} is {state}; "
                "use it inside `async with client:`"
            )

    # ---------------------------------------------------------------- public requests

    @overload
    async def post_json(self, path: str, body: JSONObject | bytes) -> JSON: ...

    @overload
    async def post_json(
        self, path: str, body: JSONObject | bytes, decode: Callable[[JSON], _T]
    ) -> _T: ...

    async def post_json(
        self,
        path: str,
        body: JSONObject | bytes,
        decode: Callable[[JSON], object] = as_json,
    ) -> object:
        """POST ``body`` and return the JSON response decoded by ``decode`` (with retries).

        **Cancellation**: the request is abandoned, its connection closed, its slot released.
        """
        endpoint = self.endpoint(path)
        deadline = anyio.current_time() + self.options.request_timeout
        async with self.limiter:
            response, attempt = await self._send(path, body, endpoint, deadline)
            try:
                content = await read_body(response, self.body_context(endpoint, attempt, deadline))
            finally:
                await response.aclose()
        return decode_json_body(content, endpoint, attempt, response.status_code, decode)

    @asynccontextmanager
    async def open_lines(self, path: str, body: JSONObject | bytes) -> AsyncIterator[LineReader]:
        """POST ``body`` and yield a :class:`LineReader` over the streamed response body.

        Retries happen before the head arrives; the limiter slot is held until the block exits.

        **Cancellation**: leaving the block early closes the response (shielded, bounded), so
        the server sees the client disconnect.
        """
        endpoint = self.endpoint(path)
        deadline = anyio.current_time() + self.options.request_timeout
        async with self.limiter:
            response, attempt = await self._send(path, body, endpoint, deadline)
            reader = LineReader(
                response,
                self.body_context(endpoint, attempt, deadline),
                max_line_bytes=self.options.max_line_bytes,
            )
            try:
                yield reader
            finally:
                await reader.aclose()

    async def get_status(self, path: str) -> int:
        """``GET path`` once (no retries, no limiter) and return the HTTP status, any status.

        Raises:
            ServerConnectError: No connection, or it closed before a response.
            ServerTimeoutError: A deadline passed.

        **Cancellation**: the connection is closed.
        """
        self._require_open()
        endpoint = self.endpoint(path, "GET")
        try:
            with anyio.fail_after(self.options.request_timeout):
                response = await self.transport.send("GET", path)
        except TimeoutError:
            raise self.request_deadline_error(endpoint, 1) from None
        except TransportError as exc:
            raise request_error(exc, endpoint=endpoint, attempt=1) from exc
        await response.aclose()
        return response.status_code

    # ---------------------------------------------------------------- internals

    def body_context(self, endpoint: str, attempt: int, deadline: float) -> BodyContext:
        options = self.options
        return BodyContext(
            endpoint, attempt, deadline, options.read_timeout, options.max_body_bytes
        )

    async def _send(
        self, path: str, body: JSONObject | bytes, endpoint: str, deadline: float
    ) -> tuple[Response, int]:
        """Send with retries until a 2xx response arrives; raise the last failure."""
        self._require_open()
        payload = encode_body(body)
        options = self.options
        attempts = Attempts(
            options.retry,
            deadline=deadline,
            request_timeout=options.request_timeout,
            rng=self._rng,
        )
        while True:
            attempt = attempts.next()
            result = await self.send_once(path, payload, endpoint, deadline, attempt)
            if not isinstance(result, AttemptFailure):
                return result, attempt
            retry = attempts.after(result, endpoint)
            if not retry.uses_attempt:
                logger.debug("%s: stale kept-alive connection; retrying at once", endpoint)
                continue
            logger.warning(
                "%s failed (%s); retry %d/%d in %.2f s",
                endpoint,
                request_error(result.outcome, endpoint=endpoint, attempt=attempt).message,
                attempt,
                options.retry.max_attempts - 1,
                retry.delay,
            )
            await anyio.sleep(retry.delay)

    async def send_once(
        self, path: str, payload: bytes, endpoint: str, deadline: float, attempt: int
    ) -> Response | AttemptFailure:
        """One attempt: the response (2xx, body unread) or how it failed.

        Used by this connection's retry loop and a pool's. An error status's body is read
        (bounded) and closed here.

        Raises:
            ServerTimeoutError: ``deadline`` (clock time) passed during the attempt.

        **Cancellation**: the attempt's connection is closed; nothing is held.
        """
        self._require_open()
        try:
            # A bare scope at the absolute deadline, not ``fail_after`` (per request: two
            # generator context managers and a clock read saved).
            with anyio.CancelScope(deadline=deadline) as scope:
                response = await self.transport.send("POST", path, payload)
        except TransportError as exc:
            return AttemptFailure(exc, exc)
        if scope.cancelled_caught:
            raise self.request_deadline_error(endpoint, attempt)
        # 2xx only: a redirect is not followed, and a status under 100 is no answer.
        if 200 <= response.status_code < 300:
            return response
        return AttemptFailure(await self._status_outcome(response, endpoint, attempt, deadline))

    async def _status_outcome(
        self, response: Response, endpoint: str, attempt: int, deadline: float
    ) -> HTTPStatus:
        """Read the start of an error response's body (its excerpt) and close it."""
        context = self.body_context(endpoint, attempt, deadline)
        try:
            content, _ = await read_excerpt(response, context, _ERROR_BODY_BYTES)
        finally:
            await response.aclose()  # drops the connection if the body did not end
        status = response.status_code
        retry_after = None
        if status in (429, 503):
            retry_after = parse_retry_after(response.headers.get("retry-after"))
        text = content.decode("utf-8", errors="replace")[:_BODY_EXCERPT_CHARS]
        return HTTPStatus(status, response.reason_phrase, retry_after, text)

    def request_deadline_error(self, endpoint: str, attempt: int) -> ServerTimeoutError:
        seconds = self.options.request_timeout
        return ServerTimeoutError(
            f"no complete response within the request deadline of {seconds:g} s; raise "
            "HTTPOptions.request_timeout or check the server's load",
            kind="request",
            timeout=seconds,
            endpoint=endpoint,
            attempt=attempt,
        )


def request_error(
    outcome: Outcome, *, endpoint: str, attempt: int, note: str = ""
) -> ModelServerError:
    """The client error for a request that ended in ``outcome`` (``note``: why not retried)."""
    if isinstance(outcome, HTTPStatus):
        hint = (
            "the server is overloaded or failing"
            if outcome.retryable
            else "the request was rejected; fix the request or the server configuration"
        )
        return ServerStatusError(
            f"HTTP {outcome.status} {outcome.reason}: {hint}{note}",
            endpoint=endpoint,
            attempt=attempt,
            status=outcome.status,
            line=outcome.body or None,
        )
    detail = redact_urls(str(outcome))
    if isinstance(outcome, ResponseTooLarge):
        return ServerProtocolError(detail + note, endpoint=endpoint, attempt=attempt)
    if isinstance(outcome, TransportTimeout):
        return ServerTimeoutError(
            f"{outcome.kind} timeout after {outcome.seconds:g} s{note}",
            kind=outcome.kind,
            timeout=outcome.seconds,
            endpoint=endpoint,
            attempt=attempt,
        )
    if isinstance(outcome, ConnectFailed):
        message = (
            f"cannot connect to the model server ({detail}); "
            "check that it is running and that base_url is right"
        )
    elif isinstance(outcome, ClosedBeforeResponse):
        message = f"the server closed the connection before responding ({detail})"
    else:
        message = f"request failed: {detail}"
    return ServerConnectError(message + note, endpoint=endpoint, attempt=attempt)


async def probe_server(
    base_url: str,
    path: str = "/health",
    *,
    timeout: float,
    transport: httpx.AsyncBaseTransport | None = None,
    api_key: str | None = None,
) -> int:
    """``GET base_url + path`` once and return the HTTP status (any status means "reachable").

    Raises:
        ServerConnectError: No connection, or it closed before a response.
        ServerTimeoutError: ``timeout`` passed.

    **Cancellation**: the probe's connection is closed; nothing else is held.
    """
    options = HTTPOptions.for_probe(timeout)
    async with ServerConnection(
        base_url, options=options, transport=transport, api_key=api_key
    ) as connection:
        return await connection.get_status(path)


class ServerClient(AsyncResource):
    """Base of the model-server clients: owns one :class:`ServerConnection`; subclasses set
    :attr:`path`."""

    #: Path of the client's endpoint, relative to the base URL.
    path: str = ""
    #: One server's connection, or a pool's (:class:`Connection`).
    connection: Connection

    @property
    def endpoint(self) -> str:
        """``POST URL`` of the client's endpoint (credentials redacted)."""
        return self.connection.endpoint(self.path)

    async def __aenter__(self) -> Self:
        """Open the connection.

        **Cancellation**: nothing is opened before the first request.
        """
        await self.connection.__aenter__()
        return self

    async def aclose(self) -> None:
        """Close the connection pool (idempotent).

        **Cancellation**: shielded and bounded.
        """
        await self.connection.aclose()
