"""Server-level misbehaviour in front of any ASGI model server, switchable while it runs.

:class:`ScriptedModelServer`'s faults target single requests; :class:`FaultyServer` makes a
whole server fail, rate limit, slow down or go down from now on, for pool and failover tests.
docs/architecture.md ("The testing kit") shows every mode.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

__all__ = ("FaultyServer",)

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_App = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


class FaultyServer:
    """ASGI middleware: switchable failing / rate-limiting / slow / down modes.

    While a mode is on it answers every ``POST`` itself; ``GET`` routes pass through, except
    in ``down`` mode.

    Attributes:
        statuses: Generation requests answered with each status (the app's own count as 200).
        peak_concurrency: The most at once since the last :meth:`reset_counts`.
        timeline: ``(clock time, status)`` of every generation request answered.
    """

    def __init__(self, app: _App, *, name: str = "") -> None:
        self.app = app
        self.name = name
        self.mode = "ok"
        self._status = 500
        self._body: bytes | None = None
        self._content_type = b"application/json"
        self._retry_after: float | None = None
        self._above: int | None = None
        self.delay_seconds = 0.0
        self._paused = False
        self._gate: anyio.Event | None = None
        self.statuses: Counter[int] = Counter()
        self.concurrency = 0
        self.peak_concurrency = 0
        self.timeline: list[tuple[float, int]] = []

    # ------------------------------------------------------------------ modes

    def heal(self) -> None:
        """Serve normally again (a ``slow`` delay is kept; ``slow(0)`` removes it)."""
        self.mode = "ok"

    def fail(
        self,
        status: int = 500,
        *,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> None:
        """Answer every generation request with ``status`` (200 too); health checks pass.

        Args:
            body: The body (default: a JSON error object naming the status).
        """
        self.mode, self._status = "fail", status
        self._body, self._content_type = body, content_type.encode("latin-1")

    def down(self) -> None:
        """Answer every request, health checks included, with 503."""
        self.mode = "down"

    def rate_limit(self, retry_after: float | None = 0.5, *, above: int | None = None) -> None:
        """Answer 429 to every generation request, or only beyond ``above`` concurrent ones."""
        self.mode, self._retry_after, self._above = "rate_limit", retry_after, above

    def slow(self, seconds: float) -> None:
        """Wait ``seconds`` before passing each generation request on."""
        self.delay_seconds = seconds

    def pause(self) -> None:
        """Hold every generation request (a hung server) until :meth:`resume`."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        if self._gate is not None:
            self._gate.set()
            self._gate = None

    def reset_counts(self) -> None:
        """Forget the counters, not the mode."""
        self.statuses.clear()
        self.peak_concurrency = self.concurrency
        self.timeline.clear()

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        """ASGI entry point.

        **Cancellation**: a request cancelled mid-answer stops there; counters stay consistent.
        """
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.mode == "down":
            await _answer(send, 503, "injected: server down", None)
            if scope["method"] == "POST":
                self._count(503)
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        self.concurrency += 1
        self.peak_concurrency = max(self.peak_concurrency, self.concurrency)
        try:
            if self.mode == "fail":
                await _drain(receive)
                if self._body is None:
                    await _answer(send, self._status, f"injected HTTP {self._status}", None)
                else:
                    await _send_body(send, self._status, self._body, self._content_type)
                self._count(self._status)
                return
            if self.mode == "rate_limit" and (
                self._above is None or self.concurrency > self._above
            ):
                await _drain(receive)
                await _answer(send, 429, "injected rate limit", self._retry_after)
                self._count(429)
                return
            if self._paused:
                if self._gate is None:
                    self._gate = anyio.Event()
                await self._gate.wait()
            if self.delay_seconds:
                await anyio.sleep(self.delay_seconds)
            await self.app(scope, receive, send)
            self._count(200)
        finally:
            self.concurrency -= 1

    def _count(self, status: int) -> None:
        self.statuses[status] += 1
        self.timeline.append((anyio.current_time(), status))


async def _drain(receive: _Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


async def _answer(send: _Send, status: int, message: str, retry_after: float | None) -> None:
    data = json.dumps({"error": {"message": message, "code": status}}).encode()
    headers = []
    if retry_after is not None:
        headers.append((b"retry-after", f"{retry_after:g}".encode()))
    await _send_body(send, status, data, b"application/json", headers)


async def _send_body(
    send: _Send,
    status: int,
    data: bytes,
    content_type: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    all_headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(data)).encode()),
        *(headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})
