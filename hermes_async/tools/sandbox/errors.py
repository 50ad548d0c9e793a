"""The sandbox package's own errors: a sandbox that is gone, a transfer past its cap.

A failed command is an ``ExecResult`` for the model; a gone sandbox is
:class:`SandboxUnavailableError`, an ``infra`` failure of the rollout.
"""

from __future__ import annotations

from typing import Final, Literal

from hermes_async.errors import SandboxError

__all__ = (
    "UNAVAILABLE_REASONS",
    "NotARegularFileError",
    "SandboxUnavailableError",
    "TransferLimitError",
    "UnavailableReason",
)

#: Why a sandbox is gone.
UnavailableReason = Literal["oom", "disk", "exited", "unreachable"]

#: What each :data:`UnavailableReason` means, as the model and the operator are told.
UNAVAILABLE_REASONS: Final[dict[str, str]] = {
    "oom": "it ran out of memory (its memory limit) and the kernel killed it",
    "disk": "it exceeded its disk cap and was stopped",
    "exited": "it stopped (its init process or container is no longer running)",
    "unreachable": "its backend lost it (the container or remote sandbox no longer answers)",
}


class SandboxUnavailableError(SandboxError):
    """The sandbox itself is gone: nothing more can run in it, its files are lost.

    Every later operation raises it again; ``SandboxManager.sandbox_failure`` keeps the first
    per task, so the rollout records an ``infra`` failure (:attr:`category`).

    Args:
        detail: What was observed (e.g. ``"its init (pid 4242) exited"``).
        reason: One of :data:`UNAVAILABLE_REASONS`.
        backend: The backend's name for messages (``"local"``, ``"Docker"``, ``"Modal"``).
    """

    category: Final = "infra"

    def __init__(
        self,
        detail: str,
        *,
        reason: UnavailableReason = "exited",
        backend: str = "",
        task_id: str | None = None,
    ) -> None:
        if reason not in UNAVAILABLE_REASONS:
            raise ValueError(
                f"unknown sandbox-unavailable reason {reason!r}; use one of "
                f"{', '.join(UNAVAILABLE_REASONS)}"
            )
        where = f"the {backend} sandbox" if backend else "the sandbox"
        super().__init__(
            f"{where} is gone: {UNAVAILABLE_REASONS[reason]} ({detail}); its processes and "
            "files are lost and nothing more can run in it. This is not a failure of your "
            "command; the rollout cannot continue in this sandbox",
            task_id=task_id,
        )
        self.detail = detail
        self.reason: UnavailableReason = reason
        self.backend = backend


class TransferLimitError(OSError):
    """A file or archive leaving a sandbox is larger than the transfer cap.

    Raised before the transfer when the size is known, else once the stream passes the cap.
    ``size`` is ``None`` in that case.
    """

    def __init__(self, what: str, *, limit: int, size: int | None = None) -> None:
        seen = f"it is {size:,} bytes" if size is not None else f"more than {limit:,} bytes came"
        super().__init__(
            f"{what} is too large to transfer: {seen}, the cap is {limit:,} bytes; compress "
            "or split it in the sandbox, transfer less, or raise max_bytes"
        )
        self.what = what
        self.limit = limit
        self.size = size


class NotARegularFileError(FileNotFoundError):
    """The path exists in the sandbox but is not a regular file (a directory, a FIFO, ...).

    A ``FileNotFoundError``, so code written for "no such file" handles it too.
    """
