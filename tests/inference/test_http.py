"""The shared HTTP layer: retry decisions, Retry-After, SSE lines, deadlines, limiter, pool."""

from __future__ import annotations

import base64
import email.utils
import json
import logging
import math
import random

import anyio
import httpx
import pytest

from hermes_async.inference import (
    HTTPOptions,
    RetryPolicy,
    ServerConnectError,
    ServerProtocolError,
    ServerStatusError,
    ServerTimeoutError,
    probe_server,
)
from hermes_async.inference._http import (
    AttemptFailure,
    Attempts,
    ServerConnection,
    parse_retry_after,
)
from hermes_async.inference._httpx import HttpxTransport, translate
from hermes_async.inference._retry import (
    MAX_STALE_RETRIES,
    GiveUp,
    HTTPStatus,
    Outcome,
    Retry,
    decide_retry,
)
from hermes_async.inference._sse import SSEDecoder, SSEEventTooLarge, SSEFormatError
from hermes_async.inference._transport import (
    BodyCut,
    ClosedBeforeResponse,
    ConnectFailed,
    TransportError,
    TransportTimeout,
)
from hermes_async.limits import Limits
from tests.support import FAST_RETRY

# ------------------------------------------------------------------ pure decisions


def test_backoff_grows_exponentially_with_bounded_jitter() -> None:
    policy = RetryPolicy(initial_backoff_seconds=1.0, max_backoff_seconds=8.0, jitter=0.5)
    rng = random.Random(0)
    for attempt, full in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0), (9, 8.0)]:
        delays = [policy.backoff(attempt, rng) for _ in range(200)]
        assert all(full / 2 <= d <= full for d in delays), (attempt, min(delays), max(delays))
        assert max(delays) - min(delays) > full / 4  # the jitter really varies


def test_retry_after_wins_over_backoff() -> None:
    policy = RetryPolicy(initial_backoff_seconds=0.1, jitter=0.5)
    delay = policy.delay(1, 3.0, random.Random(1))
    assert 3.0 <= delay <= 3.05


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 0.25 ") == 0.25
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-3") is None
    now = 1_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30.0, abs=1.0)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after(past, now=now) == 0.0


@pytest.mark.parametrize(
    "value",
    [
        "Mon, 01 Jan 99999999999 00:00:00 GMT",  # a year past a C int: OverflowError escaped
        "Mon, 01 Jan 2147483648 00:00:00 GMT",
        "Mon, 01 Jan 10000 00:00:00 GMT",  # past datetime's year 9999
    ],
)
def test_parse_retry_after_ignores_a_date_out_of_range(value: str) -> None:
    assert parse_retry_after(value) is None


@pytest.mark.anyio
async def test_a_retry_after_date_out_of_range_is_retried_as_without_one() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"retry-after": "Mon, 01 Jan 99999999999 00:00:00 GMT"}
        return httpx.Response(429, text="slow down", headers=headers)

    options = HTTPOptions(retry=FAST_RETRY)
    transport = httpx.MockTransport(handler)
    async with ServerConnection("http://m", options=options, transport=transport) as conn:
        with pytest.raises(ServerStatusError, match=r"HTTP 429 .*gave up after"):
            await conn.post_json("/x", {})


def test_invalid_options_are_rejected_with_the_value() -> None:
    with pytest.raises(ValueError, match=r"read_timeout must be > 0 seconds, got 0"):
        HTTPOptions(read_timeout=0)
    with pytest.raises(ValueError, match=r"max_attempts must be >= 1, got 0"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match=r"jitter must be within \[0, 1\], got 2"):
        RetryPolicy(jitter=2)
    # Before: accepted (a negative or infinite back-off, a delay shrinking every attempt).
    for name in ("initial_backoff_seconds", "max_backoff_seconds", "max_retry_after_seconds"):
        for bad in (-1, math.inf, math.nan):
            with pytest.raises(ValueError, match=rf"RetryPolicy\.{name} must be >= 0 and finite"):
                RetryPolicy(**{name: bad})
    with pytest.raises(
        ValueError, match=r"RetryPolicy\.multiplier must be >= 1 and finite, got 0.5"
    ):
        RetryPolicy(multiplier=0.5)
    assert RetryPolicy(initial_backoff_seconds=0, multiplier=1).backoff(3, random.Random(0)) == 0


