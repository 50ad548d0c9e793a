"""Server-Sent Events: line decoding (sans I/O), and the one SSE -> JSON loop of the clients.

:class:`SSEDecoder` turns lines into events; an unknown field raises :class:`SSEFormatError`
(stricter than the spec, on purpose). :class:`SSEJSONReader` decodes each event's data as JSON
up to ``data: [DONE]``; every client reads its stream through it. Why stricter, and the bounds:
docs/architecture.md ("Model-server errors and SSE").
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import anyio.lowlevel

from hermes_async._net import CLOSE_GRACE_SECONDS
from hermes_async.inference import _wirejson as wirejson
from hermes_async.inference._body import BIG_LINE_BYTES, LineReader, decode_line
from hermes_async.inference._errors import ModelServerError, ServerProtocolError
from hermes_async.jsontypes import JSON

__all__ = (
    "DRAIN_SECONDS",
    "SSEDecoder",
    "SSEEvent",
    "SSEEventTooLarge",
    "SSEFormatError",
    "SSEJSONReader",
)

#: Budget for reading the rest of a body after ``[DONE]`` (so its connection can be reused).
DRAIN_SECONDS = CLOSE_GRACE_SECONDS

_FIELDS = frozenset({"data", "event", "id", "retry"})

#: Characters of an offending line kept on the error (its ``str()`` shows 200 of them).
_EXCERPT_CHARS = 1000


class SSEFormatError(ValueError):
    """A line that is not valid (for our servers) SSE."""

    def __init__(self, message: str, line: str) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event.

    Attributes:
        data: The ``data`` lines joined with ``\\n``.
        last_line: The last ``data`` line as received (for error messages).
    """

    data: str
    event: str | None
    id: str | None
    last_line: str


class SSEEventTooLarge(SSEFormatError):
    """An event's ``data`` lines together are longer than the decoder's bound."""


class SSEDecoder:
    """Turn SSE lines into :class:`SSEEvent` objects.

    Args:
        max_event_bytes: Longest event: its ``data`` lines' sizes added up (``None``: no bound).
    """

    def __init__(self, *, max_event_bytes: int | None = None) -> None:
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._last_line = ""
        # No bound: a count no event reaches (one comparison per line either way).
        self.max_event_bytes: float = math.inf if max_event_bytes is None else max_event_bytes
        self._event_bytes = 0

    def feed_line(self, line: str, size: int | None = None) -> SSEEvent | None:
        """Feed one line (terminator stripped); return an event when ``line`` is blank.

        Args:
            size: Its size in bytes as received (default: its length).

        Raises:
            SSEFormatError: The line is not a comment or a known field, or the event is too long.
        """
        if not line:
            return self._dispatch()
        if line.startswith("data: "):  # the common case, with one copy of a long line
            self._event_bytes += len(line) if size is None else size
            if self._event_bytes > self.max_event_bytes:
                raise self._too_large(line)
            self._data.append(line[6:])
            self._last_line = line
            return None
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if not sep or name not in _FIELDS:
            raise SSEFormatError(
                "not a Server-Sent Events line (expected 'data: ...', 'event: ...', "
                "'id: ...', 'retry: ...' or a ': comment')",
                line,
            )
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._event_bytes += len(line) if size is None else size
            if self._event_bytes > self.max_event_bytes:
                raise self._too_large(line)
            self._data.append(value)
            self._last_line = line
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return None

    def _too_large(self, line: str) -> SSEEventTooLarge:
        limit = self.max_event_bytes
        return SSEEventTooLarge(
            f"an event is longer than HTTPOptions.max_event_bytes={limit} bytes "
            f"({limit / 2**20:.3g} MiB): {len(self._data) + 1} data lines without the "
            "blank line that ends an event",
            line,
        )

    @property
    def idle(self) -> bool:
        """No event is under way (no ``data`` or ``event`` line since the last dispatch)."""
        return not self._data and self._event is None

    def flush(self) -> SSEEvent | None:
        """End of stream: dispatch a final event that was not followed by a blank line."""
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        self._event_bytes = 0
        if not self._data:
            self._event = None
            return None
        event = SSEEvent("\n".join(self._data), self._event, self._id, self._last_line)
        self._data = []
        self._event = None
        return event


