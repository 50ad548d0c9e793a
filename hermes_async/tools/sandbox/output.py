"""Head + tail capture of a command's output: the one bounded buffer every backend uses.

Each stream keeps its first ``limit // 2`` bytes and its last ``limit - limit // 2``; the
middle is counted and replaced by ``... [N bytes of output omitted] ...``. The start says
what ran, the end is where a build or test run reports its failure. Memory per stream is
bounded by ``limit`` however much is printed.
"""

from __future__ import annotations

__all__ = ("OutputCapture",)


class OutputCapture:
    """Keep the first ``limit // 2`` and the last ``limit - limit // 2`` bytes of a stream.

    Args:
        limit: Bytes kept; ``None`` keeps everything (when the size is bounded elsewhere).

    Raises:
        ValueError: ``limit`` is negative.
    """

    __slots__ = ("_head", "_limit", "_tail", "dropped")

    def __init__(self, limit: int | None) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"output_limit must be >= 0 bytes or None, got {limit!r}")
        self._limit = limit
        self._head = bytearray()
        self._tail = bytearray()
        #: Bytes dropped from the middle so far.
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        """Append a chunk of output."""
        if self._limit is None:
            self._head += data
            return
        head_room = self._limit // 2 - len(self._head)
        if head_room > 0:
            self._head += data[:head_room]
            data = data[head_room:]
        if not data:
            return
        self._tail += data
        excess = len(self._tail) - (self._limit - self._limit // 2)
        if excess > 0:
            del self._tail[:excess]
            self.dropped += excess

    @property
    def truncated(self) -> bool:
        """Whether bytes were dropped from the middle."""
        return self.dropped > 0

    def _marker(self) -> bytes:
        return f"\n\n... [{self.dropped} bytes of output omitted] ...\n\n".encode()

    def value(self) -> bytes:
        """The kept bytes: head, then (if anything was dropped) the marker, then tail."""
        if not self.dropped:
            return bytes(self._head + self._tail)
        return bytes(self._head) + self._marker() + bytes(self._tail)

    def text(self) -> str:
        """The kept output as UTF-8 text (undecodable bytes replaced), with the marker.

        Head and tail are decoded apart, so a character cut in half garbles no neighbour.
        """
        if not self.dropped:
            return (self._head + self._tail).decode("utf-8", errors="replace")
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        return f"{head}{self._marker().decode()}{tail}"
