"""ServerPool: several model servers behind one client, session-affine, load-aware, adaptive.

Build any client on a pool instead of a base URL (``VLLMGenerateClient(pool)``); its
interface does not change. A rollout's turns stay on one server while it is healthy; each
server has its own adaptive limit; failed servers are ejected and probed back. The decisions
live in :mod:`~hermes_async.inference._balance`; this module sends, waits and records. The
design is docs/decisions/050-server-pool.md.
"""

from __future__ import annotations

import logging
import math
import random
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, Self, TypeVar, overload

import anyio
import httpx
from anyio.abc import TaskGroup, TaskStatus

from hermes_async._checks import POSITIVE_SECONDS, check_fields
from hermes_async._current import Current, Using
from hermes_async._net import redact_url
from hermes_async._resource import AsyncResource
from hermes_async.inference._balance import (
    AdaptiveLimit,
    HashRing,
    Health,
    MemberState,
    route,
)
from hermes_async.inference._body import BodyContext, LineReader, read_body
from hermes_async.inference._errors import ModelServerError, ServerTimeoutError
from hermes_async.inference._http import (
    AttemptFailure,
    Attempts,
    HTTPOptions,
    ServerConnection,
    as_json,
    decode_json_body,
    encode_body,
    probe_server,
)
from hermes_async.inference._retry import HTTPStatus, Outcome
from hermes_async.inference._transport import (
    ClosedBeforeResponse,
    ConnectFailed,
    Response,
    TransportTimeout,
)
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.limits import DEFAULT_LIMITS, Limits, NamedLimiter
from hermes_async.telemetry import forget_pool, observe_pool

if TYPE_CHECKING:
    from hermes_async.inference.chat import ChatClient
    from hermes_async.inference.generate import GenerateClient

__all__ = (
    "PoolAPI",
    "PoolOptions",
    "PoolSession",
    "PoolStatistics",
    "ServerPool",
    "ServerStatistics",
    "current_pool_session",
    "pool_session",
)

logger = logging.getLogger("hermes_async.inference.pool")

_T = TypeVar("_T")

#: What a pool's :meth:`ServerPool.client` speaks.
PoolAPI = Literal["vllm", "atropos", "sglang", "chat"]
#: The values ``ServerPool(api=...)`` accepts.
_POOL_APIS: tuple[str, ...] = ("vllm", "atropos", "sglang", "chat")


# --------------------------------------------------------------------------------------------
# Sessions


class _Home:
    __slots__ = ("current", "first")

    def __init__(self, member: int) -> None:
        self.first = member
        self.current = member


class PoolSession:
    """The server affinity of one rollout, keyed by its task id.

    ``placement_key`` is where it hashes on the ring: the outermost enclosing session's key.
    """

    __slots__ = ("_homes", "closed", "key", "placement_key")

    def __init__(self, key: str, placement_key: str) -> None:
        self.key = key
        self.placement_key = placement_key
        self.closed = False
        self._homes: dict[ServerPool, _Home] = {}

    def home(self, pool: ServerPool) -> str | None:
        """The URL (redacted) this session's requests to ``pool`` go to, if placed."""
        home = self._homes.get(pool)
        return None if home is None else pool.server_urls[home.current]

    def _close(self) -> None:
        self.closed = True
        for pool, home in self._homes.items():
            pool._end_session(home.current)
        self._homes.clear()


_SESSION: Current[PoolSession | None] = Current("hermes_async_pool_session", None)


def pool_session(key: str) -> _SessionScope:
    """Mark the model requests of the block (and of tasks it starts) as one session.

    A session opened inside another is placed by the outer one's key and pinned on its own.
    """
    return _SessionScope(key)