class SSEJSONReader:
    """The JSON payloads of a Server-Sent Events body, one per event, up to ``[DONE]``.

    Attributes:
        saw_done: The stream ended with ``data: [DONE]`` (not merely with the body).
    """

    def __init__(self, reader: LineReader, *, max_event_bytes: int) -> None:
        self._reader = reader
        self._sse = SSEDecoder(max_event_bytes=max_event_bytes)
        self._ended = False
        self.saw_done = False
        # Left by next_ready() for next(): ``[DONE]`` (drained there) or a long event.
        self._done_seen = False
        self._held: SSEEvent | None = None

    async def next(self) -> tuple[JSON, str] | None:
        """The next payload and the ``data`` line it came from; ``None`` at the end.

        After ``[DONE]`` the rest of the body is drained (bounded) so the connection is reused.

        Raises:
            ServerProtocolError: A line that is not SSE, or data that is not JSON.

        **Cancellation**: safe; closing the response is the caller's.
        """
        if self._ended:
            return None
        event, self._held = self._held, None
        if event is None and not self._done_seen:
            while True:
                line = await self._reader.readline()
                event = self._feed(line)
                if event is not None:
                    break
                if line is None:
                    self._ended = True
                    return None
        if event is None or _is_done(event.data):
            self._ended = self.saw_done = True
            await self._drain()
            return None
        if len(event.data) > BIG_LINE_BYTES:
            await anyio.lowlevel.checkpoint()  # a turn for the loop before a long decode
        return self._decoded(event.data, event.last_line)

    def next_ready(self) -> tuple[JSON, str] | None:
        """The next payload if its lines are already buffered: no waiting, no yield.

        ``None``: call :meth:`next` (which also ends the stream at ``[DONE]``).

        Raises:
            ServerProtocolError: As :meth:`next`.
        """
        if self._ended or self._done_seen or self._held is not None:
            return None
        reader = self._reader
        # (The common event, one line of JSON, comes through ready_lines() without this.)
        while True:
            if (line := reader.ready_line()) is None:
                return None
            if (event := self._feed(line)) is not None:
                break
        assert event is not None  # the loop ends on an event
        if _is_done(event.data):
            self._done_seen = True
            return None
        if len(event.data) > BIG_LINE_BYTES:
            self._held = event
            return None
        return self._decoded(event.data, event.last_line)

    def ready_lines(self) -> Iterator[bytes]:
        """The buffered one-line JSON-object events :meth:`next_ready` would give, as raw
        ``data:`` lines taken one by one as asked for; decode each with :meth:`decoded_line`.

        Empty where :meth:`next_ready` decides (any other line, ``[DONE]`` included).
        """
        sse = self._sse
        if self._ended or self._done_seen or self._held is not None or not sse.idle:
            return iter(())
        # A line over max_event_bytes is left for next_ready(), which refuses it.
        return self._reader.ready_data_lines(min(BIG_LINE_BYTES, sse.max_event_bytes))

    def decoded_line(self, raw: bytes) -> JSON:
        """The payload of a line from :meth:`ready_lines`, as :meth:`next_ready` decodes it.

        Raises:
            ServerProtocolError: As :meth:`next`.
        """
        value = wirejson.loads_data_line(raw)
        if value is wirejson.UNDECIDED:
            line = decode_line(raw)
            return self._decoded(line[6:], line)[0]
        return value

    def _feed(self, line: str | None) -> SSEEvent | None:
        """Feed one line (``None``: the body ended); the event it completes, if any."""
        try:
            if line is None:
                return self._sse.flush()
            return self._sse.feed_line(line, self._reader.line_bytes)
        except SSEEventTooLarge as exc:
            self._ended = True
            raise self.protocol_error(str(exc), exc.line[:_EXCERPT_CHARS]) from None
        except SSEFormatError as exc:
            self._ended = True
            raise self.protocol_error(
                f"malformed Server-Sent Events stream: {exc}", exc.line
            ) from None

    def _decoded(self, data: str, line: str) -> tuple[JSON, str]:
        """An event's ``data`` decoded, and its last ``data`` line (for errors)."""
        try:
            return wirejson.loads(data), line
        except ValueError as exc:
            self._ended = True
            raise self.protocol_error(f"stream chunk is not valid JSON ({exc})", line) from None

    def protocol_error(self, message: str, line: str) -> ServerProtocolError:
        return ServerProtocolError(
            message,
            endpoint=self._reader.endpoint,
            attempt=self._reader.attempt,
            status=self._reader.response.status_code,
            line=line,
        )

    async def _drain(self) -> None:
        reader = self._reader
        if reader.response.body_received:  # reading it never waits: no timer
            await self._read_rest()
            return
        with anyio.move_on_after(DRAIN_SECONDS):
            await self._read_rest()

    async def _read_rest(self) -> None:
        try:
            while await self._reader.readline() is not None:
                pass
        except ModelServerError:  # the stream already ended well; only reuse is lost
            pass


def _is_done(data: str) -> bool:
    """Whether an event's ``data`` is the end-of-stream marker."""
    return data.strip() == "[DONE]"
