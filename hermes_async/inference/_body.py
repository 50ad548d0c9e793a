"""Reading a response body under the read and request deadlines: whole, or line by line.

Every wait for body bytes is bounded by the read timeout and by what is left of the request
deadline. Transport failures while reading become the client errors here, once.
:class:`LineReader` splits a stream into lines in linear time, however the bytes are cut, and
refuses a line over ``HTTPOptions.max_line_bytes``, so memory stays bounded.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import anyio.lowlevel

from hermes_async.inference._errors import (
    ServerProtocolError,
    ServerTimeoutError,
    StreamInterruptedError,
)
from hermes_async.inference._transport import Response, TransportError, TransportTimeout

__all__ = (
    "BIG_LINE_BYTES",
    "BodyContext",
    "LineReader",
    "decode_line",
    "read_body",
    "read_excerpt",
)

#: Lines longer than this yield to the event loop between copying steps, so one huge line does
#: not stall every other rollout (each step copies the whole line once).
BIG_LINE_BYTES = 2**20

#: A blank line, with or without its carriage return.
_BLANK = (b"", b"\r")

#: Bytes of an over-long line quoted in the error.
_EXCERPT_BYTES = 200

#: Digits of a refused Content-Length shown in the error (a longer one is shown by its length).
_SHOWN_DIGITS = 30


@dataclass(frozen=True, slots=True)
class BodyContext:
    """What reading one response body needs to bound its waits and name its errors.

    ``deadline`` is on the ``anyio.current_time()`` clock; ``read_timeout`` is the longest
    silence between two pieces of the body.
    """

    endpoint: str
    attempt: int
    deadline: float
    read_timeout: float
    max_body_bytes: int


async def _receive_part(response: Response, context: BodyContext) -> bytes | None:
    """The next piece of a body (``None`` at its end), within both deadlines.

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
    """The whole body, at most ``context.max_body_bytes``.

    A longer ``Content-Length`` is refused before any body byte is read.

    **Cancellation**: safe; the response must still be closed.
    """
    limit = context.max_body_bytes
    declared = response.headers.get("content-length", "")
    # ASCII digits only: "²" is a digit to isdigit() but not to int(). Leading zeros go first:
    # int() refuses more than 4,300 digits, and a value with more digits than the limit is past it.
    if declared.isascii() and declared.isdigit():
        digits = declared.lstrip("0")
        if len(digits) > len(str(limit)) or int(digits or "0") > limit:
            shown = digits if len(digits) <= _SHOWN_DIGITS else f"{len(digits)}-digit"
            raise _body_too_large(response, context, f"a Content-Length of {shown} bytes")
    body = bytearray()  # one buffer (a list of parts and their join would hold it twice)
    while (part := await _receive_part(response, context)) is not None:
        body += part
        if len(body) > limit:
            raise _body_too_large(response, context, f"{len(body)}+ bytes")
    return bytes(body)


async def read_excerpt(response: Response, context: BodyContext, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes from the start of an error body, and whether that was all.

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

    Lines end at ``\\n`` only (a trailing ``\\r`` is stripped), never at the Unicode separators
    JSON strings may hold. Each byte is scanned once and copied at most twice; each line is
    decoded as UTF-8 once complete (invalid bytes become U+FFFD). ``line_bytes`` is the size of
    the last line returned.
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
        """Return the next line without its terminator, or ``None`` at the end of the body.

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
                return decode_line(raw) if len(raw) <= BIG_LINE_BYTES else await _assemble([raw])
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

    def ready_line(self) -> str | None:
        """The next line if it is already buffered and short, else ``None`` (no waiting).

        ``None`` does not mean the end of the body: :meth:`readline` says that.
        """
        lines = self._lines
        if self._joined is None and lines and len(lines[0]) <= BIG_LINE_BYTES:
            raw = lines.popleft()
            self.line_bytes = len(raw)
            return decode_line(raw)
        return None

    def ready_data_lines(self, max_bytes: float) -> Iterator[bytes]:
        """The buffered one-line ``data: {...`` events in a row, raw, each taken (with its
        blank line) as it is asked for: JSON objects of at most ``max_bytes``, up to the first
        line of any other kind. A caller that stops leaves the rest buffered."""
        lines = self._lines
        while self._joined is None and len(lines) >= 2 and lines[1] in _BLANK:
            raw = lines[0]
            if len(raw) > max_bytes or not raw.startswith(b"data: {"):
                return
            lines.popleft()
            lines.popleft()
            self.line_bytes = len(raw)
            yield raw

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
        """Close the response; the connection is reused only if the body was read to its end.

        **Cancellation**: shielded and bounded by the transport.
        """
        await self.response.aclose()


async def _assemble(pieces: list[bytes]) -> str:
    """Join and decode one line; a big one yields to the loop before and after decoding."""
    raw = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    if len(raw) <= BIG_LINE_BYTES:
        return decode_line(raw)
    await anyio.lowlevel.checkpoint()
    line = decode_line(raw)
    await anyio.lowlevel.checkpoint()
    return line


def decode_line(raw: bytes) -> str:
    """A raw line as :meth:`LineReader.readline` returns it."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    return raw.decode("utf-8", errors="replace")
