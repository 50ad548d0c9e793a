"""Errors raised by the model-server clients (:mod:`~hermes_async.inference.generate`, ``chat``).

::

    InferenceError                      (hermes_async.errors)
     └─ ModelServerError                 endpoint, attempt, status, token_ids, logprobs, line
         ├─ ServerConnectError           could not connect (after the retries)
         ├─ ServerStatusError            HTTP status >= 400 (after the retries, if retryable)
         ├─ ServerTimeoutError           connect / read / pool / request deadline passed
         ├─ StreamInterruptedError       the response stopped before its end
         └─ ServerProtocolError          the response is not in the expected format

Every error names the endpoint, and carries the completion tokens received before it happened
(``token_ids`` / ``logprobs``; empty when none were), so a trainer can decide what to keep. The
clients never retry once a token was handed out: a retry would sample a different continuation
and the tokens already consumed would be silently duplicated or contradicted.

:class:`ServerTimeoutError` is deliberately *not* a ``TimeoutError``: a caller's own
``anyio.fail_after`` around a model call must stay distinguishable from the client's deadline.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Self

from hermes_async.errors import InferenceError

__all__ = (
    "DECODE_FAILURES",
    "ModelServerError",
    "ServerConnectError",
    "ServerProtocolError",
    "ServerStatusError",
    "ServerTimeoutError",
    "StreamInterruptedError",
)

_LINE_EXCERPT_CHARS = 200

#: What reading a server's decoded JSON into our types can raise on hostile values: a wrong
#: type or a missing key, ``int(1e999)`` (``OverflowError``), a value nested so deep that its
#: ``repr`` or ``json.dumps`` recurses past the interpreter's limit. Each is the server's
#: protocol failure, never a crash of the caller.
DECODE_FAILURES = (ValueError, TypeError, LookupError, ArithmeticError, RecursionError)


class ModelServerError(InferenceError):
    """A model-server request failed; base of every client error.

    Args:
        message: What went wrong and what to do.
        endpoint: ``METHOD URL`` of the request.
        attempt: Which attempt failed (1-based); retries happen before this error is raised.
        status: The HTTP status, when a response arrived.
        line: The offending response line or body excerpt, for format errors.
        token_ids: Completion ids received before the failure.
        logprobs: Their logprobs, aligned with ``token_ids``.
    """

    def __init__(
        self,
        message: str,
        *,
        endpoint: str,
        attempt: int = 1,
        status: int | None = None,
        line: str | None = None,
        token_ids: Sequence[int] = (),
        logprobs: Sequence[float] = (),
    ) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.attempt = attempt
        self.status = status
        self.line = line
        self.token_ids: tuple[int, ...] = tuple(token_ids)
        self.logprobs: tuple[float, ...] = tuple(logprobs)

    def with_partial(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> Self:
        """A copy of this error carrying the tokens received before the failure.

        The stream layer that knows the tokens is above the layer that saw the failure; it
        raises the copy (``raise exc.with_partial(...) from exc.__cause__``), so an error is
        never changed after it was raised.
        """
        clone = copy.copy(self)
        clone.token_ids = tuple(token_ids)
        clone.logprobs = tuple(logprobs)
        return clone

    def __copy__(self) -> Self:
        clone = type(self).__new__(type(self))
        Exception.__init__(clone, *self.args)
        clone.__dict__.update(self.__dict__)
        return clone

    def __str__(self) -> str:
        parts = [f"{self.endpoint}: {self.message}"]
        if self.status is not None:
            parts.append(f"HTTP status {self.status}")
        if self.attempt > 1:
            parts.append(f"attempt {self.attempt}")
        if self.token_ids:
            parts.append(f"after {len(self.token_ids)} completion tokens")
        text = "; ".join(parts)
        if self.line is not None:
            excerpt = self.line
            if len(excerpt) > _LINE_EXCERPT_CHARS:
                excerpt = excerpt[:_LINE_EXCERPT_CHARS] + f"... ({len(self.line)} chars)"
            text += f"; offending line: {excerpt!r}"
        return text


class ServerConnectError(ModelServerError):
    """The server could not be reached (refused, reset, DNS, TLS), even after retrying."""


class ServerStatusError(ModelServerError):
    """The server answered with an HTTP error status.

    429 and 5xx are retried before this is raised; other 4xx (a bad request, a wrong route or
    key) are raised at once because repeating them cannot help.
    """


class ServerTimeoutError(ModelServerError):
    """A deadline passed.

    Attributes:
        kind: ``"connect"``, ``"read"`` (silence between bytes longer than the read timeout),
            ``"pool"`` (no free connection) or ``"request"`` (the overall request deadline).
        timeout: The deadline that passed.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        timeout: float,
        endpoint: str,
        attempt: int = 1,
        token_ids: Sequence[int] = (),
        logprobs: Sequence[float] = (),
    ) -> None:
        super().__init__(
            message, endpoint=endpoint, attempt=attempt, token_ids=token_ids, logprobs=logprobs
        )
        self.kind = kind
        self.timeout = timeout


class StreamInterruptedError(ModelServerError):
    """The response stopped before its end: the connection was cut, or the server sent an
    error frame mid-stream. ``token_ids`` holds what arrived before; nothing was retried."""


class ServerProtocolError(ModelServerError):
    """The response is not what the protocol promises: a malformed SSE line, invalid JSON, a
    missing field, or a chunk whose ids and logprobs differ in length. ``line`` shows it."""
