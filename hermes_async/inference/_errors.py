"""Errors raised by the model-server clients (:mod:`~hermes_async.inference.generate`, ``chat``).

::

    InferenceError                      (hermes_async.errors)
     └─ ModelServerError                 endpoint, attempt, status, token_ids, logprobs, line
         ├─ ServerConnectError           could not connect (after the retries)
         ├─ ServerStatusError            HTTP status >= 400 (after the retries, if retryable)
         ├─ ServerTimeoutError           connect / read / pool / request deadline passed
         ├─ StreamInterruptedError       the response stopped before its end
         └─ ServerProtocolError          the response is not in the expected format

Every error carries the tokens received before it; nothing is retried once a token was handed
out. Reasons: docs/architecture.md ("Model-server errors and SSE").
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
        endpoint: ``METHOD URL`` of the request.
        attempt: Which attempt failed (1-based).
        line: The offending response line or body excerpt, for format errors.
        token_ids: Completion ids received before the failure.
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
        """A copy of this error carrying the tokens received before the failure."""
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
    """The server answered with an HTTP error status (429 and 5xx after the retries)."""


class ServerTimeoutError(ModelServerError):
    """A deadline passed; not a ``TimeoutError``, so a caller's own deadline stays distinct.

    Attributes:
        kind: ``"connect"``, ``"read"``, ``"pool"`` (no free connection) or ``"request"``.
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
    """The response stopped before its end (cut, or an error frame mid-stream)."""


class ServerProtocolError(ModelServerError):
    """The response is not what the protocol promises; ``line`` shows it."""
