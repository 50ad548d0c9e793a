"""A double of the part of the ``e2b`` SDK's async API (2.x) that the E2B backend uses.

Pass a :class:`FakeE2B` as ``E2BBackend(e2b=...)``. It mirrors the SDK's names, signatures and
exception classes, runs commands as local processes, and injects faults (create latency, hangs,
failures, a sandbox dying). What it models: docs/decisions/027-e2b-double.md.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import anyio

from hermes_async.testing._remote_machine import ControlPlane, LocalMachine

__all__ = (
    "AuthenticationException",
    "CommandExitException",
    "CommandResult",
    "FakeAsyncSandbox",
    "FakeE2B",
    "FileNotFoundException",
    "NotFoundException",
    "RateLimitException",
    "SandboxException",
    "SandboxInfo",
    "SandboxNotFoundException",
    "SandboxNotRunningException",
    "SandboxQuery",
    "TimeoutException",
    "WriteInfo",
)


# Exception classes named and nested like e2b.exceptions' (the backend matches them by name).
class SandboxException(Exception):
    """``e2b.SandboxException``."""


class TimeoutException(SandboxException):
    """``e2b.TimeoutException``."""


class NotFoundException(SandboxException):
    """``e2b.NotFoundException``."""


class FileNotFoundException(NotFoundException):
    """``e2b.FileNotFoundException``."""


class SandboxNotFoundException(NotFoundException):
    """``e2b.SandboxNotFoundException``: no such sandbox (control plane)."""


class SandboxNotRunningException(TimeoutException):
    """``e2b.SandboxNotRunningException``: the sandbox was killed or reached its timeout."""


class AuthenticationException(Exception):
    """``e2b.AuthenticationException``."""


class RateLimitException(SandboxException):
    """``e2b.RateLimitException``."""


@dataclass
class CommandResult:
    """``e2b.CommandResult``."""

    stdout: str
    stderr: str
    exit_code: int
    error: str | None = None


class CommandExitException(SandboxException):
    """``e2b.CommandExitException``: a command exited non-zero (carries its result)."""

    def __init__(self, stdout: str, stderr: str, exit_code: int, error: str | None) -> None:
        super().__init__(f"Command exited with code {exit_code} and error:\n{stderr}")
        self.stdout = stdout
        self.stderr = stderr
        self.exit_code = exit_code
        self.error = error


@dataclass
class SandboxQuery:
    """``e2b.SandboxQuery``."""

    metadata: dict[str, str] | None = None
    state: list[str] | None = None


@dataclass
class SandboxInfo:
    """``e2b.SandboxInfo`` (the fields the backend reads, and a few more)."""

    sandbox_id: str
    template_id: str
    metadata: dict[str, str]
    started_at: datetime
    state: str = "running"


@dataclass
class WriteInfo:
    """``e2b.sandbox.filesystem.filesystem.WriteInfo``."""

    name: str
    type: str
    path: str


@dataclass
class _Record:
    sandbox_id: str
    template: str
    metadata: dict[str, str]
    envs: dict[str, str]
    lifetime_seconds: int | None
    allow_internet_access: bool | None
    machine: LocalMachine
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    alive: bool = True
    returned: bool = False  # the create call handed the id to the client


class _Commands:
    def __init__(self, sandbox: FakeAsyncSandbox) -> None:
        self._sandbox = sandbox

    async def run(
        self,
        cmd: str,
        background: bool | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: bool = True,
    ) -> CommandResult:
        """``sandbox.commands.run``: run ``cmd`` with ``bash -c`` and wait for it."""
        record = await self._sandbox._check("commands.run")
        if background:
            raise NotImplementedError("the e2b double does not model background=True")
        outcome = await record.machine.run(
            ["bash", "-c", cmd], cwd=cwd, env=envs, timeout=timeout or None
        )
        if not record.alive:
            raise SandboxNotRunningException(f"sandbox {record.sandbox_id} is not running")
        stdout = outcome.stdout.decode("utf-8", errors="replace")
        stderr = outcome.stderr.decode("utf-8", errors="replace")
        for handler, text in ((on_stdout, stdout), (on_stderr, stderr)):
            if handler is not None and text:
                result = handler(text)
                if hasattr(result, "__await__"):
                    await result
        if outcome.exit_code is None:
            raise TimeoutException(
                "context deadline exceeded: the command ran longer than its timeout "
                f"({timeout} s); raise timeout= or pass 0 for no limit"
            )
        if outcome.exit_code != 0:
            raise CommandExitException(stdout, stderr, outcome.exit_code, None)
        return CommandResult(stdout, stderr, 0)


class _Files:
    def __init__(self, sandbox: FakeAsyncSandbox) -> None:
        self._sandbox = sandbox

    async def read(
        self,
        path: str,
        format: Literal["text", "bytes"] = "text",
        user: str | None = None,
        request_timeout: float | None = None,
    ) -> str | bytes:
        """``sandbox.files.read``."""
        await self._sandbox._check("files.read")
        target = anyio.Path(path)
        if await target.is_dir():
            raise SandboxException(f"path '{path}' is a directory")
        try:
            data = await target.read_bytes()
        except FileNotFoundError as exc:
            raise FileNotFoundException(f"file '{path}' not found") from exc
        return data if format == "bytes" else data.decode("utf-8", errors="replace")

    async def write(
        self,
        path: str,
        data: str | bytes,
        user: str | None = None,
        request_timeout: float | None = None,
    ) -> WriteInfo:
        """``sandbox.files.write``: parents created, an existing file overwritten."""
        await self._sandbox._check("files.write")
        target = anyio.Path(path)
        if await target.is_dir():
            raise SandboxException(f"path '{path}' is a directory")
        await target.parent.mkdir(parents=True, exist_ok=True)
        await target.write_bytes(data.encode() if isinstance(data, str) else bytes(data))
        return WriteInfo(name=target.name, type="file", path=path)


class _KillMethod:
    """The SDK's ``kill``: ``await sb.kill()`` or ``await AsyncSandbox.kill(sandbox_id)``."""

    def __get__(self, obj: FakeAsyncSandbox | None, cls: type[FakeAsyncSandbox]) -> Any:
        if obj is None:

            async def kill_by_id(sandbox_id: str, **opts: object) -> bool:
                return await cls._provider._kill(sandbox_id)

            return kill_by_id

        async def kill(**opts: object) -> bool:
            return await obj._provider._kill(obj.sandbox_id)

        return kill