def test_sse_decoder_events_comments_and_multiline_data() -> None:
    decoder = SSEDecoder()
    lines = [": keep-alive", "event: message", 'data: {"a":', "data: 1}", "", "data:[DONE]", ""]
    events = [e for line in lines if (e := decoder.feed_line(line)) is not None]
    assert [e.data for e in events] == ['{"a":\n1}', "[DONE]"]
    assert events[0].event == "message"
    assert events[0].last_line == "data: 1}"
    assert decoder.feed_line("data: tail") is None
    tail = decoder.flush()
    assert tail is not None and tail.data == "tail"


def test_sse_decoder_rejects_lines_that_are_not_sse() -> None:
    decoder = SSEDecoder()
    with pytest.raises(SSEFormatError, match="not a Server-Sent Events line") as info:
        decoder.feed_line('{"text": "raw json line"}')
    assert info.value.line == '{"text": "raw json line"}'


# ------------------------------------------------------------------ async shell (MockTransport)


def _json_response(
    status: int, payload: object, headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.Response(status, json=payload, headers=headers)


@pytest.mark.anyio
async def test_5xx_is_retried_then_succeeds() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content))
        if len(calls) < 3:
            return _json_response(503, {"error": "busy"})
        return _json_response(200, {"ok": True})

    options = HTTPOptions(retry=FAST_RETRY)
    async with ServerConnection(
        "http://m", options=options, transport=httpx.MockTransport(handler)
    ) as conn:
        assert await conn.post_json("/x", {"n": 1}) == {"ok": True}
    assert calls == [{"n": 1}] * 3


@pytest.mark.anyio
@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_other_4xx_is_not_retried(status: int) -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return _json_response(status, {"error": {"message": "nope"}})

    async with ServerConnection(
        "http://m", options=HTTPOptions(retry=FAST_RETRY), transport=httpx.MockTransport(handler)
    ) as conn:
        with pytest.raises(
            ServerStatusError, match=rf"HTTP {status} .*request was rejected"
        ) as info:
            await conn.post_json("/x", {})
    assert calls == 1
    assert info.value.status == status
    assert info.value.attempt == 1
    assert info.value.line is not None and "nope" in info.value.line


@pytest.mark.anyio
async def test_retries_give_up_after_max_attempts() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return _json_response(500, {"error": "boom"})

    policy = RetryPolicy(max_attempts=3, initial_backoff_seconds=0.01)
    async with ServerConnection(
        "http://m", options=HTTPOptions(retry=policy), transport=httpx.MockTransport(handler)
    ) as conn:
        with pytest.raises(ServerStatusError, match="gave up after 3 attempts") as info:
            await conn.post_json("/x", {})
    assert calls == 3
    assert info.value.attempt == 3
    assert info.value.endpoint == "POST http://m/x"


@pytest.mark.anyio
async def test_429_honours_retry_after() -> None:
    times: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        times.append(anyio.current_time())
        if len(times) == 1:
            return _json_response(429, {"error": "slow down"}, {"Retry-After": "0.3"})
        return _json_response(200, {"ok": 1})

    async with ServerConnection(
        "http://m", options=HTTPOptions(retry=FAST_RETRY), transport=httpx.MockTransport(handler)
    ) as conn:
        assert await conn.post_json("/x", {}) == {"ok": 1}
    assert times[1] - times[0] >= 0.3
    assert times[1] - times[0] < 3.0


@pytest.mark.anyio
async def test_retry_after_beyond_the_cap_is_not_waited_for() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return _json_response(429, {}, {"Retry-After": "3600"})

    policy = RetryPolicy(max_retry_after_seconds=10)
    start = anyio.current_time()
    async with ServerConnection(
        "http://m", options=HTTPOptions(retry=policy), transport=httpx.MockTransport(handler)
    ) as conn:
        with pytest.raises(ServerStatusError, match=r"Retry-After asks for 3600 s"):
            await conn.post_json("/x", {})
    assert anyio.current_time() - start < 2.0


@pytest.mark.anyio
async def test_retry_that_would_pass_the_deadline_is_not_attempted() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return _json_response(429, {}, {"Retry-After": "5"})

    options = HTTPOptions(request_timeout=1.0)
    async with ServerConnection(
        "http://m", options=options, transport=httpx.MockTransport(handler)
    ) as conn:
        with pytest.raises(ServerStatusError, match="would pass the request deadline of 1 s"):
            await conn.post_json("/x", {})


