"""A sandbox that forwards every operation to another one, around a hook of its own.

The manager's sandbox holds a command slot around each call; the rollout's reports the first
lost sandbox. :class:`SandboxWrapper` writes the forwarding once, so no wrapper falls back to
a weaker base-class default. Not forwarded: ``watch`` (the manager runs it once, on the
backend's sandbox) and ``async with``'s bound (whoever hands the wrapper out bounds it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from hermes_async.tools.sandbox.base import (
    BACKGROUND_OUTPUT_CHARS,
    BackgroundProcess,
    BackgroundStatus,
    ByteSink,
    ExecRequest,
    ExecResult,
    Sandbox,
)
from hermes_async.tools.sandbox.spec import SandboxSnapshot

__all__ = ("SandboxWrapper",)


class SandboxWrapper(Sandbox):
    """Forwards every operation to :attr:`inner` inside :meth:`around`.

    A subclass overrides :meth:`around` and whatever it does differently (``aclose``, ``alive``).
    """

    close_timeout = None  # the provider that hands the wrapper out bounds its release

    def __init__(self, inner: Sandbox) -> None:
        self.inner = inner
        self.task_id = inner.task_id
        self.workdir = inner.workdir
        self.background_state_dir = inner.background_state_dir

    @asynccontextmanager
    async def around(self) -> AsyncIterator[Sandbox]:
        """Hold what one operation needs; yield the sandbox to call (default: :attr:`inner`)."""
        yield self.inner

    @property
    def gone(self) -> Any:
        return getattr(self.inner, "gone", None)

    # ------------------------------------------------------------------------- commands, files

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        async with self.around() as sb:
            return await sb.exec_request(request)

    @property
    def switches_users(self) -> bool:
        return bool(self.inner.switches_users)

    async def put_tree(self, dest_dir: str, source: Path) -> None:
        async with self.around() as sb:
            await sb.put_tree(dest_dir, source)

    async def read_bytes(self, path: str) -> bytes:
        async with self.around() as sb:
            return await sb.read_bytes(path)

    async def write_bytes(self, path: str, data: bytes) -> None:
        async with self.around() as sb:
            await sb.write_bytes(path, data)

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        async with self.around() as sb:
            await sb.put_archive(dest_dir, tar_data)

    async def get_archive(self, path: str) -> bytes:
        async with self.around() as sb:
            return await sb.get_archive(path)

    async def stream_file(self, path: str, sink: ByteSink, *, max_bytes: int | None = None) -> int:
        async with self.around() as sb:
            return await sb.stream_file(path, sink, max_bytes=max_bytes)

    async def stream_archive(
        self, path: str, sink: ByteSink, *, max_bytes: int | None = None
    ) -> int:
        async with self.around() as sb:
            return await sb.stream_archive(path, sink, max_bytes=max_bytes)

    # ------------------------------------------------------------------------- lifecycle

    def can_snapshot(self) -> bool:
        return self.inner.can_snapshot()

    async def snapshot(self) -> SandboxSnapshot:
        async with self.around() as sb:
            return await sb.snapshot()

    async def alive(self) -> bool:
        return await self.inner.alive()

    async def aclose(self, interrupted: bool = False) -> None:
        await self.inner.aclose(interrupted=interrupted)

    # ------------------------------------------------------------------------- background

    def background_processes(self) -> list[BackgroundProcess]:
        return self.inner.background_processes()

    def get_background(self, session_id: str) -> BackgroundProcess | None:
        return self.inner.get_background(session_id)

    def forget_background(self, session_id: str) -> None:
        self.inner.forget_background(session_id)

    async def start_background(
        self, command: str, *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> BackgroundProcess:
        async with self.around() as sb:
            return await sb.start_background(command, cwd=cwd, env=env)

    async def background_status(
        self, session_id: str, *, tail_chars: int = BACKGROUND_OUTPUT_CHARS
    ) -> BackgroundStatus:
        async with self.around() as sb:
            return await sb.background_status(session_id, tail_chars=tail_chars)

    async def kill_background(self, session_id: str) -> bool:
        async with self.around() as sb:
            return await sb.kill_background(session_id)

    async def write_background_stdin(self, session_id: str, data: bytes) -> int:
        async with self.around() as sb:
            return await sb.write_background_stdin(session_id, data)

    async def close_background_stdin(self, session_id: str) -> None:
        async with self.around() as sb:
            await sb.close_background_stdin(session_id)

    async def kill_all_background(self) -> None:
        async with self.around() as sb:
            await sb.kill_all_background()