class _Paginator:
    """``e2b.AsyncSandboxPaginator``: ``has_next`` and ``await next_items()``."""

    def __init__(self, provider: FakeE2B, query: SandboxQuery | None, limit: int | None) -> None:
        self._provider = provider
        self._query = query
        self._limit = limit or 100
        self._offset = 0
        self.has_next = True

    async def next_items(self, **opts: object) -> list[SandboxInfo]:
        if not self.has_next:
            raise SandboxException("No more items to fetch")
        await self._provider.faults.check("list")
        wanted = (self._query.metadata if self._query else None) or {}
        matches = [
            r
            for r in self._provider.sandboxes.values()
            if r.alive and all(r.metadata.get(k) == v for k, v in wanted.items())
        ]
        page = matches[self._offset : self._offset + self._limit]
        self._offset += len(page)
        self.has_next = self._offset < len(matches)
        return [SandboxInfo(r.sandbox_id, r.template, dict(r.metadata), r.started_at) for r in page]


class FakeAsyncSandbox:
    """``e2b.AsyncSandbox`` (each :class:`FakeE2B` has its own subclass bound to its books)."""

    _provider: FakeE2B
    kill = _KillMethod()

    def __init__(self, record: _Record) -> None:
        self._record = record
        self.sandbox_id = record.sandbox_id
        self.commands = _Commands(self)
        self.files = _Files(self)

    async def _check(self, op: str) -> _Record:
        if not self._record.alive:
            raise SandboxNotRunningException(
                f"The sandbox {self.sandbox_id} was not found: it was killed or timed out"
            )
        await self._provider.faults.check(op)
        return self._record

    @classmethod
    async def create(
        cls,
        template: str | None = None,
        timeout: int | None = None,
        metadata: dict[str, str] | None = None,
        envs: dict[str, str] | None = None,
        secure: bool | None = None,
        allow_internet_access: bool | None = None,
        request_timeout: float | None = None,
        **opts: object,
    ) -> FakeAsyncSandbox:
        """``AsyncSandbox.create``: see the module docstring for the latency model."""
        return await cls._provider._create(
            cls, template or "base", timeout, metadata, envs, allow_internet_access, request_timeout
        )

    @classmethod
    async def connect(
        cls, sandbox_id: str, timeout: int | None = None, **opts: object
    ) -> FakeAsyncSandbox:
        """``AsyncSandbox.connect``: a handle on a running sandbox."""
        await cls._provider.faults.check("connect")
        record = cls._provider.sandboxes.get(sandbox_id)
        if record is None or not record.alive:
            raise SandboxNotFoundException(f"Sandbox {sandbox_id} not found")
        return cls(record)

    @classmethod
    def list(
        cls, query: SandboxQuery | None = None, limit: int | None = None, **opts: object
    ) -> _Paginator:
        """``AsyncSandbox.list``: a paginator over running sandboxes matching ``query``."""
        return _Paginator(cls._provider, query, limit)