@pytest.mark.anyio
async def test_connect_errors_are_retried_then_raised_clearly() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("connection refused", request=request)

    policy = RetryPolicy(max_attempts=2, initial_backoff_seconds=0.01)
    async with ServerConnection(
        "http://m", options=HTTPOptions(retry=policy), transport=httpx.MockTransport(handler)
    ) as conn:
        with pytest.raises(ServerConnectError, match=r"cannot connect .*check that it is running"):
            await conn.post_json("/x", {})
    assert calls == 2


@pytest.mark.anyio
async def test_connect_error_to_a_closed_port_on_loopback() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on ``port`` now.
    policy = RetryPolicy(max_attempts=2, initial_backoff_seconds=0.01)
    async with ServerConnection(
        f"http://127.0.0.1:{port}", options=HTTPOptions(retry=policy)
    ) as conn:
        with pytest.raises(ServerConnectError, match=rf"127.0.0.1:{port}/x: cannot connect"):
            await conn.post_json("/x", {})


@pytest.mark.anyio
async def test_invalid_json_body_names_endpoint_and_body() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>proxy error</html>")

    async with ServerConnection("http://m", transport=httpx.MockTransport(handler)) as conn:
        with pytest.raises(
            ServerProtocolError,
            match=r"POST http://m/x: response body is not valid JSON.*offending line: '<html>proxy",
        ):
            await conn.post_json("/x", {})


@pytest.mark.anyio
async def test_request_deadline_covers_a_slow_response() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await anyio.sleep(10)
        return _json_response(200, {})

    options = HTTPOptions(request_timeout=0.2)
    start = anyio.current_time()
    async with ServerConnection(
        "http://m", options=options, transport=httpx.MockTransport(handler)
    ) as conn:
        with pytest.raises(ServerTimeoutError, match=r"request deadline of 0\.2 s") as info:
            await conn.post_json("/x", {})
    assert info.value.kind == "request"
    assert anyio.current_time() - start < 3.0


@pytest.mark.anyio
async def test_using_a_client_outside_its_context_is_an_error() -> None:
    conn = ServerConnection("http://m")
    with pytest.raises(RuntimeError, match=r"is not open; use it inside `async with client:`"):
        await conn.post_json("/x", {})
    async with conn:
        pass
    with pytest.raises(RuntimeError, match="is closed"):
        await conn.post_json("/x", {})
    with pytest.raises(RuntimeError, match="cannot reopen"):
        await conn.__aenter__()


@pytest.mark.anyio
async def test_limiter_gates_concurrency_and_pool_is_at_least_the_limiter() -> None:
    limits = Limits(model_requests=3)
    active = 0
    peak = 0
    release = anyio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await release.wait()
        active -= 1
        return _json_response(200, {})

    conn = ServerConnection(
        "http://m",
        options=HTTPOptions(max_connections=1),
        limiter=limits.model_requests,
        transport=httpx.MockTransport(handler),
    )
    assert conn.pool_size == 3  # raised to the limiter's total
    assert isinstance(conn.transport, HttpxTransport)
    assert conn.transport.limits.max_connections == 3
    async with conn, anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(conn.post_json, "/x", {})
        await anyio.wait_all_tasks_blocked()
        stats = limits.model_requests.statistics()
        assert (stats.in_use, stats.waiting) == (3, 5)
        release.set()
    assert peak == 3
    assert limits.model_requests.statistics().acquisitions == 8


def test_a_header_that_cannot_be_sent_is_rejected_without_its_value() -> None:
    with pytest.raises(ValueError, match=r"HTTP header 'Authorization' has an invalid") as info:
        ServerConnection("http://127.0.0.1:9", api_key="sk-secret\r\nX-Evil: 1")
    assert "sk-secret" not in str(info.value)
    with pytest.raises(ValueError, match=r"HTTP header 'X-Bad\\nName'"):
        ServerConnection("http://127.0.0.1:9", options=HTTPOptions(headers={"X-Bad\nName": "v"}))


# ------------------------------------------------------------------ the retry decision (pure)


def _decide(
    outcome: Outcome, *, attempt: int = 1, stale: int = 0, remaining: float = 100.0
) -> Retry | GiveUp:
    return decide_retry(
        outcome,
        attempt=attempt,
        stale_retries=stale,
        policy=RetryPolicy(max_attempts=3, initial_backoff_seconds=0.5, jitter=0.0),
        remaining_seconds=remaining,
        request_timeout=100.0,
        rng=random.Random(0),
    )


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (ConnectFailed("refused"), Retry(0.5)),
        (ClosedBeforeResponse("reset"), Retry(0.5)),  # a fresh connection: back-off
        (ClosedBeforeResponse("stale", reused=True), Retry(0.0, uses_attempt=False)),
        (HTTPStatus(500), Retry(0.5)),
        (HTTPStatus(429), Retry(0.5)),
        (HTTPStatus(503, retry_after=2.0), Retry(2.0)),
        (HTTPStatus(404), GiveUp()),
        (HTTPStatus(400, retry_after=1.0), GiveUp()),
        (TransportTimeout("slow", kind="connect", seconds=1.0), GiveUp()),
        (BodyCut("cut"), GiveUp()),
        (TransportError("proxy refused"), GiveUp()),
    ],
    ids=repr,
)
def test_decide_retry_per_outcome(outcome: Outcome, expected: Retry | GiveUp) -> None:
    assert _decide(outcome) == expected


