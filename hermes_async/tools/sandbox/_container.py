"""What the exec-API backends (Docker, Modal, ssh, singularity) share: the exec protocol.

:data:`EXEC_WRAPPER` gives each command its own process group inside the container;
:data:`KILL_SCRIPT` kills that group from outside, and a kill is never lost.
:class:`ContainerSandbox` writes ``exec`` and the file transfers once, on two hooks a backend
implements. Protocol step by step: docs/decisions/033-container-exec-protocol.md.
"""

from __future__ import annotations

import logging
import shlex
import uuid
from abc import abstractmethod
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from dataclasses import dataclass

import anyio

from hermes_async._cleanup import cleanup_scope
from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox.base import (
    MAX_READ_BYTES,
    PID_REUSE_SH,
    TIMEOUT_EXIT_CODE,
    ByteSink,
    ExecRequest,
    ExecResult,
    Sandbox,
    resolve_path,
    small_int,
)
from hermes_async.tools.sandbox.errors import (
    NotARegularFileError,
    SandboxUnavailableError,
    TransferLimitError,
    UnavailableReason,
)
from hermes_async.tools.sandbox.output import OutputCapture

__all__ = (
    "EXEC_DIR",
    "EXEC_WRAPPER",
    "KILL_SCRIPT",
    "MISSING_EXIT",
    "ContainerExec",
    "ContainerSandbox",
    "pump_output",
    "read_until_exit",
)

logger = logging.getLogger("hermes_async.tools.sandbox")

#: Output kept from a helper command (mkdir, tar, rm, the group kill): its messages only.
_HELPER_OUTPUT_BYTES = 1 << 16

#: Directory inside the container for the wrapper's pid, cancel and stdin files.
EXEC_DIR = "/tmp/.hermes-exec"

#: Deadline of one streamed transfer's command.
TRANSFER_TIMEOUT_SECONDS = 600.0

#: Exit codes of the transfer scripts: missing / too large / not a regular file.
MISSING_EXIT, _TOO_LARGE, _NOT_REGULAR = 66, 67, 68

_STREAM_FILE = (
    f'[ -e "$1" ] || exit {MISSING_EXIT}; [ -f "$1" ] || exit {_NOT_REGULAR}; '
    'if [ "$2" -ge 0 ]; then s=$(stat -c %s -- "$1" 2>/dev/null || wc -c < "$1"); s=$((s)); '
    f'if [ "$s" -gt "$2" ]; then echo "$s" >&2; exit {_TOO_LARGE}; fi; fi; exec cat -- "$1"'
)
_STREAM_ARCHIVE = (
    f'[ -e "$1" ] || exit {MISSING_EXIT}; if [ -d "$1" ]; then exec tar -c -f - -C "$1" .; '
    'else exec tar -c -f - -C "$(dirname -- "$1")" -- "$(basename -- "$1")"; fi'
)

EXEC_WRAPPER = r"""
id=$1; dir=$2; in=$3; cmd=$4; d=${5:-/tmp/.hermes-exec}
{reuse}
mkdir -p "$d" 2>/dev/null && chmod 1777 "$d" 2>/dev/null
if [ -e "$d/$id.cancel" ]; then rm -f "$d/$id.cancel" "$in"; exit 124; fi
if command -v bash >/dev/null 2>&1; then sh_=bash; else sh_=/bin/sh; fi
if ! cd -- "$dir" 2>/dev/null; then
    printf '%s: cd: %s: No such file or directory\n' "${sh_##*/}" "$dir" >&2
    rm -f "$in"; exit 1
fi
src=${in:-/dev/null}
if command -v setsid >/dev/null 2>&1; then
    setsid "$sh_" -c "$cmd" <"$src" &
    pid=$!
else
    "$sh_" -c "$cmd" <"$src" &
    pid=$!
fi
note_start "$pid" "$d/$id.pid"
echo "$pid" >"$d/$id.pid"
if [ -e "$d/$id.cancel" ]; then kill -KILL -"$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null; fi
wait "$pid"
rc=$?
# Like the local backend: whatever the command left running in its group (`cmd &`) dies with it.
kill -KILL -"$pid" 2>/dev/null
rm -f "$d/$id.pid" "$d/$id.pid.start" "$d/$id.cancel" "$in"
exit $rc
""".replace("{reuse}", PID_REUSE_SH)

KILL_SCRIPT = r"""
id=$1; d=${2:-/tmp/.hermes-exec}
{reuse}
mkdir -p "$d" 2>/dev/null && chmod 1777 "$d" 2>/dev/null
: >"$d/$id.cancel"
if [ -f "$d/$id.pid" ] && read -r pid < "$d/$id.pid" && ! reused "$pid" "$d/$id.pid"; then
    # Before the child's setsid() the group does not exist yet: kill the pid itself then.
    kill -KILL -"$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    # Wait (bounded) until the group is gone, so the caller sees nothing left running.
    n=0
    while kill -0 -"$pid" 2>/dev/null && [ "$n" -lt 50 ]; do
        kill -KILL -"$pid" 2>/dev/null; sleep 0.1; n=$((n + 1))
    done
fi
exit 0
""".replace("{reuse}", PID_REUSE_SH)


