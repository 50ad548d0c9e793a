"""A double of the part of the ``daytona`` SDK's async API that the Daytona backend uses.

Pass a :class:`FakeDaytona` as ``DaytonaBackend(daytona=...)``. It mirrors the SDK's names,
signatures and exceptions; commands run as local processes (:mod:`._remote_machine`); a call
on a gone sandbox raises ``DaytonaNotFoundError``. Faults: create latency, ``hang`` / ``fail``
per operation, :meth:`FakeDaytona.die`. Books: :attr:`FakeDaytona.sandboxes` and ``live``.
The surface modelled: docs/decisions/037-e2b-daytona-apptainer.md.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import anyio

from hermes_async.testing._remote_machine import ControlPlane, LocalMachine

__all__ = (
    "CreateSandboxFromImageParams",
    "DaytonaAuthenticationError",
    "DaytonaConfig",
    "DaytonaError",
    "DaytonaFileNotFoundError",
    "DaytonaNotFoundError",
    "DaytonaRateLimitError",
    "DaytonaTimeoutError",
    "ExecuteResponse",
    "ExecutionArtifacts",
    "FakeAsyncDaytona",
    "FakeDaytona",
    "FakeDaytonaSandbox",
    "ListSandboxesQuery",
    "Resources",
)


# Exception classes named and nested like daytona.common.errors' (matched by name).
class DaytonaError(Exception):
    """``daytona.DaytonaError``."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class DaytonaNotFoundError(DaytonaError):
    """``daytona.DaytonaNotFoundError`` (HTTP 404)."""


class DaytonaFileNotFoundError(DaytonaNotFoundError):
    """``daytona.DaytonaFileNotFoundError``."""


class DaytonaAuthenticationError(DaytonaError):
    """``daytona.DaytonaAuthenticationError`` (HTTP 401)."""


class DaytonaRateLimitError(DaytonaError):
    """``daytona.DaytonaRateLimitError`` (HTTP 429)."""


class DaytonaTimeoutError(DaytonaError):
    """``daytona.DaytonaTimeoutError``."""


@dataclass
class DaytonaConfig:
    """``daytona.DaytonaConfig`` (the fields the backend sets)."""

    api_key: str | None = None
    api_url: str | None = None
    target: str | None = None


@dataclass
class Resources:
    """``daytona.Resources``: CPUs, memory and disk in GiB."""

    cpu: int | None = None
    memory: int | None = None
    disk: int | None = None
    gpu: int | None = None


@dataclass
class CreateSandboxFromImageParams:
    """``daytona.CreateSandboxFromImageParams`` (the fields the backend sets)."""

    image: str
    resources: Resources | None = None
    name: str | None = None
    language: str | None = None
    os_user: str | None = None
    env_vars: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    auto_stop_interval: int | None = None
    auto_delete_interval: int | None = None
    ttl_minutes: int | None = None
    network_block_all: bool | None = None
    ephemeral: bool | None = None


_Params = CreateSandboxFromImageParams


@dataclass
class ListSandboxesQuery:
    """``daytona.ListSandboxesQuery`` (labels filter; pages of ``limit``)."""

    labels: dict[str, str] | None = None
    limit: int | None = None


@dataclass
class ExecutionArtifacts:
    """``daytona.ExecutionArtifacts``."""

    stdout: str = ""
    charts: list[object] | None = None


@dataclass
class ExecuteResponse:
    """``daytona.ExecuteResponse``."""

    exit_code: int
    result: str
    artifacts: ExecutionArtifacts | None = None


@dataclass
class _Record:
    sandbox_id: str
    params: CreateSandboxFromImageParams
    labels: dict[str, str]
    machine: LocalMachine
    state: str = "started"
    returned: bool = False

    @property
    def alive(self) -> bool:
        return self.state == "started"


