"""The exception tree of hermes_async.

Every exception the library raises for an *operator* problem (a server that does not answer, a
sandbox that cannot start, a limiter misconfigured) derives from :class:`HermesAsyncError`, with
one base class per phase so callers can catch "anything the model server did" without listing
transport details. Programmer mistakes (a bad argument to a public function) are plain
``TypeError`` / ``ValueError`` subclasses instead: they are bugs to fix, not conditions to handle.

Failures the *model* causes (unknown tool, invalid JSON arguments, a command that exits non-zero,
a tool that times out) are never raised from the agent loop: they become a model-visible message
and a :class:`~hermes_async.agent.ToolError` record. The classes below that describe such
failures (:class:`ToolArgumentsError`, :class:`ToolTimeoutError`) exist so tool handlers can
signal them precisely; the dispatcher turns them into observations.

Each exception carries structured fields and builds ``str()`` from them, so a log line and a
``pytest.raises(match=...)`` see the same text.

Decisions (issue 13):

* Operator mistakes in configuration raise :class:`ConfigError` (a ``ValueError``). Where the
  mistake is a lookup that reference code catches as ``KeyError`` -- an unknown tool-call
  parser (``get_parser("hermez")``), an unknown limiter (``limits["nope"]``) -- the error is
  *also* a ``KeyError`` (:class:`UnknownParserError`, :class:`UnknownLimiterError`), so both
  spellings of the ``except`` keep working.
* :class:`LimitError` is the category of limiter mistakes (a total that is not an integer
  >= 1, an unknown limiter name) and a :class:`ConfigError`.
* Model output is never raised: a malformed call is a
  :class:`~hermes_async.parsers.ToolCallInvalid` event for the model.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = (
    "AsyncBackendError",
    "ConfigError",
    "HermesAsyncError",
    "InferenceError",
    "LimitError",
    "RequestError",
    "SandboxError",
    "ToolArgumentsError",
    "ToolExecutionError",
    "ToolTimeoutError",
    "UnknownLimiterError",
    "UnknownParserError",
    "WorkerError",
)


class HermesAsyncError(Exception):
    """Root of every operator-facing error raised by hermes_async.

    Args:
        message: What went wrong, the offending value, and what to do about it.
        phase: Where it happened (``"inference"``, ``"sandbox"``, ``"tool"``, ...).
        task_id: The rollout's task id, when the error belongs to one.
    """

    phase: str = "general"

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id

    def __str__(self) -> str:
        if self.task_id is not None:
            return f"{self.message} (task_id={self.task_id!r})"
        return self.message


class ConfigError(HermesAsyncError, ValueError):
    """A configuration value is invalid or a required component is missing (an extra, a file)."""

    phase = "config"


class AsyncBackendError(ConfigError, RuntimeError):
    """An asyncio-only component (atroposlib, aiodocker, Modal) was used under another library.

    Attributes:
        library: The async library that was running (``"trio"``).
    """

    def __init__(self, message: str, *, library: str, task_id: str | None = None) -> None:
        super().__init__(message, task_id=task_id)
        self.library = library


class InferenceError(HermesAsyncError):
    """The model server could not be reached, failed, or answered something unreadable."""

    phase = "inference"


class UnknownParserError(ConfigError, KeyError):
    """:func:`~hermes_async.parsers.get_parser` was given a name nobody registered.

    A :class:`ConfigError` that is also a ``KeyError`` (what the reference raised, and what
    code written for it catches).

    Attributes:
        name: The name asked for.
        available: The registered names, sorted.
    """

    def __init__(self, name: str, available: Iterable[str]) -> None:
        self.name = name
        self.available = tuple(sorted(available))
        super().__init__(
            f"unknown tool-call parser {name!r}; available: {', '.join(self.available)}; "
            "register another with @hermes_async.parsers.register_parser"
        )


class SandboxError(HermesAsyncError):
    """A sandbox could not be created, reached, or cleaned up."""

    phase = "sandbox"


class LimitError(ConfigError):
    """A capacity limiter was configured incorrectly (a bad total, an unknown name).

    Attributes:
        limiter: The limiter's name.
        value: The offending value (the total, or the unknown name).
    """

    phase = "limit"

    def __init__(self, message: str, *, limiter: str, value: object) -> None:
        super().__init__(message)
        self.limiter = limiter
        self.value = value


class UnknownLimiterError(LimitError, KeyError):
    """``limits[name]`` named no limiter (a :class:`LimitError` that is also a ``KeyError``).

    Attributes:
        available: The limiters that exist, sorted.
    """

    def __init__(self, name: str, available: Iterable[str]) -> None:
        self.available = tuple(sorted(available))
        super().__init__(
            f"unknown limiter {name!r}; available: {', '.join(self.available)}; add it with "
            f"limits.add({name!r}, total)",
            limiter=name,
            value=name,
        )


class ToolExecutionError(HermesAsyncError):
    """A tool failed in a way the model should be told about.

    The dispatcher converts it into ``{"error": str(exc)}`` for the model and a ``ToolError``
    record; it never escapes the agent loop.
    """

    phase = "tool"


class ToolArgumentsError(ToolExecutionError, ValueError):
    """Tool-call arguments do not match the tool's schema.

    Args:
        message: The problem, naming the field.
        field: JSON path of the offending field (``"$"`` for the whole object).
    """

    def __init__(self, message: str, *, field: str = "$", task_id: str | None = None) -> None:
        super().__init__(message, task_id=task_id)
        self.field = field


class ToolTimeoutError(ToolExecutionError):
    """A tool call exceeded its deadline and was cancelled.

    Args:
        tool_name: The tool that timed out.
        timeout: The deadline that passed.
    """

    def __init__(self, tool_name: str, timeout: float, *, task_id: str | None = None) -> None:
        super().__init__(
            f"Tool '{tool_name}' timed out after {timeout:g} seconds and was cancelled",
            task_id=task_id,
        )
        self.tool_name = tool_name
        self.timeout = timeout


class WorkerError(HermesAsyncError):
    """A rollout worker (the service or a Ray actor) could not take or finish a group."""

    phase = "worker"


class RequestError(WorkerError, ValueError):
    """A request to a rollout worker is malformed or out of bounds: the caller's to fix.

    Attributes:
        status: The HTTP status the worker answers with (400, 404, 409, 413, 422, 503).
    """

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
