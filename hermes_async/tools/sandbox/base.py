"""The sandbox interface every backend (local, Docker, Modal, the in-memory fake) implements.

A sandbox is one rollout's private machine: a working directory, an environment built from an
allowlist, and the processes it started. Tools are written once against :class:`Sandbox`; no tool
touches the host filesystem directly.

What is *returned* and what is *raised*: a command that exits non-zero, prints too much or times
out is an observation (an :class:`ExecResult`); a sandbox that cannot be reached or created is an
operator problem (:class:`~hermes_async.errors.SandboxError`). File reads of a missing path raise
``FileNotFoundError`` so tools can turn them into model-visible errors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

__all__ = [
    "DEFAULT_OUTPUT_LIMIT_BYTES",
    "TIMEOUT_EXIT_CODE",
    "ExecResult",
    "Sandbox",
    "SandboxProvider",
]

#: Exit code reported for a command killed by its timeout (what coreutils' ``timeout`` uses).
TIMEOUT_EXIT_CODE = 124

#: Output kept in memory per stream before head+tail truncation (1 MiB: far above what any tool
#: shows the model, far below what could hurt the host when hundreds of commands run at once).
DEFAULT_OUTPUT_LIMIT_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of one command.

    Attributes:
        stdout: Standard output, decoded as UTF-8 with undecodable bytes replaced.
        stderr: Standard error, decoded the same way.
        exit_code: The exit status; ``124`` when killed by the timeout.
        timed_out: The command hit its timeout and its process group was killed.
        truncated: A stream exceeded the output limit; the middle was dropped (head + tail kept).
        duration_seconds: Wall time from start to exit.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False
    duration_seconds: float = 0.0

    @property
    def output(self) -> str:
        """stdout followed by stderr, as a terminal would show them."""
        if self.stdout and self.stderr:
            sep = "" if self.stdout.endswith("\n") else "\n"
            return f"{self.stdout}{sep}{self.stderr}"
        return self.stdout or self.stderr


class Sandbox(ABC):
    """One rollout's isolated execution environment.

    Subclasses implement the abstract coroutines; every method must bound its waits (a sandbox
    that does not answer raises :class:`~hermes_async.errors.SandboxError` within a deadline).

    Attributes:
        task_id: The rollout this sandbox belongs to.
        workdir: Absolute path inside the sandbox where commands start and relative paths resolve.
    """

    task_id: str
    workdir: str

    @abstractmethod
    async def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT_BYTES,
    ) -> ExecResult:
        """Run ``command`` through the sandbox's shell and wait for it.

        Args:
            command: A shell command line.
            cwd: Working directory (default :attr:`workdir`).
            env: Extra environment variables on top of the sandbox's allowlisted environment.
            timeout: Seconds before the command's whole process group is killed (exit 124).
            stdin: Bytes written to the command's standard input, then closed.
            output_limit: Bytes kept per stream; beyond it, head and tail are kept.

        **Cancellation**: the command's process group is killed before this returns.
        """

    @abstractmethod
    async def read_bytes(self, path: str) -> bytes:
        """Return the contents of ``path`` (relative paths resolve against :attr:`workdir`).

        Raises:
            FileNotFoundError: ``path`` does not exist or is not a regular file.
        """

    @abstractmethod
    async def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path``, creating parent directories."""

    @abstractmethod
    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        """Extract a tar archive into ``dest_dir`` (created if missing).

        Raises:
            ValueError: A member is absolute, escapes ``dest_dir`` (``..``), or is a device or a
                link pointing outside.
        """

    @abstractmethod
    async def get_archive(self, path: str) -> bytes:
        """Return a tar archive of ``path`` (a file or a directory), members relative to it.

        Raises:
            FileNotFoundError: ``path`` does not exist.
        """

    @abstractmethod
    async def aclose(self) -> None:
        """Kill every process the sandbox started and remove it. Idempotent.

        **Cancellation**: callers run this under a shielded, bounded scope; implementations
        must not wait on anything without a deadline.
        """

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class SandboxProvider(Protocol):
    """Gives tools the sandbox of a rollout (implemented by ``SandboxManager``)."""

    async def get(self, task_id: str) -> Sandbox:
        """The sandbox for ``task_id``, created on first use."""
        ...