class _Process:
    def __init__(self, sandbox: FakeDaytonaSandbox) -> None:
        self._sandbox = sandbox

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: int | None = None,
    ) -> ExecuteResponse:
        """``sandbox.process.exec``: run ``command`` (stderr merged into ``result``)."""
        record = await self._sandbox._check("process.exec")
        outcome = await record.machine.run(
            ["sh", "-c", command], cwd=cwd, env=env, timeout=timeout or None, merge_stderr=True
        )
        if not record.alive:
            raise DaytonaNotFoundError(f"Sandbox {record.sandbox_id} not found", 404)
        if outcome.exit_code is None:
            raise DaytonaTimeoutError(f"Command execution timed out after {timeout} seconds")
        result = outcome.stdout.decode("utf-8", errors="replace")
        return ExecuteResponse(outcome.exit_code, result, ExecutionArtifacts(stdout=result))


class _FileSystem:
    def __init__(self, sandbox: FakeDaytonaSandbox) -> None:
        self._sandbox = sandbox

    async def upload_file(self, file: bytes, remote_path: str, timeout: int = 30 * 60) -> None:
        """``sandbox.fs.upload_file``: parents created, an existing file overwritten."""
        await self._sandbox._check("fs.upload_file")
        target = anyio.Path(remote_path)
        if await target.is_dir():
            raise DaytonaError(f"{remote_path} is a directory", 400)
        await target.parent.mkdir(parents=True, exist_ok=True)
        await target.write_bytes(bytes(file))

    async def download_file(self, remote_path: str, timeout: int = 30 * 60) -> bytes:
        """``sandbox.fs.download_file`` (the in-memory form)."""
        await self._sandbox._check("fs.download_file")
        target = anyio.Path(remote_path)
        if await target.is_dir():
            raise DaytonaError(f"{remote_path} is a directory", 400)
        try:
            return await target.read_bytes()
        except FileNotFoundError as exc:
            raise DaytonaFileNotFoundError(f"File not found: {remote_path}", 404) from exc


class FakeDaytonaSandbox:
    """``daytona.AsyncSandbox``."""

    def __init__(self, provider: FakeDaytona, record: _Record) -> None:
        self._provider = provider
        self._record = record
        self.id = record.sandbox_id
        self.labels = dict(record.labels)
        self.process = _Process(self)
        self.fs = _FileSystem(self)

    @property
    def state(self) -> str:
        """``"started"`` while it runs, ``"destroyed"`` after."""
        return self._record.state

    async def _check(self, op: str) -> _Record:
        if not self._record.alive:
            raise DaytonaNotFoundError(f"Sandbox {self.id} not found", 404)
        await self._provider.faults.check(op)
        return self._record

    async def delete(self, timeout: float | None = 60, wait: bool = False) -> None:
        """``sandbox.delete``."""
        await self._provider._delete(self.id)


class FakeAsyncDaytona:
    """``daytona.AsyncDaytona`` (each :class:`FakeDaytona` has its own subclass)."""

    _provider: FakeDaytona

    def __init__(self, config: DaytonaConfig | None = None) -> None:
        self.config = config
        self.closed = False
        self._provider.clients.append(self)

    async def __aenter__(self) -> FakeAsyncDaytona:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """``AsyncDaytona.close``: closes the client's HTTP sessions."""
        self.closed = True

    async def create(
        self, params: CreateSandboxFromImageParams | None = None, *, timeout: float = 60
    ) -> FakeDaytonaSandbox:
        """``AsyncDaytona.create``, with the latency model of :class:`ControlPlane`."""
        return await self._provider._create(params, timeout)

    async def get(
        self, sandbox_id_or_name: str, request_timeout: float | None = None
    ) -> FakeDaytonaSandbox:
        """``AsyncDaytona.get``."""
        await self._provider.faults.check("get")
        record = self._provider.sandboxes.get(sandbox_id_or_name)
        if record is None or not record.alive:
            raise DaytonaNotFoundError(f"Sandbox {sandbox_id_or_name} not found", 404)
        return FakeDaytonaSandbox(self._provider, record)

    async def delete(
        self, sandbox: FakeDaytonaSandbox, timeout: float = 60, wait: bool = False
    ) -> None:
        """``AsyncDaytona.delete``."""
        await self._provider._delete(sandbox.id)

    async def list(
        self, query: ListSandboxesQuery | None = None, request_timeout: float | None = None
    ) -> AsyncIterator[FakeDaytonaSandbox]:
        """``AsyncDaytona.list``: iterate over sandboxes matching ``query`` (page by page)."""
        wanted = (query.labels if query else None) or {}
        page_size = (query.limit if query else None) or 100
        offset = 0
        while True:
            await self._provider.faults.check("list")
            matches = [
                r
                for r in self._provider.sandboxes.values()
                if r.alive and all(r.labels.get(k) == v for k, v in wanted.items())
            ]
            page = matches[offset : offset + page_size]
            for record in page:
                yield FakeDaytonaSandbox(self._provider, record)
            offset += len(page)
            if offset >= len(matches) or not page:
                return


