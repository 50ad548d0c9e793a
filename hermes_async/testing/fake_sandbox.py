"""FakeSandbox: an in-memory sandbox with scripted commands, latency and fault injection::

    fake = FakeSandbox(exec_script={"pytest -q": ExecResult("1 passed", "", 0)})
    async with SandboxManager(FakeSandboxFactory(sandbox=fake)) as manager:
        ...

Latency is ``anyio.sleep``, free under trio's ``MockClock``. Every exec is recorded in
:attr:`FakeSandbox.calls`.
"""

from __future__ import annotations

import inspect
import io
import posixpath
import secrets
import tarfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

import anyio

from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox.archive import check_tar_members, pack_files
from hermes_async.tools.sandbox.base import (
    BACKGROUND_LOG_LIMIT_BYTES,
    TIMEOUT_EXIT_CODE,
    BackgroundProcess,
    BackgroundStatus,
    ExecRequest,
    ExecResult,
    Sandbox,
    dropped_marker,
)
from hermes_async.tools.sandbox.errors import SandboxUnavailableError, UnavailableReason
from hermes_async.tools.sandbox.output import OutputCapture

__all__ = ("ExecCall", "ExecScript", "FakeSandbox", "FakeSandboxFactory")

#: How a fake answers commands: a mapping ``command -> result`` (exact match; ``"*"`` is the
#: fallback), or a callable ``command -> result`` (sync or async). A ``str`` result is stdout
#: with exit code 0; an exception instance is raised.
ExecScript = (
    Mapping[str, "ExecResult | str | BaseException"]
    | Callable[[str], "ExecResult | str | Awaitable[ExecResult | str]"]
)

#: One recorded ``exec`` call: the validated request (``command``, ``cwd``, ``env``,
#: ``timeout``, ``stdin``, ``output_limit``).
ExecCall = ExecRequest


