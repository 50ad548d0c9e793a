"""Reading a response body under the read and request deadlines: whole, or line by line.

Every wait for body bytes is bounded twice: by the read timeout (the longest silence between
two pieces) and by what is left of the request deadline, whichever comes first. Transport
failures while reading are translated here, once, into the client errors
(:class:`~hermes_async.inference._errors.ServerTimeoutError`,
:class:`~hermes_async.inference._errors.StreamInterruptedError`).

:class:`LineReader` splits a streamed body into lines in linear time, however the bytes are cut:
each byte is scanned for ``\\n`` once and copied at most twice (into the pending pieces of an
unfinished line, then into the joined line). One line may not exceed ``max_line_bytes``
(:attr:`HTTPOptions.max_line_bytes <hermes_async.inference.HTTPOptions.max_line_bytes>`, 16 MiB by
default): past it the read stops with a :class:`~hermes_async.inference.ServerProtocolError`
naming the cap, so memory stays bounded whatever the server sends. A line of more than
:data:`BIG_LINE_BYTES` gives the event loop a turn between joining and decoding it (each step
copies the whole line once), so one huge line does not stall every other rollout for the sum of
them.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import anyio
import anyio.lowlevel

from hermes_async.inference._errors import (
    ServerProtocolError,
    ServerTimeoutError,
    StreamInterruptedError,
)
from hermes_async.inference._transport import Response, TransportError, TransportTimeout

__all__ = ("BIG_LINE_BYTES", "BodyContext", "LineReader", "read_body", "read_excerpt")

#: Lines longer than this yield to the event loop between copying steps (see the module doc).
BIG_LINE_BYTES = 2**20

#: Bytes of an over-long line quoted in the error.
_EXCERPT_BYTES = 200


@dataclass(frozen=True, slots=True)
class BodyContext:
    """What reading one response body needs to bound its waits and name its errors.

    Attributes:
        endpoint: ``METHOD URL`` of the request (credentials redacted).
        attempt: The attempt that got this response.
        deadline: The request deadline (``anyio.current_time()`` clock).
        read_timeout: Longest silence allowed between two pieces of the body.
        max_body_bytes: Longest body :func:`read_body` holds
            (:attr:`HTTPOptions.max_body_bytes <hermes_async.inference.HTTPOptions.max_body_bytes>`).
    """

    endpoint: str
    attempt: int
    deadline: float
    read_timeout: float
    max_body_bytes: int


async def _receive_part(response: Response, context: BodyContext) -> bytes | None:
    """The next piece of a response body (``None`` at its end), within the read timeout and
    the request deadline, with transport errors translated.

    Raises:
        ServerTimeoutError: ``kind="read"`` or ``"request"``.
        StreamInterruptedError: The body was cut.

    **Cancellation**: safe; the response must still be closed.
    """
    remaining = context.deadline - anyio.current_time()
    if context.read_timeout <= remaining:
        timeout, kind = context.read_timeout, "read"
    else:
        timeout, kind = max(remaining, 0.0), "request"
    cause: TransportTimeout | None = None
    try:
        # The timeout applies to waiting on the network only: buffered data comes at once.
        return await response.receive_some(timeout)
    except TimeoutError:
        seconds = timeout
        what = (
            f"no data for {timeout:g} s (read timeout)"
            if kind == "read"
            else "the request deadline passed while reading the response"
        )
        message = f"{what}; the server stalled or is overloaded"
    except TransportTimeout as exc:  # the transport's own read timeout
        cause, kind, seconds = exc, exc.kind, exc.seconds
        message = f"{exc.kind} timeout after {exc.seconds:g} s"
    except TransportError as exc:
        raise StreamInterruptedError(
            f"the connection was closed before the response body ended ({exc})",
            endpoint=context.endpoint,
            attempt=context.attempt,
            status=response.status_code,
        ) from exc
    raise ServerTimeoutError(
        message,
        kind=kind,
        timeout=seconds,
        endpoint=context.endpoint,
        attempt=context.attempt,
    ) from cause


async def read_body(response: Response, context: BodyContext) -> bytes:
    """The whole body, each wait bounded as in :func:`_receive_part`, its size by
    ``context.max_body_bytes``.

    Raises:
        ServerProtocolError: The body (or its ``Content-Length``) is longer than the bound;
            a declared length is refused before any body byte is read.
        ServerTimeoutError, StreamInterruptedError: As for :func:`_receive_part`.

    **Cancellation**: safe; the response must still be closed.
    """
    limit = context.max_body_bytes
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _body_too_large(response, context, f"a Content-Length of {int(declared)} bytes")
    body = bytearray()  # one buffer (a list of parts and their join would hold it twice)
    while (part := await _receive_part(response, context)) is not None:
        body += part
        if len(body) > limit:
            raise _body_too_large(response, context, f"{len(body)}+ bytes")
    return bytes(body)


async def read_excerpt(response: Response, context: BodyContext, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes from the start of the body, and whether that was all of it.

    For an error response, whose body only goes into a message: the rest is never read (close
    the response, which drops the connection unless the body ended).

    **Cancellation**: safe; the response must still be closed.
    """
    body = bytearray()
    while len(body) < limit:
        part = await _receive_part(response, context)
        if part is None:
            return bytes(body), True
        body += part
    return bytes(body[:limit]), False


