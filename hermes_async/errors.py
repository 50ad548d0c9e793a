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
"""

from __future__ import annotations

__all__ = [
    "AsyncBackendError",
    "ConfigError",
    "HermesAsyncError",
    "InferenceError",
    "LimitError",
    "ParseError",
    "SandboxError",
    "ToolArgumentsError",
    "ToolExecutionError",
    "ToolTimeoutError",
]


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


class ParseError(HermesAsyncError):
    """Model output could not be parsed where the caller asked for a strict parse."""

    phase = "parse"


class SandboxError(HermesAsyncError):
    """A sandbox could not be created, reached, or cleaned up."""

    phase = "sandbox"


class LimitError(HermesAsyncError):
    """A capacity limiter was used or configured incorrectly."""

    phase = "limit"


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
        timeout_seconds: The deadline that passed.
    """

    def __init__(
        self, tool_name: str, timeout_seconds: float, *, task_id: str | None = None
    ) -> None:
        super().__init__(
            f"Tool '{tool_name}' timed out after {timeout_seconds:g} seconds and was cancelled",
            task_id=task_id,
        )
        self.tool_name = tool_name
        self.timeout_seconds = timeout_seconds