class FakeSandbox(Sandbox):
    """An in-memory :class:`~hermes_async.tools.sandbox.base.Sandbox`.

    Args:
        files: Initial files (path -> bytes or str; relative paths resolve against ``workdir``).
        exec_script: How commands are answered (see :data:`ExecScript`); unscripted commands
            exit 127.
        latency: Seconds every operation takes (a number, or ``command -> seconds`` for exec).
        exec_error: Raised by every ``exec``.
        exec_hangs: Every ``exec`` blocks until cancelled.
        dies_after_execs: After this many commands every later operation raises
            ``SandboxUnavailableError`` (``None``: never).
        close_latency: Seconds ``aclose`` takes (``math.inf``: it hangs until cancelled).
    """

    #: Commands reach the script exactly as the tool wrote them: the terminal's working-directory
    #: wrapper (``hermes_async.tools.terminal``) is not applied to a sandbox that is no shell.
    terminal_tracks_cwd = False

    def __init__(
        self,
        task_id: str = "fake",
        *,
        files: Mapping[str, bytes | str] | None = None,
        exec_script: ExecScript | None = None,
        latency: float | Callable[[str], float] = 0.0,
        exec_error: BaseException | None = None,
        exec_hangs: bool = False,
        dies_after_execs: int | None = None,
        close_latency: float = 0.0,
        workdir: str = "/work",
    ) -> None:
        self.task_id = task_id
        self.dies_after_execs = dies_after_execs
        self.close_latency = close_latency
        self.workdir = workdir
        self.exec_script = exec_script
        self.latency = latency
        self.exec_error = exec_error
        self.exec_hangs = exec_hangs
        self.files: dict[str, bytes] = {}
        for path, data in (files or {}).items():
            self.files[self._abs(path)] = data.encode() if isinstance(data, str) else data
        self.calls: list[ExecCall] = []
        self.closed = False
        self.close_count = 0
        #: The ``interrupted`` flag of every ``aclose`` call, in order.
        self.closes: list[bool] = []
        self.stdin_writes: dict[str, list[bytes]] = {}
        self.stdin_closed: set[str] = set()
        self._outputs: dict[str, str] = {}
        self._dropped: dict[str, int] = {}
        #: Set by :meth:`die`: what every later operation raises.
        self.gone: SandboxUnavailableError | None = None

    def __repr__(self) -> str:
        return (
            f"<FakeSandbox task_id={self.task_id!r} files={len(self.files)} closed={self.closed}>"
        )

    @property
    def commands(self) -> list[str]:
        """The commands ``exec`` was called with, in order."""
        return [c.command for c in self.calls]

    def _abs(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError("FakeSandbox is closed", task_id=self.task_id)
        if self.gone is not None:
            raise self.gone

    async def alive(self) -> bool:
        """Not closed and not :meth:`die` d (no command runs: the script stays the test's)."""
        return self.gone is None and not self.closed

    @property
    def switches_users(self) -> bool:
        """True: a request's ``user`` is recorded in :attr:`calls` (no one enforces it)."""
        return True

    def die(self, reason: UnavailableReason = "oom", detail: str = "the test killed it") -> None:
        """Make the sandbox gone: every later operation raises ``SandboxUnavailableError``."""
        self.gone = SandboxUnavailableError(
            detail, reason=reason, backend="fake", task_id=self.task_id
        )

    async def _delay(self, command: str = "") -> None:
        delay = self.latency(command) if callable(self.latency) else self.latency
        if delay > 0:
            await anyio.sleep(delay)

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        """Answer the command from the script, after the scripted latency.

        Latency over ``timeout`` gives exit 124 and ``timed_out``; stdout over ``output_limit``
        is cut to head + tail as real backends do.

        **Cancellation**: nothing to clean up.
        """
        self._check_open()
        if self.dies_after_execs is not None and len(self.calls) >= self.dies_after_execs:
            self.die("exited", f"the sandbox died (after {self.dies_after_execs} commands)")
            self._check_open()
        self.calls.append(request)
        command = request.command
        if self.exec_hangs:
            await anyio.sleep_forever()
        if request.timeout is not None:
            with anyio.move_on_after(request.timeout) as scope:
                await self._delay(command)
            if scope.cancelled_caught:
                return ExecResult("", "", TIMEOUT_EXIT_CODE, timed_out=True)
        else:
            await self._delay(command)
        if self.exec_error is not None:
            raise self.exec_error
        result = await self._answer(command)
        capture = OutputCapture(request.output_limit)
        capture.feed(result.stdout.encode())
        if capture.truncated:
            result = replace(result, stdout=capture.text(), truncated=True)
        return result

    async def _answer(self, command: str) -> ExecResult:
        script = self.exec_script
        value: object
        if script is None:
            value = None
        elif isinstance(script, Mapping):
            value = script.get(command, script.get("*"))
        else:
            value = script(command)
            if inspect.isawaitable(value):
                value = await value
        if value is None:
            return ExecResult("", f"fake: command not scripted: {command}\n", 127)
        if isinstance(value, BaseException):
            raise value
        if isinstance(value, str):
            return ExecResult(value, "", 0)
        if isinstance(value, ExecResult):
            return value
        raise TypeError(f"exec_script returned {type(value).__name__}; expected ExecResult or str")

    async def read_bytes(self, path: str) -> bytes:
        """Return a file's bytes.

        **Cancellation**: nothing to clean up.
        """
        self._check_open()
        await self._delay()
        try:
            return self.files[self._abs(path)]
        except KeyError:
            raise FileNotFoundError(f"No such file: {path!r}") from None

    async def write_bytes(self, path: str, data: bytes) -> None:
        """Store a file's bytes.

        **Cancellation**: the file is not written if cancelled during the latency.
        """
        self._check_open()
        await self._delay()
        self.files[self._abs(path)] = bytes(data)

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        """Validate and unpack a tar archive into the in-memory files.

        **Cancellation**: nothing is unpacked if cancelled during the latency.
        """
        self._check_open()
        members = check_tar_members(tar_data)
        await self._delay()
        base = self._abs(dest_dir)
        with tarfile.open(fileobj=io.BytesIO(tar_data), mode="r:*") as tf:
            for m in members:
                if m.isfile():
                    f = tf.extractfile(m)
                    self.files[posixpath.normpath(posixpath.join(base, m.name))] = (
                        f.read() if f is not None else b""
                    )

    async def get_archive(self, path: str) -> bytes:
        """Pack a file, or every file under a directory, as a tar archive.

        **Cancellation**: nothing to clean up.
        """
        self._check_open()
        await self._delay()
        target = self._abs(path)
        if target in self.files:
            return pack_files({posixpath.basename(target): self.files[target]})
        prefix = target.rstrip("/") + "/"
        found = sorted(p for p in self.files if p.startswith(prefix))
        if not found:
            raise FileNotFoundError(f"No such file or directory: {path!r}")
        return pack_files({"./" + p[len(prefix) :]: self.files[p] for p in found})

    async def aclose(self, interrupted: bool = False) -> None:
        """Mark the sandbox closed after ``close_latency``; idempotent, each call recorded in ``closes``.

        **Cancellation**: the sandbox is marked closed anyway, as a real backend's kill would be.
        """
        self.close_count += 1
        self.closes.append(interrupted)
        try:
            if self.close_latency > 0:
                await anyio.sleep(self.close_latency)
        finally:
            self.closed = True

    # background processes: in-memory records the test drives

    async def start_background(
        self, command: str, *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> BackgroundProcess:
        """Record a running process.

        **Cancellation**: nothing to clean up.
        """
        self._check_open()
        await self._delay(command)
        proc = BackgroundProcess(
            session_id=f"proc_{secrets.token_hex(6)}",
            command=command,
            cwd=cwd or self.workdir,
            pid=1000 + len(self._background_table()),
            started_at=time.time(),
        )
        self._background_table()[proc.session_id] = proc
        self._outputs[proc.session_id] = ""
        return proc

    def finish_background(self, session_id: str, exit_code: int = 0, output: str = "") -> None:
        """Make a background process exit (test hook)."""
        proc = self._background_table()[session_id]
        self._background_table()[session_id] = replace(proc, exit_code=exit_code)
        self.append_background_output(session_id, output)

    def append_background_output(self, session_id: str, output: str) -> None:
        """Add output to a background process (test hook); the log keeps its tail."""
        log = self._outputs[session_id] + output
        excess = len(log) - BACKGROUND_LOG_LIMIT_BYTES
        if excess > 0:
            log = log[excess:]
            self._dropped[session_id] = self._dropped.get(session_id, 0) + excess
        self._outputs[session_id] = log

    async def background_status(
        self, session_id: str, *, tail_chars: int = 200_000
    ) -> BackgroundStatus:
        """Report the record.

        **Cancellation**: nothing to clean up.
        """
        self._check_open()
        proc = self._background_table()[session_id]
        output = self._outputs.get(session_id, "")[-tail_chars:] if tail_chars else ""
        dropped = self._dropped.get(session_id, 0)
        if dropped and tail_chars:
            output = dropped_marker(dropped) + output
        return BackgroundStatus(proc, not proc.exited, output, dropped)

    async def kill_background(self, session_id: str) -> bool:
        """Mark it exited with ``-1``.

        **Cancellation**: nothing to clean up.
        """
        self._check_open()
        proc = self._background_table()[session_id]
        if proc.exited:
            return False
        self._background_table()[session_id] = replace(proc, exit_code=-1)
        return True

    async def write_background_stdin(self, session_id: str, data: bytes) -> int:
        """Record the write in :attr:`stdin_writes`.

        **Cancellation**: nothing to clean up.
        """
        self._check_open()
        if self._background_table()[session_id].exited:
            raise OSError(f"{session_id} has exited")
        self.stdin_writes.setdefault(session_id, []).append(bytes(data))
        return len(data)

    async def close_background_stdin(self, session_id: str) -> None:
        """Record the close in :attr:`stdin_closed`.

        **Cancellation**: nothing to clean up.
        """
        self._check_open()
        if session_id not in self._background_table():
            raise KeyError(session_id)
        self.stdin_closed.add(session_id)


class FakeSandboxFactory:
    """A ``SandboxManager`` factory producing :class:`FakeSandbox` es, with creation faults.

    Args:
        sandbox: Hand out this one sandbox for every task; otherwise a new
            ``FakeSandbox(task_id, **sandbox_kwargs)`` per call.
        fail_create: Exception raised by creations (``None``: never fail).
        fail_times: With ``fail_create``: fail only the first ``n`` creations (``None``: all).
        create_hangs: Creations block until cancelled.
    """

    def __init__(
        self,
        *,
        sandbox: FakeSandbox | None = None,
        create_latency: float = 0.0,
        fail_create: BaseException | None = None,
        fail_times: int | None = None,
        create_hangs: bool = False,
        **sandbox_kwargs: object,
    ) -> None:
        self.sandbox = sandbox
        self.create_latency = create_latency
        self.fail_create = fail_create
        self.fail_times = fail_times
        self.create_hangs = create_hangs
        self.sandbox_kwargs = sandbox_kwargs
        self.created: list[FakeSandbox] = []
        self.attempts = 0

    async def __call__(self, task_id: str) -> Sandbox:
        """Create (or hand out) a fake sandbox for ``task_id``.

        **Cancellation**: nothing is created.
        """
        self.attempts += 1
        if self.create_latency > 0:
            await anyio.sleep(self.create_latency)
        if self.create_hangs:
            await anyio.sleep_forever()
        if self.fail_create is not None and (
            self.fail_times is None or self.attempts <= self.fail_times
        ):
            raise self.fail_create
        if self.sandbox is not None:
            self.sandbox.task_id = task_id
            sandbox = self.sandbox
        else:
            sandbox = FakeSandbox(task_id, **self.sandbox_kwargs)  # type: ignore[arg-type]
        self.created.append(sandbox)
        return sandbox
