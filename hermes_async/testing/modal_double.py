"""A double of the part of modal 1.6's async API the Modal backend uses, for offline tests.

Pass a :class:`FakeModal` as ``ModalBackend(modal=...)``. Commands run as local
subprocesses, so the backend's kill logic is exercised. Faults per operation name:
``hang={...}`` (an offline Modal call waits ~57 s) and ``fail={op: exc}``.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from typing import Generic, ParamSpec, TypeVar

import anyio
from anyio.abc import ByteReceiveStream, Process

from hermes_async.testing._remote_machine import kill_sandbox_processes
from hermes_async.tools.sandbox.processes import (
    SANDBOX_MARKER_ENV,
    ProcessSweeper,
    find_sandbox_processes,
)

__all__ = (
    "AuthError",
    "Error",
    "FakeApp",
    "FakeContainerProcess",
    "FakeImage",
    "FakeModal",
    "FakeSandbox",
    "InvalidError",
    "SandboxFilesystemError",
    "SandboxFilesystemIsADirectoryError",
    "SandboxFilesystemNotFoundError",
    "SandboxTerminatedError",
)

#: How long the double's ``terminate`` may take to kill its processes (Modal's side of it: it
#: completes whether or not the client waits, so it runs shielded).
_TERMINATE_SECONDS = 10.0

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


# Exception classes named like modal.exception's (the backend matches them by name).
class Error(Exception):
    """Base of the double's errors (``modal.exception.Error``)."""


class AuthError(Error):
    """``modal.exception.AuthError``."""


class InvalidError(Error):
    """``modal.exception.InvalidError``."""


class SandboxTerminatedError(Error):
    """``modal.exception.SandboxTerminatedError``."""


class SandboxFilesystemError(Error):
    """``modal.exception.SandboxFilesystemError``."""


class SandboxFilesystemNotFoundError(SandboxFilesystemError):
    """``modal.exception.SandboxFilesystemNotFoundError``."""


class SandboxFilesystemIsADirectoryError(SandboxFilesystemError):
    """``modal.exception.SandboxFilesystemIsADirectoryError``."""


class _Method(Generic[_P, _R]):
    """A synchronicity-style method: ``.aio(...)`` is the coroutine; calling it directly fails."""

    def __init__(self, name: str, fn: Callable[_P, Awaitable[_R]]) -> None:
        self._name = name
        self.aio = fn

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            f"{self._name}() is modal's blocking interface; async code must call "
            f"{self._name}.aio(...)"
        )


class _Faults:
    def __init__(self, hang: Collection[str], fail: Mapping[str, BaseException]) -> None:
        self.hang = set(hang)
        self.fail = dict(fail)

    async def check(self, op: str) -> None:
        if op in self.fail:
            raise self.fail[op]
        if op in self.hang:
            await anyio.sleep_forever()


class FakeImage:
    """``modal.Image``: only remembers its tag."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    @staticmethod
    def from_registry(tag: str, **_: object) -> FakeImage:
        """``modal.Image.from_registry``: lazy, no I/O."""
        return FakeImage(tag)


class FakeApp:
    """``modal.App`` as returned by ``App.lookup``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.app_id = f"ap-fake{secrets.token_hex(6)}"


class _AppNamespace:
    def __init__(self, modal: FakeModal) -> None:
        self.lookup = _Method("App.lookup", modal._lookup)


class _SandboxNamespace:
    def __init__(self, modal: FakeModal) -> None:
        self.create = _Method("Sandbox.create", modal._create)


class _ImageNamespace:
    from_registry = staticmethod(FakeImage.from_registry)


class _ExceptionNamespace:
    Error = Error
    AuthError = AuthError
    InvalidError = InvalidError
    SandboxTerminatedError = SandboxTerminatedError
    SandboxFilesystemError = SandboxFilesystemError
    SandboxFilesystemNotFoundError = SandboxFilesystemNotFoundError
    SandboxFilesystemIsADirectoryError = SandboxFilesystemIsADirectoryError