def test_decide_retry_gives_up_with_the_reason() -> None:
    assert _decide(HTTPStatus(500), attempt=3) == GiveUp(" (gave up after 3 attempts)")
    gave_up = _decide(HTTPStatus(429, retry_after=3600.0))
    assert isinstance(gave_up, GiveUp) and "Retry-After asks for 3600 s" in gave_up.note
    gave_up = _decide(ConnectFailed("refused"), remaining=0.1)
    assert isinstance(gave_up, GiveUp)
    assert "would pass the request deadline of 100 s" in gave_up.note
    # Stale kept-alive retries are bounded; then the connection error counts as usual.
    assert _decide(ClosedBeforeResponse("stale", reused=True), stale=MAX_STALE_RETRIES) == Retry(
        0.5
    )


@pytest.mark.anyio
async def test_attempts_count_retries_but_not_stale_connections() -> None:
    # The bookkeeping a connection's and a pool's retry loops share (anyio's clock: async).
    attempts = Attempts(
        RetryPolicy(max_attempts=2, initial_backoff_seconds=0.5, jitter=0.0),
        deadline=anyio.current_time() + 100.0,
        request_timeout=100.0,
        rng=random.Random(0),
    )
    assert attempts.next() == 1
    stale = AttemptFailure(ClosedBeforeResponse("stale", reused=True))
    assert attempts.after(stale, "POST http://x/generate") == Retry(0.0, uses_attempt=False)
    assert (attempts.number, attempts.stale_retries) == (0, 1)
    assert attempts.next() == 1  # the stale retry did not count
    # A pool judges a movable timeout as a failed connect: retried, where a timeout is not.
    timeout = AttemptFailure(TransportTimeout("slow", kind="connect", seconds=1.0))
    assert attempts.after(timeout, "POST http://x/generate", judged_as=ConnectFailed("t")) == (
        Retry(0.5)
    )
    assert attempts.next() == 2
    attempts.uncount()
    assert attempts.next() == 2
    cause = OSError("refused")
    with pytest.raises(ServerConnectError, match="gave up after 2 attempts") as info:
        attempts.after(AttemptFailure(ConnectFailed("refused"), cause), "POST http://x/generate")
    assert info.value.attempt == 2 and info.value.__cause__ is cause