def _body_too_large(response: Response, context: BodyContext, size: str) -> ServerProtocolError:
    cap = context.max_body_bytes
    return ServerProtocolError(
        f"the response body is longer than HTTPOptions.max_body_bytes={cap} bytes "
        f"({cap / 2**20:.3g} MiB): the server sent {size}. Raise HTTPOptions.max_body_bytes "
        "if the server really sends bodies this long, or check that base_url points at a "
        "model server",
        endpoint=context.endpoint,
        attempt=context.attempt,
        status=response.status_code,
    )


class LineReader:
    """Lines of a streamed response body, each read under the read and request deadlines.

    Lines are split on ``\\n`` only (a trailing ``\\r`` is stripped), never on the other Unicode
    line separators that may legitimately appear inside JSON strings. Each line is decoded as
    UTF-8 once it is complete (invalid bytes become U+FFFD); ``\\n`` never occurs inside a
    multi-byte UTF-8 sequence, so splitting the bytes first is exact.

    Args:
        response: The response to read.
        context: Deadlines and the endpoint for errors.
        max_line_bytes: The longest line accepted, in bytes (terminator excluded).

    Attributes:
        response: The response being read.
        endpoint: ``METHOD URL`` of the request.
        attempt: The attempt that got this response.
        line_bytes: Size in bytes of the last line returned (before decoding).
    """

    def __init__(self, response: Response, context: BodyContext, *, max_line_bytes: int) -> None:
        self.response = response
        self.endpoint = context.endpoint
        self.attempt = context.attempt
        self._context = context
        self._max_line_bytes = max_line_bytes
        self._eof = False
        self._lines: collections.deque[bytes] = collections.deque()
        # The unfinished last line: its pieces (joined once, when its end arrives) and size.
        self._pending: list[bytes] = []
        self._pending_size = 0
        # A line completed from pending pieces, returned before the lines in ``_lines``.
        self._joined: list[bytes] | None = None
        self.line_bytes = 0

    async def readline(self) -> str | None:
        """Return the next line (terminator stripped), or ``None`` at the end of the body.

        Raises:
            ServerTimeoutError: The read or request deadline passed.
            StreamInterruptedError: The connection was closed mid-body.
            ServerProtocolError: A line is longer than ``max_line_bytes``.

        **Cancellation**: safe; the reader can still be closed afterwards.
        """
        while True:
            if self._joined is not None:
                pieces, self._joined = self._joined, None
                self.line_bytes = sum(map(len, pieces))
                return await _assemble(pieces)
            if self._lines:
                raw = self._lines.popleft()
                self.line_bytes = len(raw)
                return _decode(raw) if len(raw) <= BIG_LINE_BYTES else await _assemble([raw])
            if self._eof:
                if not self._pending:
                    return None
                pieces, self._pending = self._pending, []
                self.line_bytes, self._pending_size = self._pending_size, 0
                return await _assemble(pieces)
            chunk = await _receive_part(self.response, self._context)
            if chunk is None:
                self._eof = True
            elif chunk:
                self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        """Split ``chunk`` into complete lines and the pending (unfinished) one."""
        limit = self._max_line_bytes
        if b"\n" not in chunk:
            self._pending.append(chunk)
            self._pending_size += len(chunk)
            if self._pending_size > limit:
                self._too_long(self._pending[0], self._pending_size)
            return
        pieces = chunk.split(b"\n")
        tail = pieces.pop()
        if self._pending:  # the first piece ends the pending line
            first = pieces.pop(0)
            if self._pending_size + len(first) > limit:
                self._too_long(self._pending[0], self._pending_size + len(first))
            self._pending.append(first)
            self._joined = self._pending
        for piece in pieces:
            if len(piece) > limit:
                self._too_long(piece, len(piece))
        self._lines.extend(pieces)
        self._pending = [tail] if tail else []
        self._pending_size = len(tail)
        if self._pending_size > limit:
            self._too_long(tail, self._pending_size)

    def _too_long(self, line_start: bytes, size: int) -> None:
        cap = self._max_line_bytes
        raise ServerProtocolError(
            f"a response line is longer than HTTPOptions.max_line_bytes={cap} bytes "
            f"({cap / 2**20:.3g} MiB): the server sent a line of {size}+ bytes. Raise "
            "HTTPOptions.max_line_bytes if the server really sends lines this long, or check "
            "that base_url points at a model server",
            endpoint=self.endpoint,
            attempt=self.attempt,
            status=self.response.status_code,
            line=line_start[:_EXCERPT_BYTES].decode("utf-8", errors="replace"),
        )

    async def aclose(self) -> None:
        """Close the response (the connection is reused only if the body was read to its end).

        **Cancellation**: shielded and bounded by the transport.
        """
        await self.response.aclose()


async def _assemble(pieces: list[bytes]) -> str:
    """Join and decode one line; a big one yields to the loop before and after decoding."""
    raw = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    if len(raw) <= BIG_LINE_BYTES:
        return _decode(raw)
    await anyio.lowlevel.checkpoint()
    line = _decode(raw)
    await anyio.lowlevel.checkpoint()
    return line


def _decode(raw: bytes) -> str:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    return raw.decode("utf-8", errors="replace")