class FakeModal:
    """Stands in for the ``modal`` module.

    Args:
        hang: Operation names whose calls never return.
        fail: Operation name -> exception its calls raise.
        extra_env: Variables every command sees (besides PATH, HOME, LANG).
    """

    def __init__(
        self,
        *,
        hang: Collection[str] = (),
        fail: Mapping[str, BaseException] | None = None,
        create_delay_seconds: float = 0.0,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.faults = _Faults(hang, fail or {})
        self.create_delay_seconds = create_delay_seconds
        self.extra_env = dict(extra_env or {})
        self.App = _AppNamespace(self)
        self.Sandbox = _SandboxNamespace(self)
        self.Image = _ImageNamespace
        self.exception = _ExceptionNamespace
        self.apps: dict[str, FakeApp] = {}
        self.sandboxes: list[FakeSandbox] = []
        #: One ``/proc`` sweeper for every sandbox of this double (terminations share sweeps).
        self.sweeper = ProcessSweeper()
        self.creates_in_flight = 0
        self.max_creates_in_flight = 0
        self.create_start_times: list[float] = []
        self.create_kwargs: list[dict[str, object]] = []

    async def _lookup(self, name: str, *, create_if_missing: bool = False, **_: object) -> FakeApp:
        await self.faults.check("App.lookup")
        if name not in self.apps:
            if not create_if_missing:
                raise Error(f"App {name!r} not found")
            self.apps[name] = FakeApp(name)
        return self.apps[name]

    async def _create(self, *args: str, **kwargs: object) -> FakeSandbox:
        self.creates_in_flight += 1
        self.max_creates_in_flight = max(self.max_creates_in_flight, self.creates_in_flight)
        self.create_start_times.append(anyio.current_time())
        try:
            await self.faults.check("Sandbox.create")
            if not isinstance(kwargs.get("app"), FakeApp):
                raise InvalidError("Sandbox.create needs app= (an App from App.lookup)")
            if self.create_delay_seconds:
                await anyio.sleep(self.create_delay_seconds)
            self.create_kwargs.append(dict(kwargs))
            workdir = kwargs.get("workdir")
            sandbox = FakeSandbox(
                self, list(args), workdir if isinstance(workdir, str) else "/", self.extra_env
            )
            self.sandboxes.append(sandbox)
            return sandbox
        finally:
            self.creates_in_flight -= 1

    @property
    def live_sandboxes(self) -> list[FakeSandbox]:
        """Sandboxes created and not terminated."""
        return [sb for sb in self.sandboxes if not sb.terminated]


class _StreamReader:
    """``modal.io_streams.StreamReader``: async iteration over chunks, or ``read.aio()``."""

    def __init__(self, stream: ByteReceiveStream | None, text: bool) -> None:
        self._stream = stream
        self._text = text
        self.read = _Method("read", self._read)

    async def _chunks(self) -> AsyncIterator[bytes]:
        if self._stream is None:
            return
        while True:
            try:
                yield await self._stream.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return

    def __aiter__(self) -> AsyncIterator[bytes | str]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes | str]:
        async for chunk in self._chunks():
            yield chunk.decode("utf-8", errors="replace") if self._text else chunk

    async def _read(self) -> bytes | str:
        data = b"".join([chunk async for chunk in self._chunks()])
        return data.decode("utf-8", errors="replace") if self._text else data


class FakeContainerProcess:
    """``modal.container_process.ContainerProcess`` over a local subprocess."""

    def __init__(self, process: Process, text: bool) -> None:
        self._process = process
        self._returncode: int | None = None
        self.stdout = _StreamReader(process.stdout, text)
        self.stderr = _StreamReader(process.stderr, text)
        self.wait = _Method("wait", self._wait)
        self.poll = _Method("poll", self._poll)

    @staticmethod
    def _modal_code(code: int) -> int:
        return 128 - code if code < 0 else code  # modal reports a signal n as 128 + n

    async def _wait(self) -> int:
        if self._returncode is None:
            self._returncode = self._modal_code(await self._process.wait())
        return self._returncode

    async def _poll(self) -> int | None:
        if self._returncode is None and self._process.returncode is not None:
            self._returncode = self._modal_code(self._process.returncode)
        return self._returncode

    @property
    def returncode(self) -> int:
        """The exit code; like modal, an error before ``wait`` returned."""
        if self._returncode is None:
            raise InvalidError(
                "You must call wait() before accessing the returncode. "
                "To poll for the status of a running process, use poll() instead."
            )
        return self._returncode