@pytest.mark.parametrize(
    ("error", "outcome", "kind"),
    [
        (httpx.ConnectError("refused"), ConnectFailed, None),
        (httpx.WriteError("broken pipe"), ConnectFailed, None),
        (httpx.RemoteProtocolError("closed"), ClosedBeforeResponse, None),
        (httpx.ReadError("reset"), ClosedBeforeResponse, None),
        (httpx.ConnectTimeout("slow"), TransportTimeout, "connect"),
        (httpx.PoolTimeout("full"), TransportTimeout, "pool"),
        (httpx.ReadTimeout("silent"), TransportTimeout, "read"),
        (httpx.ProxyError("refused"), TransportError, None),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_httpx_errors_are_translated_once_into_typed_outcomes(
    error: httpx.TransportError, outcome: type[TransportError], kind: str | None
) -> None:
    mapped = translate(error, connect_timeout=1.0, read_timeout=2.0, pool_timeout=3.0)
    assert type(mapped) is outcome
    if kind is not None:
        assert isinstance(mapped, TransportTimeout)
        assert (mapped.kind, mapped.seconds) == (
            kind,
            {"connect": 1.0, "read": 2.0, "pool": 3.0}[kind],
        )


def test_with_partial_returns_a_copy_and_leaves_the_original_alone() -> None:
    original = ServerTimeoutError(
        "read timeout", kind="read", timeout=5.0, endpoint="POST http://m/x", attempt=2
    )
    copy = original.with_partial([1, 2], [-0.5, -0.25])
    assert copy is not original
    assert type(copy) is ServerTimeoutError
    assert (copy.kind, copy.timeout, copy.attempt) == ("read", 5.0, 2)
    assert copy.token_ids == (1, 2) and copy.logprobs == (-0.5, -0.25)
    assert original.token_ids == () and original.logprobs == ()
    assert "after 2 completion tokens" in str(copy)
    assert "completion tokens" not in str(original)


# ------------------------------------------------------------------ credentials never shown


@pytest.mark.anyio
async def test_userinfo_in_base_url_is_sent_as_basic_auth_and_never_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        assert "hunter2" not in str(request.url)
        return _json_response(503, {"error": "busy"})

    caplog.set_level(logging.DEBUG, logger="hermes_async")
    policy = RetryPolicy(max_attempts=2, initial_backoff_seconds=0.01)
    conn = ServerConnection(
        "http://admin:hunter2@m/v1",
        options=HTTPOptions(retry=policy),
        transport=httpx.MockTransport(handler),
    )
    assert "hunter2" not in conn.base_url
    async with conn:
        with pytest.raises(ServerStatusError) as info:
            await conn.post_json("/x", {})
    expected = "Basic " + base64.b64encode(b"admin:hunter2").decode()
    assert seen == [expected, expected]
    assert "hunter2" not in str(info.value)
    assert "hunter2" not in info.value.endpoint
    assert "retry 1/1" in caplog.text  # the warning was logged...
    assert "hunter2" not in caplog.text  # ...without the password


@pytest.mark.anyio
async def test_a_password_in_base_url_never_reaches_a_connect_error() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    policy = RetryPolicy(max_attempts=1)
    async with ServerConnection(
        f"http://user:s3cret-pw@127.0.0.1:{port}/v1", options=HTTPOptions(retry=policy)
    ) as conn:
        with pytest.raises(ServerConnectError, match="cannot connect") as info:
            await conn.post_json("/x", {})
    assert "s3cret-pw" not in str(info.value)
    assert f"127.0.0.1:{port}/v1/x" in str(info.value)


@pytest.mark.parametrize(
    ("url", "secret", "shown"),
    [
        ("ftp://user:pw-secret@h", "pw-secret", "'ftp://h'"),
        ("http://h/v1?api_key=sk-secret-1", "sk-secret-1", "'http://h/v1?api_key=[REDACTED]'"),
        ("http://u:pw-secret@h:notaport", "pw-secret", "'http://h:notaport'"),
    ],
)
def test_invalid_base_urls_are_named_without_their_credentials(
    url: str, secret: str, shown: str
) -> None:
    with pytest.raises(ValueError, match="model-server base_url") as info:
        ServerConnection(url)
    assert secret not in str(info.value)
    assert shown in str(info.value)


# ------------------------------------------------------------------ the probe


@pytest.mark.anyio
async def test_probe_server_returns_any_status_and_raises_when_unreachable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("GET", "/health")
        return httpx.Response(404)

    assert (
        await probe_server("http://m", timeout=1.0, transport=httpx.MockTransport(handler)) == 404
    )

    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ServerConnectError, match=rf"GET http://127.0.0.1:{port}/health"):
        await probe_server(f"http://127.0.0.1:{port}", timeout=1.0)


def test_http_options_repr_never_shows_a_header_value() -> None:
    # Before: the dataclass repr printed the headers (an Authorization bearer token, a proxy
    # key) into any log line or error that showed the options.
    options = HTTPOptions(headers={"Authorization": "Bearer sk-live-123", "X-Team": "rl"})
    for text in (repr(options), str(options), repr([options])):
        assert "sk-live-123" not in text and "'rl'" not in text
        assert "'Authorization': '<redacted>'" in text and "read_timeout=300.0" in text
    assert options.headers["Authorization"] == "Bearer sk-live-123"  # still sent as given


def test_sse_decoder_bounds_the_bytes_of_one_event_not_only_each_line() -> None:
    decoder = SSEDecoder(max_event_bytes=100)
    for _ in range(3):  # three lines of 30 bytes: 90, within the bound
        assert decoder.feed_line("data: " + "x" * 24) is None
    event = decoder.feed_line("")
    assert event is not None and len(event.data) == 3 * 24 + 2
    for _ in range(3):  # the count starts again with each event
        decoder.feed_line("data: " + "x" * 24)
    with pytest.raises(SSEEventTooLarge, match=r"max_event_bytes=100 bytes .*4 data lines"):
        decoder.feed_line("data: x", size=30)  # the size as received, not the characters
