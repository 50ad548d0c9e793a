"""The exception tree of hermes_async.

An operator problem raises a :class:`HermesAsyncError`, one base per phase; a bad argument is
a plain ``TypeError`` / ``ValueError``; what the model causes is never raised from the loop but
shown to it. Each ``str()`` is built from the fields. The rules: docs/architecture.md, "Errors".
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
    """:func:`~hermes_async.parsers.get_parser` got an unregistered name; also a ``KeyError``.

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
    """A capacity limiter was configured incorrectly.

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
    """``limits[name]`` named no limiter; also a ``KeyError``.

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
    """A tool failed in a way the model should be told about (the dispatcher shows it)."""

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
    """A tool call exceeded its deadline and was cancelled."""

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