class _Filesystem:
    """``sb.filesystem`` (modal 1.6's ``SandboxFilesystem``), on the host's filesystem."""

    def __init__(self, sandbox: FakeSandbox) -> None:
        self._sandbox = sandbox
        self.read_bytes = _Method("filesystem.read_bytes", self._read_bytes)
        self.write_bytes = _Method("filesystem.write_bytes", self._write_bytes)

    @staticmethod
    def _absolute(path: str, op: str) -> None:
        if not path.startswith("/"):
            raise InvalidError(f"{op}: remote path must be absolute, got {path!r}")

    async def _read_bytes(self, remote_path: str) -> bytes:
        await self._sandbox._check("filesystem.read_bytes")
        self._absolute(remote_path, "read_bytes")
        path = anyio.Path(remote_path)
        if await path.is_dir():
            raise SandboxFilesystemIsADirectoryError(f"{remote_path} is a directory")
        try:
            return await path.read_bytes()
        except FileNotFoundError as exc:
            raise SandboxFilesystemNotFoundError(f"{remote_path} not found") from exc

    async def _write_bytes(self, data: bytes | bytearray | memoryview, remote_path: str) -> None:
        await self._sandbox._check("filesystem.write_bytes")
        self._absolute(remote_path, "write_bytes")
        path = anyio.Path(remote_path)
        if await path.is_dir():
            raise SandboxFilesystemIsADirectoryError(f"{remote_path} is a directory")
        await path.parent.mkdir(parents=True, exist_ok=True)
        await path.write_bytes(bytes(data))


class FakeSandbox:
    """``modal.Sandbox``: runs ``exec`` as local subprocesses; ``terminate`` kills them all."""

    def __init__(
        self, modal: FakeModal, command: list[str], workdir: str, extra_env: Mapping[str, str]
    ) -> None:
        self._modal = modal
        self.command = command
        self.workdir = workdir
        self.object_id = f"sb-fake{secrets.token_hex(8)}"
        self._marker = f"modal-double-{self.object_id}"
        self._env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": workdir,
            "LANG": "C.UTF-8",
            **extra_env,
            SANDBOX_MARKER_ENV: self._marker,
        }
        self._processes: list[Process] = []
        self.terminated = False
        self.exec_argvs: list[list[str]] = []
        self.exec = _Method("exec", self._exec)
        self.terminate = _Method("terminate", self._terminate)
        self.filesystem = _Filesystem(self)

    async def _check(self, op: str) -> None:
        if self.terminated:
            raise SandboxTerminatedError(f"Sandbox {self.object_id} has been terminated")
        await self._modal.faults.check(op)

    async def _exec(
        self,
        *args: str,
        env: Mapping[str, str | None] | None = None,
        workdir: str | None = None,
        timeout: int | None = None,
        text: bool = True,
        **_: object,
    ) -> FakeContainerProcess:
        await self._check("exec")
        self.exec_argvs.append(list(args))
        child_env = dict(self._env)
        for key, value in (env or {}).items():
            if value is None:
                child_env.pop(key, None)
            else:
                child_env[key] = value
        process = await anyio.open_process(
            list(args),
            cwd=workdir or self.workdir,
            env=child_env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._processes.append(process)
        return FakeContainerProcess(process, text)

    def live_processes(self) -> list[int]:
        """Pids of live processes started in this sandbox (its marker variable)."""
        return find_sandbox_processes(self._marker)

    async def _terminate(self, **_: object) -> None:
        await self._modal.faults.check("terminate")
        if self.terminated:
            return
        self.terminated = True
        await kill_sandbox_processes(
            self._modal.sweeper,
            self._marker,
            self._processes,
            f"Modal double {self.object_id}",
            reason="terminate called",
            seconds=_TERMINATE_SECONDS,
        )
