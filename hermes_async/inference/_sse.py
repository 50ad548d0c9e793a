"""Server-Sent Events line decoding, sans I/O.

The model servers speak a small subset of SSE::

    data: {"choices": [{"token_ids": [9707, 11], ...}]}
    <blank line>
    data: [DONE]
    <blank line>

Lines are fed one at a time (without their line terminator); a blank line dispatches the event
collected so far. Multi-line ``data`` fields are joined with ``\\n`` as the spec says.

Deliberately stricter than the SSE spec: a line that is neither a comment (``: ...``) nor one of
the four known fields (``data``, ``event``, ``id``, ``retry``) raises :class:`SSEFormatError`
instead of being ignored. Model servers never send such lines; when one appears it is a server
speaking another format (raw JSON lines, an HTML error page), and silently ignoring it would
turn a clear error into a confusing "stream ended without tokens" later.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent", "SSEFormatError"]

_FIELDS = frozenset({"data", "event", "id", "retry"})


class SSEFormatError(ValueError):
    """A line that is not valid (for our servers) SSE.

    Attributes:
        line: The offending line.
    """

    def __init__(self, message: str, line: str) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event.

    Attributes:
        data: The ``data`` lines joined with ``\\n``.
        event: The ``event`` field, if any.
        id: The ``id`` field, if any.
        last_line: The last ``data`` line as received (for error messages).
    """

    data: str
    event: str | None
    id: str | None
    last_line: str


class SSEDecoder:
    """Turn SSE lines into :class:`SSEEvent` objects."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._last_line = ""

    def feed_line(self, line: str) -> SSEEvent | None:
        """Feed one line (terminator stripped); return an event when ``line`` is blank.

        Raises:
            SSEFormatError: The line is not a comment or a known field.
        """
        if not line:
            return self._dispatch()
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
            self._data.append(value)
            self._last_line = line
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return None

    def flush(self) -> SSEEvent | None:
        """End of stream: dispatch a final event that was not followed by a blank line."""
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event = None
            return None
        event = SSEEvent("\n".join(self._data), self._event, self._id, self._last_line)
        self._data = []
        self._event = None
        return event