class FakeDaytona(ControlPlane[_Record]):
    """Stands in for the ``daytona`` module and Daytona's API.

    Args:
        hang: Operation names whose calls never return.
        fail: Operation name -> exception its calls raise.
        create_delay_seconds: Each create's latency (a number or a function per create).
        extra_env: Variables every command sees (besides PATH, HOME, LANG).
        workdir: Where commands start when no ``cwd`` is given.
    """

    DaytonaConfig = DaytonaConfig
    CreateSandboxFromImageParams = CreateSandboxFromImageParams
    Resources = Resources
    ListSandboxesQuery = ListSandboxesQuery
    DaytonaError = DaytonaError
    DaytonaNotFoundError = DaytonaNotFoundError
    DaytonaFileNotFoundError = DaytonaFileNotFoundError
    DaytonaAuthenticationError = DaytonaAuthenticationError
    DaytonaRateLimitError = DaytonaRateLimitError
    DaytonaTimeoutError = DaytonaTimeoutError

    def _open(self) -> None:
        self.clients: list[FakeAsyncDaytona] = []
        self.AsyncDaytona: type[FakeAsyncDaytona] = type(
            "AsyncDaytona", (FakeAsyncDaytona,), {"_provider": self}
        )
        self.create_params: list[_Params] = []
        self.deletes: list[str] = []

    def inject_orphan(self, labels: Mapping[str, str]) -> str:
        """Register a running sandbox nobody holds (a previous crash's leftover); its id."""
        return self._register(CreateSandboxFromImageParams(image="orphan", labels=dict(labels)))

    async def die(self, sandbox_id: str) -> None:
        """End ``sandbox_id`` from outside (mid-rollout): processes killed, books updated."""
        record = self.sandboxes[sandbox_id]
        record.state = "destroyed"
        await record.machine.destroy()

    def _register(self, params: _Params) -> str:
        sandbox_id = secrets.token_hex(16)
        machine = self._machine(sandbox_id, params.env_vars or {})
        self.sandboxes[sandbox_id] = _Record(sandbox_id, params, dict(params.labels or {}), machine)
        return sandbox_id

    async def _create(self, params: _Params | None, timeout: float) -> FakeDaytonaSandbox:
        made = params or CreateSandboxFromImageParams(image="daytonaio/sandbox")

        def register() -> str:
            self.create_params.append(made)
            return self._register(made)

        sandbox_id = await self._creating(
            register,
            timeout,
            lambda: DaytonaTimeoutError(
                f"Failed to create sandbox: Function 'create' exceeded timeout of {timeout} "
                "seconds."
            ),
        )
        record = self.sandboxes[sandbox_id]
        record.returned = True
        return FakeDaytonaSandbox(self, record)

    async def _delete(self, sandbox_id: str) -> None:
        await self.faults.check("delete")
        record = self.sandboxes.get(sandbox_id)
        if record is None or not record.alive:
            raise DaytonaNotFoundError(f"Sandbox {sandbox_id} not found", 404)
        record.state = "destroyed"
        self.deletes.append(sandbox_id)
        await record.machine.destroy()