class FakeE2B(ControlPlane[_Record]):
    """Stands in for the ``e2b`` module and E2B's control plane.

    Args:
        hang: Operation names whose calls never return.
        fail: Operation name -> exception its calls raise.
        create_delay_seconds: Each create's latency (a number or a function per create).
        workdir: Where commands start without ``cwd`` (the sandbox user's home).
    """

    SandboxException = SandboxException
    TimeoutException = TimeoutException
    NotFoundException = NotFoundException
    FileNotFoundException = FileNotFoundException
    SandboxNotFoundException = SandboxNotFoundException
    SandboxNotRunningException = SandboxNotRunningException
    AuthenticationException = AuthenticationException
    RateLimitException = RateLimitException
    CommandExitException = CommandExitException
    SandboxQuery = SandboxQuery

    def _open(self) -> None:
        self.AsyncSandbox: type[FakeAsyncSandbox] = type(
            "AsyncSandbox", (FakeAsyncSandbox,), {"_provider": self}
        )
        self.create_kwargs: list[dict[str, object]] = []
        self.kills: list[str] = []

    def inject_orphan(self, metadata: Mapping[str, str]) -> str:
        """Register a running sandbox nobody holds (a previous crash's leftover); its id."""
        record = self._register("base", None, dict(metadata), {}, None)
        return record.sandbox_id

    async def die(self, sandbox_id: str) -> None:
        """End ``sandbox_id`` from outside (mid-rollout): processes killed, books updated."""
        record = self.sandboxes[sandbox_id]
        record.alive = False
        await record.machine.destroy()

    def _register(
        self,
        template: str,
        lifetime: int | None,
        metadata: dict[str, str],
        envs: dict[str, str],
        allow_internet_access: bool | None,
    ) -> _Record:
        sandbox_id = f"i{secrets.token_hex(10)}"
        machine = LocalMachine(sandbox_id, self.workdir, {**self.extra_env, **envs}, self.sweeper)
        record = _Record(
            sandbox_id, template, metadata, envs, lifetime, allow_internet_access, machine
        )
        self.sandboxes[sandbox_id] = record
        return record

    async def _create(
        self,
        cls: type[FakeAsyncSandbox],
        template: str,
        timeout: int | None,
        metadata: dict[str, str] | None,
        envs: dict[str, str] | None,
        allow_internet_access: bool | None,
        request_timeout: float | None,
    ) -> FakeAsyncSandbox:
        def register() -> _Record:
            self.create_kwargs.append(
                {
                    "template": template,
                    "timeout": timeout,
                    "metadata": dict(metadata or {}),
                    "envs": dict(envs or {}),
                    "allow_internet_access": allow_internet_access,
                    "request_timeout": request_timeout,
                }
            )
            return self._register(
                template, timeout, dict(metadata or {}), dict(envs or {}), allow_internet_access
            )

        record = await self._creating(
            register,
            request_timeout,
            lambda: TimeoutException(
                f"Request timed out after {request_timeout} s: the sandbox may still be starting"
            ),
        )
        record.returned = True
        return cls(record)

    async def _kill(self, sandbox_id: str) -> bool:
        await self.faults.check("kill")
        record = self.sandboxes.get(sandbox_id)
        if record is None or not record.alive:
            return False
        record.alive = False
        self.kills.append(sandbox_id)
        await record.machine.destroy()
        return True