class _SessionScope:
    """The context manager of :func:`pool_session` (slotted: every rollout holds one)."""

    __slots__ = ("_key", "_session", "_using")

    def __init__(self, key: str) -> None:
        self._key = key
        self._session: PoolSession | None = None
        self._using: Using[PoolSession | None] | None = None

    def __enter__(self) -> PoolSession:
        outer = _SESSION.get()
        key = self._key
        session = PoolSession(key, outer.placement_key if outer is not None else key)
        self._session = session
        self._using = _SESSION.use(session)
        self._using.__enter__()
        return session

    def __exit__(self, *exc_info: object) -> None:
        assert self._session is not None and self._using is not None
        try:
            self._using.__exit__(*exc_info)
        finally:
            self._session._close()


def current_pool_session() -> PoolSession | None:
    """The innermost :func:`pool_session` of the calling context, if any."""
    return _SESSION.get()


# --------------------------------------------------------------------------------------------
# Options and statistics


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """How a :class:`ServerPool` places, limits, ejects and probes.

    Attributes:
        initial_limit: Concurrency per server at start (``None``: ``max_limit``).
        decrease_factor: Multiplier on a 429 / 5xx / timeout.
        decrease_interval_seconds: Shortest time between two decreases of one server.
        load_factor: How far over its fair share of sessions a server may go (>= 1).
        eject_after_failures: Consecutive failures (not 429s) that eject a server.
        eject_base_seconds: First ejection's length; doubles with each ejection in a row.
        probe_path: Health-check path, relative to the server's root.
        http: Settings of every member connection; its ``max_attempts`` counts attempts across
            servers.

    Raises:
        ValueError: A bound out of order or out of range.
    """

    max_limit: int = DEFAULT_LIMITS["model_requests"]
    min_limit: int = 1
    initial_limit: int | None = None
    decrease_factor: float = 0.5
    decrease_interval_seconds: float = 1.0
    load_factor: float = 1.25
    eject_after_failures: int = 3
    eject_base_seconds: float = 1.0
    eject_max_seconds: float = 30.0
    probe_path: str = "/health"
    probe_timeout: float = 2.0
    ring_replicas: int = 64
    http: HTTPOptions = field(default_factory=HTTPOptions)

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.max_limit:
            raise ValueError(
                f"PoolOptions needs 1 <= min_limit <= max_limit, got min_limit={self.min_limit!r}"
                f", max_limit={self.max_limit!r}"
            )
        start = self.start_limit
        if not self.min_limit <= start <= self.max_limit:
            raise ValueError(
                f"PoolOptions.initial_limit must be within [{self.min_limit}, {self.max_limit}], "
                f"got {self.initial_limit!r}"
            )
        if not 0.0 < self.decrease_factor < 1.0:
            raise ValueError(
                f"PoolOptions.decrease_factor must be within (0, 1), got {self.decrease_factor!r}"
            )
        if not self.load_factor >= 1.0:
            raise ValueError(f"PoolOptions.load_factor must be >= 1, got {self.load_factor!r}")
        if self.eject_after_failures < 1:
            raise ValueError(
                f"PoolOptions.eject_after_failures must be >= 1, got {self.eject_after_failures!r}"
            )
        check_fields(
            self,
            (
                "decrease_interval_seconds",
                "eject_base_seconds",
                "eject_max_seconds",
                "probe_timeout",
            ),
            POSITIVE_SECONDS,
            error=ValueError,
        )

    @property
    def start_limit(self) -> int:
        return self.max_limit if self.initial_limit is None else self.initial_limit


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    """A snapshot of one server of a pool.

    Attributes:
        state: ``up``, ``cooling`` (waiting out a ``Retry-After``), ``ejected`` or ``probing``.
        requests: Attempts sent to it.
        first_ejected_at: Clock time of its first ejection, if any.
        seconds_unavailable: Until it takes requests again (0 when up).
    """

    url: str
    state: str
    limit: int
    in_use: int
    waiting: int
    sessions: int
    requests: int
    failures: int
    rate_limited: int
    ejections: int
    first_ejected_at: float | None
    seconds_unavailable: float

    @property
    def up(self) -> bool:
        """Not ejected (a server cooling down after a 429 is up)."""
        return self.state in ("up", "cooling")


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of a pool.

    Attributes:
        requests: Requests that got a response (a request may take several attempts).
        failovers: Attempts moved to another server after a failure.
        on_first_server: Session requests served by the session's first server.
        first_server_elsewhere: Session requests served elsewhere although the first server
            could take them (the affinity's misses).
    """

    servers: tuple[ServerStatistics, ...]
    sessions: int
    requests: int
    failovers: int
    session_requests: int
    on_first_server: int
    first_server_elsewhere: int

    @property
    def up(self) -> int:
        """Servers not ejected."""
        return sum(1 for s in self.servers if s.up)

    @property
    def affinity(self) -> float:
        """Share of session requests served by their first server (1.0 when none)."""
        counted = self.on_first_server + self.first_server_elsewhere
        return self.on_first_server / counted if counted else 1.0


# --------------------------------------------------------------------------------------------
# The pool


def _root(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _host(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts.netloc.rpartition("@")[2] or url


def _congestion(outcome: Outcome | BaseException) -> tuple[bool, bool]:
    """``(congestion, broken)``: shrink the limit? count towards ejection?"""
    if isinstance(outcome, HTTPStatus):
        if outcome.status == 429:
            return True, False
        if outcome.status >= 500:
            return True, True
        # No such route: this server is not the model server the pool was given (the same
        # request is fine elsewhere). Any other 4xx is the request's fault, not the server's.
        return False, outcome.status == 404
    if isinstance(outcome, ClosedBeforeResponse) and outcome.reused:
        return False, False  # a stale kept-alive connection says nothing about the server
    if isinstance(outcome, TransportTimeout | ServerTimeoutError):
        return True, True
    return False, True


def _movable(outcome: Outcome) -> bool:
    """Safe to send to another server: nothing was processed (or the server said "not now")."""
    if isinstance(outcome, HTTPStatus):
        return outcome.retryable
    if isinstance(outcome, TransportTimeout):
        return outcome.kind == "connect"
    return isinstance(outcome, ConnectFailed | ClosedBeforeResponse)


class ServerPool(AsyncResource):
    """Several model servers behind one client.

    An async context manager (it owns the task that probes ejected servers); build clients on it
    inside the block.

    Args:
        base_urls: The servers' base URLs (``user:password@`` in one: Basic authentication).
        limits: Where the per-server limiters are added, as ``model_requests@host:port``.
        transport: An httpx transport for every member (tests, ASGI apps).
        rng: Random source of retry jitter.
        api: The protocol :meth:`client` speaks: ``vllm`` (default), ``atropos``, ``sglang`` or
            ``chat``.

    Raises:
        ValueError: No URLs, one given twice, or an unknown ``api``.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        options: PoolOptions | None = None,
        limits: Limits | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
        rng: random.Random | None = None,
        limiter_name: str = "model_requests",
        api: PoolAPI = "vllm",
        model: str = "default",
    ) -> None:
        urls = [str(u).rstrip("/") for u in base_urls]
        if not urls:
            raise ValueError("a ServerPool needs at least one base URL")
        if api not in _POOL_APIS:
            raise ValueError(f"unknown ServerPool api {api!r}; valid: {', '.join(_POOL_APIS)}")
        self.api: PoolAPI = api
        self.model = model
        self.options = options or PoolOptions()
        opts = self.options
        #: The servers' base URLs, credentials redacted, in pool order.
        self.server_urls: tuple[str, ...] = tuple(redact_url(u) for u in urls)
        self._urls = urls
        self._ring = HashRing(list(self.server_urls), opts.ring_replicas)
        start = opts.start_limit
        self._members = [
            MemberState(
                name,
                AdaptiveLimit(
                    opts.min_limit,
                    opts.max_limit,
                    float(start),
                    opts.decrease_factor,
                    opts.decrease_interval_seconds,
                ),
                Health(opts.eject_after_failures, opts.eject_base_seconds, opts.eject_max_seconds),
            )
            for name in self.server_urls
        ]
        self.limiters: tuple[NamedLimiter, ...] = tuple(
            limits.add(f"{limiter_name}@{_host(u)}", start)
            if limits is not None
            else NamedLimiter(f"{limiter_name}@{_host(u)}", start)
            for u in urls
        )
        self._http = replace(
            opts.http, max_connections=max(opts.http.max_connections, opts.max_limit)
        )
        self._transport = transport
        self._api_key = api_key
        self._rng = rng or random.Random()
        self._state = "new"
        self._tg: TaskGroup | None = None
        self._wake: anyio.Event | None = None
        self._requests = self._failovers = 0
        self._session_requests = self._on_first = self._elsewhere = 0
        now = 0.0
        for m in self._members:
            m.limit_trace.append((now, start))

    # ---------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        """Start the probing task.

        **Cancellation**: nothing is left running if entering is cancelled.
        """
        if self._state != "new":
            raise RuntimeError(f"a ServerPool cannot be entered twice (state: {self._state})")
        self._wake = anyio.Event()
        now = anyio.current_time()
        for m in self._members:
            m.limit_trace[0] = (now, m.limit.current)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._tg.start(self._prober)
        except BaseException:
            self._tg.cancel_scope.cancel("ServerPool failed to start its prober")
            await self._tg.__aexit__(None, None, None)
            self._state = "closed"
            raise
        self._state = "open"
        observe_pool(self)
        return self

    async def aclose(self) -> None:
        """Stop the probing task (idempotent).

        **Cancellation**: only in-memory work and cancelling the pool's own task.
        """
        if self._state != "open":
            self._state = "closed"
            return
        self._state = "closed"
        forget_pool(self)
        assert self._tg is not None
        self._tg.cancel_scope.cancel("ServerPool closed")
        await self._tg.__aexit__(None, None, None)

    def _require_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(
                f"the ServerPool is {'closed' if self._state == 'closed' else 'not open'}; "
                "use the clients inside `async with ServerPool(...) as pool:`"
            )

    def connection(self, transform: Callable[[str], str] | None = None) -> _PooledConnection:
        """A connection for one client; ``transform`` maps each base URL as the client would."""
        return _PooledConnection(self, transform)

    def client(self) -> GenerateClient | ChatClient:
        """A new client of :attr:`api` on this pool (enter it inside the pool's block)."""
        from hermes_async.inference.chat import ChatClient
        from hermes_async.inference.generate import (
            AtroposGenerateClient,
            SGLangGenerateClient,
            VLLMGenerateClient,
        )

        if self.api == "chat":
            return ChatClient(self, model=self.model)
        rooted = _Rooted(self)
        if self.api == "atropos":
            return AtroposGenerateClient(rooted)
        if self.api == "sglang":
            return SGLangGenerateClient(rooted)
        return VLLMGenerateClient(rooted)

    # ---------------------------------------------------------------- statistics

    def statistics(self) -> PoolStatistics:
        """A snapshot of every server and of the affinity counters."""
        now = anyio.current_time() if self._state == "open" else 0.0
        servers = []
        for m, limiter in zip(self._members, self.limiters, strict=True):
            stats = limiter.statistics()
            until = max(m.cool_until, m.health.ejected_until if m.health.state != "up" else 0.0)
            servers.append(
                ServerStatistics(
                    url=m.name,
                    state=m.state(now),
                    limit=m.limit.current,
                    in_use=stats.in_use,
                    waiting=stats.waiting,
                    sessions=m.sessions,
                    requests=m.requests,
                    failures=m.failures,
                    rate_limited=m.rate_limited,
                    ejections=m.health.ejections,
                    first_ejected_at=m.health.first_ejected_at,
                    seconds_unavailable=max(0.0, until - now),
                )
            )
        return PoolStatistics(
            servers=tuple(servers),
            sessions=sum(m.sessions for m in self._members),
            requests=self._requests,
            failovers=self._failovers,
            session_requests=self._session_requests,
            on_first_server=self._on_first,
            first_server_elsewhere=self._elsewhere,
        )

    def limit_trace(self, index: int) -> list[tuple[float, int]]:
        """``(clock time, limit)`` at each change of server ``index``'s limit."""
        return list(self._members[index].limit_trace)

    # ---------------------------------------------------------------- decisions (sync)

    def _route(
        self, session: PoolSession | None, avoid: set[int], *, commit: bool
    ) -> tuple[int | None, float]:
        """``(member, wait_until)`` for the next attempt; ``commit`` rehomes the session."""
        now = anyio.current_time()
        home = session._homes.get(self) if session is not None else None
        decision = route(
            self._members,
            self._ring,
            now=now,
            key=session.placement_key if session is not None else None,
            home=home.current if home is not None else None,
            avoid=avoid,
            load_factor=self.options.load_factor,
            in_flight=[lim.statistics().in_use for lim in self.limiters] if session is None else (),
        )
        if decision.member is None:
            return None, decision.wait_until
        if commit and decision.rehome and session is not None and not session.closed:
            if home is None:
                session._homes[self] = _Home(decision.member)
            else:
                self._members[home.current].sessions -= 1
                home.current = decision.member
            self._members[decision.member].sessions += 1
        return decision.member, now

    def _end_session(self, member: int) -> None:
        self._members[member].sessions -= 1

    def _record_served(self, member: int, session: PoolSession | None, avoid: set[int]) -> None:
        self._requests += 1
        if session is None:
            return
        home = session._homes.get(self)
        if home is None:
            return
        self._session_requests += 1
        if member == home.first:
            self._on_first += 1
        elif home.first not in avoid and self._members[home.first].eligible(anyio.current_time()):
            self._elsewhere += 1  # not a failover away from it, not cooling, not ejected

    def _set_limit(self, index: int, now: float) -> None:
        m = self._members[index]
        self.limiters[index].set_total(m.limit.current)
        m.limit_trace.append((now, m.limit.current))

    def _record_success(self, index: int) -> None:
        now = anyio.current_time()
        m = self._members[index]
        m.health.record_success()
        if m.limit.increase(now):
            self._set_limit(index, now)

    def _record_failure(self, index: int, outcome: Outcome | BaseException) -> None:
        now = anyio.current_time()
        m = self._members[index]
        congestion, broken = _congestion(outcome)
        if not (congestion or broken):
            return
        m.failures += 1
        retry_after = 0.0
        if isinstance(outcome, HTTPStatus):
            if outcome.status == 429:
                m.rate_limited += 1
            if outcome.retry_after is not None and outcome.retry_after > 0:
                retry_after = min(outcome.retry_after, self._http.retry.max_retry_after_seconds)
                m.cool_until = max(m.cool_until, now + retry_after)
        if congestion and m.limit.decrease(now, retry_after):
            self._set_limit(index, now)
            logger.info(
                "%s: congestion (%s); concurrency limit now %d",
                m.name,
                _describe(outcome),
                m.limit.current,
            )
        if broken:
            others = sum(1 for i, o in enumerate(self._members) if i != index and o.eligible(now))
            if m.health.record_failure(now, may_eject=others > 0):
                logger.warning(
                    "%s ejected for %.1f s after %d consecutive failures (last: %s)",
                    m.name,
                    m.health.ejected_until - now,
                    self.options.eject_after_failures,
                    _describe(outcome),
                )
                if self._wake is not None:
                    self._wake.set()

    # ---------------------------------------------------------------- probing

    async def _prober(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Probe ejected servers when their time is up; readmit or eject them again."""
        task_status.started()
        while True:
            now = anyio.current_time()
            due = [i for i, m in enumerate(self._members) if m.health.probe_due(now)]
            if due:
                async with anyio.create_task_group() as tg:
                    for i in due:
                        self._members[i].health.state = "probing"
                        tg.start_soon(self._probe, i, name=f"probe {self.server_urls[i]}")
                continue
            pending = [m.health.ejected_until for m in self._members if m.health.state == "ejected"]
            assert self._wake is not None
            with anyio.move_on_after(min(pending, default=math.inf) - now):
                await self._wake.wait()
            if self._wake.is_set():
                self._wake = anyio.Event()

    async def _probe(self, index: int) -> None:
        url = _root(self._urls[index])
        try:
            status = await probe_server(
                url,
                self.options.probe_path,
                timeout=self.options.probe_timeout,
                transport=self._transport,
                api_key=self._api_key,
            )
            ok = status < 500
            detail = f"HTTP {status}"
        except ModelServerError as exc:
            ok, detail = False, exc.message
        member = self._members[index]
        member.health.probe_result(ok, anyio.current_time())
        if ok:
            logger.warning("%s readmitted after a health check (%s)", member.name, detail)
        else:
            logger.info("%s still failing its health check (%s)", member.name, detail)


class _Rooted:
    """The pool as a connection source whose URLs lose a trailing ``/v1`` (token routes)."""

    __slots__ = ("pool",)

    def __init__(self, pool: ServerPool) -> None:
        self.pool = pool

    def connection(self, transform: Callable[[str], str] | None = None) -> _PooledConnection:
        inner = transform or str
        return self.pool.connection(lambda url: inner(_root(url)))


def _describe(outcome: Outcome | BaseException) -> str:
    if isinstance(outcome, HTTPStatus):
        return f"HTTP {outcome.status}"
    return f"{type(outcome).__name__}: {outcome}"


# --------------------------------------------------------------------------------------------
# The connection a client uses


@dataclass(frozen=True, slots=True)
class _Exchange:
    connection: ServerConnection
    response: Response
    endpoint: str
    attempt: int
    deadline: float

    @property
    def context(self) -> BodyContext:
        return self.connection.body_context(self.endpoint, self.attempt, self.deadline)


class _PooledConnection:
    """One client's connection to a :class:`ServerPool`: one member connection per server."""

    def __init__(self, pool: ServerPool, transform: Callable[[str], str] | None) -> None:
        self.pool = pool
        self.options = pool._http
        self._members = [
            ServerConnection(
                transform(url) if transform else url,
                options=pool._http,
                limiter=pool.limiters[i],
                transport=pool._transport,
                api_key=pool._api_key,
                rng=pool._rng,
            )
            for i, url in enumerate(pool._urls)
        ]
        self._label = "pool[" + ", ".join(pool.server_urls) + "]"

    def endpoint(self, path: str, method: str = "POST") -> str:
        return f"{method} {self._label}/{path.lstrip('/')}"

    async def __aenter__(self) -> Self:
        """Open the member connections (they connect on first use).

        **Cancellation**: nothing is opened yet.
        """
        for member in self._members:
            await member.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every member connection's pool (idempotent).

        **Cancellation**: each close is shielded and bounded by its transport.
        """
        for member in self._members:
            await member.aclose()

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
        """POST ``body`` to one server of the pool (with failover) and decode the JSON reply.

        Raises:
            ModelServerError: The request failed on every server it was tried on.
        **Cancellation**: the request is abandoned, its connection closed, its slot freed.
        """
        async with self._exchange(path, body) as exchange:
            content = await read_body(exchange.response, exchange.context)
            return decode_json_body(
                content, exchange.endpoint, exchange.attempt, exchange.response.status_code, decode
            )

    @asynccontextmanager
    async def open_lines(self, path: str, body: JSONObject | bytes) -> AsyncIterator[LineReader]:
        """POST ``body`` to one server of the pool; yield a :class:`LineReader` over the reply.

        Failover happens before the headers arrive; once this yields, nothing is retried.
        **Cancellation**: leaving the block closes the response; shielded and bounded.
        """
        async with self._exchange(path, body) as exchange:
            reader = LineReader(
                exchange.response, exchange.context, max_line_bytes=self.options.max_line_bytes
            )
            try:
                yield reader
            finally:
                await reader.aclose()

    @asynccontextmanager
    async def _exchange(self, path: str, body: JSONObject | bytes) -> AsyncIterator[_Exchange]:
        """Route, hold a slot, send (failing over), yield the response, record the outcome."""
        pool = self.pool
        pool._require_open()
        payload = encode_body(body)
        policy = self.options.retry
        deadline = anyio.current_time() + self.options.request_timeout
        session = _SESSION.get()
        avoid: set[int] = set()
        attempts = Attempts(
            policy,
            deadline=deadline,
            request_timeout=self.options.request_timeout,
            rng=pool._rng,
        )
        while True:
            index, wait_until = pool._route(session, avoid, commit=True)
            now = anyio.current_time()
            if index is None:  # every server is cooling down: wait for the first
                if wait_until >= deadline:
                    raise self._deadline_error(
                        path, attempts.number, "every server is cooling down"
                    )
                await anyio.sleep(max(0.0, wait_until - now))
                continue
            connection = self._members[index]
            limiter = pool.limiters[index]
            endpoint = connection.endpoint(path)
            attempt = attempts.next()
            try:
                with anyio.fail_after(max(0.0, deadline - now)):
                    await limiter.__aenter__()
            except TimeoutError:
                raise self._deadline_error(
                    path, attempt, f"no free slot on {pool.server_urls[index]}"
                ) from None
            try:
                if not pool._members[index].eligible(anyio.current_time()) and (
                    pool._route(session, avoid | {index}, commit=False)[0] not in (None, index)
                ):
                    attempts.uncount()  # ejected or cooling while we waited: route again
                    continue
                pool._members[index].requests += 1
                result = await connection.send_once(path, payload, endpoint, deadline, attempt)
                if not isinstance(result, AttemptFailure):
                    pool._record_served(index, session, avoid)
                    try:
                        yield _Exchange(connection, result, endpoint, attempt, deadline)
                    except ModelServerError as exc:
                        pool._record_failure(index, exc)
                        raise
                    except BaseException:
                        raise  # cancellation or the caller's own error: says nothing of the server
                    else:
                        pool._record_success(index)
                    finally:
                        await result.aclose()
                    return
            finally:
                await limiter.__aexit__(None, None, None)
            outcome = result.outcome
            pool._record_failure(index, outcome)
            # A timeout to connect, or a 404 while another server can take the request: nothing
            # was processed, so the request moves on as after a refused connection.
            moves = (isinstance(outcome, TransportTimeout) and _movable(outcome)) or (
                isinstance(outcome, HTTPStatus)
                and outcome.status == 404
                and pool._route(session, avoid | {index}, commit=False)[0] not in (None, index)
            )
            retry = attempts.after(
                result, endpoint, judged_as=ConnectFailed(str(outcome)) if moves else None
            )
            if not retry.uses_attempt:
                continue
            if moves or _movable(outcome):
                avoid.add(index)
            nxt, _ = pool._route(session, avoid, commit=False)
            if nxt is not None and nxt not in avoid:
                pool._failovers += 1
                logger.info(
                    "%s failed (%s); failing over to %s (attempt %d/%d)",
                    endpoint,
                    _describe(outcome),
                    pool.server_urls[nxt],
                    attempt + 1,
                    policy.max_attempts,
                )
                continue
            logger.warning(
                "%s failed (%s); retry %d/%d in %.2f s",
                endpoint,
                _describe(outcome),
                attempt,
                policy.max_attempts - 1,
                retry.delay,
            )
            await anyio.sleep(retry.delay)

    def _deadline_error(self, path: str, attempt: int, why: str) -> ServerTimeoutError:
        seconds = self.options.request_timeout
        return ServerTimeoutError(
            f"{why} within the request deadline of {seconds:g} s; raise "
            "HTTPOptions.request_timeout, add servers or lower the load",
            kind="pool",
            timeout=seconds,
            endpoint=self.endpoint(path),
            attempt=max(attempt, 1),
        )