def _exec_argv(
    exec_id: str, cwd: str, stdin_path: str, command: str, exec_dir: str = EXEC_DIR
) -> list[str]:
    argv = ["/bin/sh", "-c", EXEC_WRAPPER, "hermes-exec", exec_id, cwd, stdin_path, command]
    return argv if exec_dir == EXEC_DIR else [*argv, exec_dir]


def _kill_argv(exec_id: str, exec_dir: str = EXEC_DIR) -> list[str]:
    argv = ["/bin/sh", "-c", KILL_SCRIPT, "hermes-kill", exec_id]
    return argv if exec_dir == EXEC_DIR else [*argv, exec_dir]


async def read_until_exit(
    read_streams: Callable[[], Awaitable[None]],
    poll_exit: Callable[[], Awaitable[int | None]],
    *,
    first_poll_seconds: float = 0.5,
    max_poll_interval_seconds: float = 2.0,
    drain_grace_seconds: float = 0.2,
) -> int | None:
    """Read a command's output until its streams end or the command has exited.

    A background child can hold the streams open, so a poller asks whether the command exited.
    Returns the exit code if the poller learnt it, else ``None``.

    **Cancellation**: the reader and the poller are cancelled; nothing is left running.
    """
    exit_code: int | None = None
    error: Exception | None = None

    async with anyio.create_task_group() as tg:

        async def poll() -> None:
            nonlocal exit_code
            delay = first_poll_seconds
            while True:
                await anyio.sleep(delay)
                delay = min(delay * 2, max_poll_interval_seconds)
                try:
                    code = await poll_exit()
                except Exception:
                    return  # the reader (and its deadline) decides; no error group from here
                if code is not None:
                    exit_code = code
                    await anyio.sleep(drain_grace_seconds)
                    tg.cancel_scope.cancel("the command exited; its output is drained")
                    return

        tg.start_soon(poll)
        try:
            await read_streams()
        except Exception as exc:
            error = exc  # re-raised below, unwrapped
        tg.cancel_scope.cancel("the output streams ended")
    if error is not None:
        raise error
    return exit_code


async def pump_output(
    stdout: AsyncIterable[bytes | str],
    stderr: AsyncIterable[bytes | str],
    write_out: Callable[[bytes], Awaitable[None]],
    err: OutputCapture,
    *,
    read_failed: Callable[[Exception], Exception] | None = None,
) -> None:
    """Send stdout to ``write_out`` chunk by chunk and keep stderr in ``err``, until both end.

    Raises:
        Exception: What ``write_out`` raised, at once (both reads stop); else the first read
            error, once both reads ended. Never an exception group.
    """
    sink_errors: list[Exception] = []
    read_errors: list[Exception] = []

    async with anyio.create_task_group() as tg:

        async def pump(
            stream: AsyncIterable[bytes | str], deliver: Callable[[bytes], Awaitable[None]]
        ) -> None:
            try:
                async for chunk in stream:
                    try:
                        await deliver(chunk if isinstance(chunk, bytes) else str(chunk).encode())
                    except Exception as exc:
                        sink_errors.append(exc)
                        tg.cancel_scope.cancel("the output's sink raised")
                        return
            except Exception as exc:
                read_errors.append(exc)  # raised unwrapped below, not as an exception group

        async def keep_err(data: bytes) -> None:
            err.feed(data)

        tg.start_soon(pump, stdout, write_out)
        tg.start_soon(pump, stderr, keep_err)
    if sink_errors:
        raise sink_errors[0]
    if read_errors:
        if read_failed is None:
            raise read_errors[0]
        raise read_failed(read_errors[0]) from read_errors[0]


@dataclass(frozen=True, slots=True)
class ContainerExec:
    """One argv to run in a container, where its output goes, and its timeout.

    Attributes:
        limit: The command's timeout in seconds; the caller enforces it.
        out_sink: Hand stdout to this instead of ``out``; what it raises stops the command.
        user: Who runs it (``None``: the container's user).
    """

    argv: list[str]
    env: Mapping[str, str] | None
    out: OutputCapture
    err: OutputCapture
    limit: float
    out_sink: ByteSink | None = None
    user: str | None = None

    async def write_out(self, data: bytes) -> None:
        """Deliver a chunk of standard output (to ``out_sink`` or ``out``)."""
        if self.out_sink is not None:
            await self.out_sink(data)
        else:
            self.out.feed(data)


class ContainerSandbox(Sandbox):
    """A sandbox whose commands run inside a container through an exec API (Docker, Modal).

    ``exec`` is written here once; a backend implements :meth:`_run_argv` and
    :meth:`_stage_file`. ``close_timeout`` bounds a release owned by ``async with``.
    """

    kind: str = "container"
    #: Where the wrapper keeps its pid, cancel and stdin files (inside the sandbox).
    exec_dir: str = EXEC_DIR

    def __init__(
        self,
        task_id: str,
        workdir: str,
        *,
        home: str = "/root",
        default_exec_timeout: float,
        kill_timeout: float,
        close_timeout: float,
    ) -> None:
        self.task_id = task_id
        self.workdir = workdir
        self.home = home
        self.default_exec_timeout = default_exec_timeout
        self.kill_timeout = kill_timeout
        self.close_timeout = close_timeout
        self._closed = False
        self._gone: SandboxUnavailableError | None = None

    @property
    @abstractmethod
    def label(self) -> str:
        """A short name of the container for log lines (an id prefix)."""

    @abstractmethod
    async def _run_argv(self, run: ContainerExec) -> int:
        """Run ``run.argv`` in the container, streaming its output; return its exit code."""

    @abstractmethod
    async def _stage_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to the absolute ``path`` in the container (parents created)."""

    def _resolve(self, path: str) -> str:
        return resolve_path(self.workdir, path, self.home)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(
                f"the {self.kind} sandbox was closed; get a new one from the manager",
                task_id=self.task_id,
            )
        if self._gone is not None:
            raise self._gone

    def _mark_gone(
        self, detail: str, *, reason: UnavailableReason, backend: str | None = None
    ) -> SandboxUnavailableError:
        """Record that the container is gone (the first reason wins); return the error."""
        if self._gone is None:
            self._gone = SandboxUnavailableError(
                detail, reason=reason, backend=backend or self.kind, task_id=self.task_id
            )
        return self._gone

    @property
    def gone(self) -> SandboxUnavailableError | None:
        """Why the sandbox is gone, once a backend learnt it (else ``None``)."""
        return self._gone

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        """Run the command with ``sh -c`` in the container, in its own process group.

        Raises:
            SandboxUnavailableError: The container is gone (before or while the command ran).
            SandboxError: The backend is unreachable.

        **Cancellation**: the command's process group is killed (shielded, bounded by
        :attr:`kill_timeout`) before the cancellation propagates.
        """
        self._check_open()
        out, err = OutputCapture(request.output_limit), OutputCapture(request.output_limit)
        start = anyio.current_time()
        exit_code, timed_out = await self._execute(request, out, err)
        if self._gone is not None:
            # The container died under the command (the disk watchdog, an OOM-killed init):
            # its exit code says nothing about the command.
            raise self._gone
        return ExecResult(
            stdout=out.text(),
            stderr=err.text(),
            exit_code=exit_code,
            timed_out=timed_out,
            truncated=out.truncated or err.truncated,
            duration_seconds=anyio.current_time() - start,
        )

    async def _execute(
        self,
        request: ExecRequest,
        out: OutputCapture,
        err: OutputCapture,
        out_sink: ByteSink | None = None,
    ) -> tuple[int, bool]:
        """Run ``request`` through the wrapper; (exit code, timed out). Kills on failure."""
        limit = self.default_exec_timeout if request.timeout is None else request.timeout
        workdir = self.workdir if request.cwd is None else self._resolve(request.cwd)
        exec_id = uuid.uuid4().hex
        stdin_path = ""
        if request.stdin is not None:
            stdin_path = f"{self.exec_dir}/{exec_id}.in"
            await self._stage_file(stdin_path, request.stdin)
        argv = _exec_argv(exec_id, workdir, stdin_path, request.command, self.exec_dir)
        exit_code = TIMEOUT_EXIT_CODE
        try:
            with anyio.move_on_after(limit) as scope:
                exit_code = await self._run_argv(
                    ContainerExec(argv, request.env, out, err, limit, out_sink, request.user)
                )
        except BaseException:
            await self._kill_group(exec_id, "the command was cancelled or failed", request.user)
            raise
        if scope.cancelled_caught:
            exit_code = TIMEOUT_EXIT_CODE
            reason = f"the command timed out after {limit:g} s"
            await self._kill_group(exec_id, reason, request.user)
        return exit_code, scope.cancelled_caught

    async def _stream(
        self, script: str, path: str, sink: ByteSink, what: str, max_bytes: int | None
    ) -> int:
        """Run ``script`` (``$1`` = path, ``$2`` = the cap or -1) with its stdout to ``sink``."""
        self._check_open()
        counted = [0]

        async def counting(chunk: bytes) -> None:
            counted[0] += len(chunk)
            if max_bytes is not None and counted[0] > max_bytes:
                raise TransferLimitError(what, limit=max_bytes)
            await sink(chunk)

        cap = -1 if max_bytes is None else max_bytes
        command = f"set -- {shlex.quote(self._resolve(path))} {cap}; {script}"
        err = OutputCapture(_HELPER_OUTPUT_BYTES)
        code, timed_out = await self._execute(
            ExecRequest(command, timeout=TRANSFER_TIMEOUT_SECONDS, cwd="/"),
            OutputCapture(0),
            err,
            out_sink=counting,
        )
        detail = err.text().strip()
        if timed_out:
            raise OSError(f"{what} timed out after {TRANSFER_TIMEOUT_SECONDS:g} s")
        if code == MISSING_EXIT:
            raise FileNotFoundError(f"no such file or directory in the sandbox: {path!r}")
        if code == _NOT_REGULAR:
            raise NotARegularFileError(f"not a regular file in the sandbox: {path!r}")
        if code == _TOO_LARGE and max_bytes is not None:
            raise TransferLimitError(what, limit=max_bytes, size=small_int(detail))
        if code != 0:
            raise OSError(f"cannot read {path!r} in the sandbox: {detail or f'exit {code}'}")
        return counted[0]

    async def stream_file(self, path: str, sink: ByteSink, *, max_bytes: int | None = None) -> int:
        """Stream ``path`` from a ``cat`` in the container, size checked first.

        **Cancellation**: the ``cat``'s process group is killed.
        """
        return await self._stream(_STREAM_FILE, path, sink, f"file {path!r}", max_bytes)

    async def _read_capped(self, stream: Callable[..., Awaitable[int]], path: str) -> bytes:
        """What ``stream`` sends for ``path``, collected, at most :data:`MAX_READ_BYTES`."""
        data = bytearray()

        async def collect(chunk: bytes) -> None:
            data.extend(chunk)

        await stream(path, collect, max_bytes=MAX_READ_BYTES)
        return bytes(data)

    async def stream_archive(
        self, path: str, sink: ByteSink, *, max_bytes: int | None = None
    ) -> int:
        """Stream a tar of ``path`` from a ``tar`` in the container.

        **Cancellation**: the ``tar``'s process group is killed.
        """
        return await self._stream(_STREAM_ARCHIVE, path, sink, f"archive of {path!r}", max_bytes)

    async def _kill_group(self, exec_id: str, reason: str, user: str | None = None) -> None:
        """Kill the process group of exec ``exec_id``: shielded, bounded, never raising."""
        with cleanup_scope(
            f"kill exec {exec_id[:12]} in {self.kind} container {self.label}",
            self.kill_timeout,
            reason=reason,
            log=logger,
        ):
            sink = OutputCapture(_HELPER_OUTPUT_BYTES)
            try:
                argv = _kill_argv(exec_id, self.exec_dir)
                await self._run_argv(
                    ContainerExec(argv, None, sink, sink, self.kill_timeout, user=user)
                )
            except Exception as exc:  # the kill is cleanup: it must not mask the outcome
                logger.warning("could not kill exec %s in %s: %s", exec_id, self.label, exc)

    async def _helper(self, argv: list[str], timeout: float) -> tuple[int, str]:
        """Run a short helper command within ``timeout``: (exit code, stderr)."""
        code, _, err = await self._helper_output(argv, timeout)
        return code, err

    async def _helper_output(self, argv: list[str], timeout: float) -> tuple[int, str, str]:
        """:meth:`_helper` with the command's standard output: (exit code, stdout, stderr)."""
        out, err = OutputCapture(_HELPER_OUTPUT_BYTES), OutputCapture(_HELPER_OUTPUT_BYTES)
        with anyio.fail_after(timeout):
            code = await self._run_argv(ContainerExec(argv, None, out, err, timeout))
        return code, out.text(), err.text()

    # ----------------------------------------------------------------- files (defaults)

    async def read_bytes(self, path: str) -> bytes:
        """Return the contents of ``path``, at most :data:`MAX_READ_BYTES`.

        Raises:
            FileNotFoundError: ``path`` does not exist or is not a regular file.
            TransferLimitError: It is larger than ``MAX_READ_BYTES`` (stream it instead).

        **Cancellation**: nothing is left running in the container.
        """
        return await self._read_capped(self.stream_file, path)

    async def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (parents created).

        **Cancellation**: the file may be partly written.
        """
        self._check_open()
        await self._stage_file(self._resolve(path), data)

    async def get_archive(self, path: str) -> bytes:
        """Return a tar archive of ``path``, at most :data:`MAX_READ_BYTES`.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            TransferLimitError: The archive is larger than :data:`MAX_READ_BYTES`.

        **Cancellation**: nothing is left running in the container.
        """
        return await self._read_capped(self.stream_archive, path)
