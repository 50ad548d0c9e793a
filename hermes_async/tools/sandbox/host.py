"""Host processes: run one bounded subprocess, remove directories in batches.

:func:`run_bounded` runs every local-backend command and host-side transfer step: a new
session, bounded output, a timeout that kills the group, shielded cleanup on cancellation.
On Linux it waits on a pidfd (docs/decisions/024-local-host-processes.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process

from hermes_async._cleanup import acquisition_scope, cleanup_scope
from hermes_async.tools.sandbox._batch import Batcher
from hermes_async.tools.sandbox.base import DEFAULT_OUTPUT_LIMIT_BYTES, TIMEOUT_EXIT_CODE, ByteSink
from hermes_async.tools.sandbox.output import OutputCapture
from hermes_async.tools.sandbox.processes import group_alive, signal_group

__all__ = (
    "KILL_WAIT_SECONDS",
    "TERMINATE_GRACE_SECONDS",
    "TRANSFER_TIMEOUT_SECONDS",
    "DirectoryRemover",
    "RawResult",
    "pidfd_child_watcher",
    "run_bounded",
    "start_process",
)

logger = logging.getLogger("hermes_async.tools.sandbox.local")

#: SIGTERM -> SIGKILL grace for a timed-out or cancelled command. Short: a sandbox command that
#: ignores SIGTERM for 2 s is not going to clean up usefully, and cancellation must stay prompt.
TERMINATE_GRACE_SECONDS = 2.0

#: After SIGKILL, how long to wait for the kernel to reap (a bound, never expected to matter).
KILL_WAIT_SECONDS = 5.0

#: Deadline of starting one local process (fork + exec; milliseconds in practice), shielded.
_PROCESS_START_TIMEOUT_SECONDS = 30.0

#: After the shell exited and its group was killed, how long to keep reading pipes that a
#: process outside the group (e.g. ``setsid x &`` without redirection) may still hold open.
_PIPE_DRAIN_GRACE_SECONDS = 2.0

#: Deadline for file transfers (``cat``/``tar`` subprocesses).
TRANSFER_TIMEOUT_SECONDS = 300.0

#: Most directories one ``rm`` removes (far below the kernel's argument-size limit).
_PATHS_PER_RM = 512

#: Deadline for closing a command's stdin pipe after the input was written.
_STDIN_CLOSE_SECONDS = 1.0

_READ_CHUNK = 65536


@contextmanager
def pidfd_child_watcher() -> Iterator[bool]:
    """On asyncio before 3.12, wait for child processes through pidfds for the block.

    Python 3.11's default watcher starts a thread per child (decision 024). Call it inside the
    running loop; the previous watcher is restored after. Yields whether it was installed.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not in asyncio (trio has no child watchers)
        loop = None
    if loop is None or sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        yield False
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        policy = asyncio.get_event_loop_policy()
        previous = getattr(policy, "_watcher", None)
        if previous is not None and not isinstance(previous, asyncio.ThreadedChildWatcher):
            yield False  # the application chose its watcher: leave it
            return
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(loop)  # 3.11's registers pidfds with the loop it is attached to
        asyncio.set_child_watcher(watcher)
    try:
        yield True
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_child_watcher(previous)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class RawResult:
    """Bytes-level outcome of :func:`run_bounded`.

    Attributes:
        exit_code: Exit status (``128 + n`` when killed by signal ``n``; 124 on timeout).
        stdout: Captured stdout (head + tail if truncated, a marker in between).
        pgid: The process group (= session) id the command ran in.
        stderr_prefixed: stderr began with ``run_bounded``'s ``stderr_prefix`` (removed).
    """

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    pgid: int
    stderr_prefixed: bool = False


class _Unprefix:
    """Feed a stream to ``sink`` without ``prefix`` if it starts with it; ``found`` says so."""

    __slots__ = ("_pending", "_prefix", "_sink", "found")

    def __init__(self, prefix: bytes, sink: OutputCapture) -> None:
        self._prefix = prefix
        self._sink = sink
        self._pending: bytearray | None = bytearray()  # None once the start is decided
        self.found = False

    def feed(self, data: bytes) -> None:
        pending = self._pending
        if pending is not None:
            pending += data
            if len(pending) < len(self._prefix) and self._prefix.startswith(pending):
                return  # too short to tell yet
            self._pending = None
            self.found = pending.startswith(self._prefix)
            data = bytes(pending[len(self._prefix) :] if self.found else pending)
        self._sink.feed(data)

    def finish(self) -> None:
        """Pass on what was held back (the stream ended inside the prefix)."""
        if self._pending:
            self._sink.feed(bytes(self._pending))
        self._pending = None


async def _drain(stream: ByteReceiveStream | None, sink: OutputCapture | _Unprefix) -> None:
    if stream is None:
        return
    try:
        while True:
            sink.feed(await stream.receive(_READ_CHUNK))
    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass


async def _feed(stream: ByteSendStream | None, data: bytes) -> None:
    if stream is None:
        return
    try:
        for i in range(0, len(data), _READ_CHUNK):
            await stream.send(data[i : i + _READ_CHUNK])
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass  # the command stopped reading stdin; not an error
    finally:
        with cleanup_scope("close a command's stdin", _STDIN_CLOSE_SECONDS):
            await stream.aclose()


async def _terminate(proc: Process, pgid: int, grace: float) -> None:
    """SIGTERM the group, wait ``grace`` for the leader, SIGKILL the group, wait (bounded)."""
    signal_group(pgid, signal.SIGTERM)
    if proc.returncode is None:
        with anyio.move_on_after(grace):
            await proc.wait()
    signal_group(pgid, signal.SIGKILL)
    if proc.returncode is None:
        with anyio.move_on_after(KILL_WAIT_SECONDS):
            await proc.wait()


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


class _FdReceiveStream(ByteReceiveStream):
    """The read end of a child's pipe, non-blocking, awaited with :func:`anyio.wait_readable`."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self._fd: int = file.fileno()
        os.set_blocking(self._fd, False)

    async def receive(self, max_bytes: int = _READ_CHUNK) -> bytes:
        while True:
            if self._file.closed:
                raise anyio.ClosedResourceError
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            if not data:
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        if not self._file.closed:
            anyio.notify_closing(self._fd)
            self._file.close()


class _FdSendStream(ByteSendStream):
    """The write end of a child's stdin pipe, non-blocking (see :class:`_FdReceiveStream`)."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self._fd: int = file.fileno()
        os.set_blocking(self._fd, False)

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            if self._file.closed:
                raise anyio.ClosedResourceError
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
            except BrokenPipeError as exc:
                raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        if not self._file.closed:
            anyio.notify_closing(self._fd)
            self._file.close()


class _PidfdProcess(Process):
    """A ``Popen`` child awaited through its pidfd; waiters take turns."""

    def __init__(self, popen: subprocess.Popen[bytes], pidfd: int) -> None:
        self._popen = popen
        self._pidfd: int | None = pidfd
        self._waiting = anyio.Lock()
        self._stdin = _FdSendStream(popen.stdin) if popen.stdin is not None else None
        self._stdout = _FdReceiveStream(popen.stdout) if popen.stdout is not None else None
        self._stderr = _FdReceiveStream(popen.stderr) if popen.stderr is not None else None

    async def wait(self) -> int:
        async with self._waiting:
            while self._popen.poll() is None:
                if self._pidfd is None:  # closed by aclose while the child still ran
                    await anyio.sleep(0.01)
                else:
                    await anyio.wait_readable(self._pidfd)
        return self._popen.returncode

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: signal.Signals) -> None:
        self._popen.send_signal(sig)

    async def aclose(self) -> None:
        """Close the pipes, wait for the child (the caller bounds it), close the pidfd."""
        for stream in (self._stdin, self._stdout, self._stderr):
            if stream is not None:
                await stream.aclose()
        try:
            await self.wait()
        finally:
            if self._pidfd is not None:
                anyio.notify_closing(self._pidfd)
                os.close(self._pidfd)
                self._pidfd = None

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    @property
    def stdin(self) -> ByteSendStream | None:
        return self._stdin

    @property
    def stdout(self) -> ByteReceiveStream | None:
        return self._stdout

    @property
    def stderr(self) -> ByteReceiveStream | None:
        return self._stderr


def _pidfds_work() -> bool:
    """Whether this process may open pidfds (a kernel >= 5.3 without a seccomp filter on it):
    asked once, of our own pid, before any command starts."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:
        logger.info("pidfd_open unavailable (%s): commands start with anyio.open_process", exc)
        return False
    return True


#: Whether :func:`run_bounded` drives children through pidfds (see the module docstring).
_use_pidfd = _pidfds_work()


def _start_pidfd(argv: Sequence[str], **kwargs: Any) -> Process:
    """Start ``argv`` with ``Popen`` and open its pidfd, synchronously (no checkpoint to cut it).

    If the pidfd cannot be opened, the child is killed and reaped (bounded) and the error raised.
    """
    popen = subprocess.Popen(argv, bufsize=0, **kwargs)
    try:
        pidfd = os.pidfd_open(popen.pid)
    except OSError:
        popen.kill()
        popen.wait(KILL_WAIT_SECONDS)
        for file in (popen.stdin, popen.stdout, popen.stderr):
            if file is not None:
                file.close()
        raise
    return _PidfdProcess(popen, pidfd)


async def start_process(
    argv: Sequence[str], *, timeout: float = _PROCESS_START_TIMEOUT_SECONDS, **kwargs: Any
) -> Process:
    """Start a host process shielded and bounded by ``timeout``; ``kwargs`` go to ``open_process``.

    asyncio leaks a half-built subprocess transport when a cancellation lands inside creation.

    Raises:
        TimeoutError: The start took longer than ``timeout`` (a machine out of processes).
    """
    with acquisition_scope(timeout):
        return await anyio.open_process(argv, **kwargs)


async def run_bounded(
    argv: list[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float,
    stdin: bytes | None = None,
    output_limit: int | None = DEFAULT_OUTPUT_LIMIT_BYTES,
    terminate_grace: float = TERMINATE_GRACE_SECONDS,
    on_start: Callable[[int], None] | None = None,
    on_exit: Callable[[int], None] | None = None,
    stdout_sink: ByteSink | None = None,
    stderr_prefix: bytes = b"",
) -> RawResult:
    """Run ``argv`` in a new session, drain its output into bounded buffers, enforce ``timeout``.

    ``env=None`` inherits; ``stdin=None`` is ``/dev/null``; ``output_limit=None`` keeps
    everything. ``on_start`` and ``on_exit`` get the group id after the start and after the
    reap. ``stdout_sink`` takes stdout chunk by chunk; its exception kills the group.
    ``stderr_prefix``: removed from the start of stderr, before the limit applies; the result
    says whether it was there.

    **Cancellation**: the process group is terminated (TERM, grace, KILL), shielded and bounded.
    """
    # Shielded (and bounded): asyncio leaks the half-built subprocess transport (its pipes
    # and the child) when a cancellation lands inside subprocess creation. Starting a local
    # process takes milliseconds; the caller's cancellation is delivered right after, with the
    # group's cleanup below.
    spawn: dict[str, Any] = {
        "stdin": subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
        "cwd": cwd,
        "env": env,
        "start_new_session": True,
    }
    proc = _start_pidfd(argv, **spawn) if _use_pidfd else await start_process(argv, **spawn)
    pgid = proc.pid
    if on_start is not None:
        on_start(pgid)
    out, err = OutputCapture(output_limit), OutputCapture(output_limit)
    err_in = _Unprefix(stderr_prefix, err) if stderr_prefix else err
    timed_out = False
    failure: list[Exception] = []
    ending = "cancelled or failed"  # why the group is cleaned up, for an overrun log line
    try:
        async with anyio.create_task_group() as tg:
            drained = anyio.Event()
            remaining = [2]

            async def drain(
                stream: ByteReceiveStream | None, sink: OutputCapture | _Unprefix
            ) -> None:
                await _drain(stream, sink)
                remaining[0] -= 1
                if remaining[0] == 0:
                    drained.set()

            async def stream_out(stream: ByteReceiveStream | None, sink: ByteSink) -> None:
                try:
                    if stream is not None:
                        while True:
                            await sink(await stream.receive(_READ_CHUNK))
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass
                except Exception as exc:  # raised unwrapped below, not as an exception group
                    failure.append(exc)
                    tg.cancel_scope.cancel("the output sink raised")
                    return
                remaining[0] -= 1
                if remaining[0] == 0:
                    drained.set()

            if stdout_sink is None:
                tg.start_soon(drain, proc.stdout, out)
            else:
                tg.start_soon(stream_out, proc.stdout, stdout_sink)
            tg.start_soon(drain, proc.stderr, err_in)
            if stdin is not None:
                tg.start_soon(_feed, proc.stdin, stdin)
            with anyio.move_on_after(timeout) as scope:
                await proc.wait()
            if scope.cancelled_caught:
                timed_out = True
                ending = f"timed out after {timeout:g} s"
                await _terminate(proc, pgid, terminate_grace)
            else:
                ending = "exited"
                # Kill what the shell left behind in its group (`cmd &`) so pipes reach EOF.
                signal_group(pgid, signal.SIGKILL)
            with anyio.move_on_after(_PIPE_DRAIN_GRACE_SECONDS):
                await drained.wait()
            tg.cancel_scope.cancel("the command ended and its output is drained")
        if failure:
            ending = f"its output sink raised {type(failure[0]).__name__}"
            raise failure[0]
    finally:
        with cleanup_scope(
            f"terminate process group {pgid} ({argv[0]})",
            terminate_grace + KILL_WAIT_SECONDS + 1,
            reason=f"the command {ending}",
            log=logger,
        ):
            if proc.returncode is None:
                await _terminate(proc, pgid, terminate_grace)
            else:
                signal_group(pgid, signal.SIGKILL)
            await proc.aclose()
            # Return only once every member is really gone (not just signalled).
            while group_alive(pgid):
                signal_group(pgid, signal.SIGKILL)
                await anyio.sleep(0.01)
        if on_exit is not None:
            on_exit(pgid)
    code = TIMEOUT_EXIT_CODE if timed_out else _exit_code(proc.returncode)
    prefixed = False
    if isinstance(err_in, _Unprefix):
        err_in.finish()
        prefixed = err_in.found
    return RawResult(
        code, out.value(), err.value(), timed_out, out.truncated or err.truncated, pgid, prefixed
    )


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


async def _run_sh(script: str, paths: Sequence[str], what: str) -> RawResult | None:
    """Run ``script`` over ``paths`` (as ``$@``) in a bounded host ``sh``; ``None`` if it could
    not start (logged)."""
    try:
        return await run_bounded(
            ["/bin/sh", "-c", script, "sh", *paths],
            timeout=TRANSFER_TIMEOUT_SECONDS,
            env={"PATH": "/usr/bin:/bin"},
            output_limit=4096,
        )
    except OSError as exc:
        logger.warning("could not remove %s %s: %s", what, list(paths), exc)
        return None


class DirectoryRemover:
    """Remove sandbox directories, one ``rm`` for all the removals that arrive together.

    ``chmod`` first, so ``chmod 000 dir`` cannot make cleanup fail. Failures are logged.
    """

    def __init__(self) -> None:
        self._batches: Batcher[str] = Batcher()
        self._cgroups: Batcher[str] = Batcher()

    @property
    def runs(self) -> int:
        """How many ``rm`` batches ran."""
        return self._batches.runs

    async def remove_cgroups(self, paths: Sequence[str]) -> None:
        """Remove empty cgroup directories in a child process (``rmdir`` can stall the loop).

        **Cancellation**: as :meth:`remove`.
        """
        async with anyio.create_task_group() as tg:
            for path in paths:
                tg.start_soon(self._cgroups.submit, path, self._rmdir_all)

    async def _rmdir_all(self, paths: list[str]) -> None:
        for i in range(0, len(paths), _PATHS_PER_RM):
            chunk = paths[i : i + _PATHS_PER_RM]
            # In rounds over all of them (not one directory's retries after another): after
            # hundreds of worlds die at once many groups stay busy for a while as the kernel
            # reaps their members, and waiting for each in turn took longer than the release's
            # bound (the sandbox directories, removed after, were then left behind).
            script = (
                "left=$(printf '%s\\n' \"$@\"); n=0\n"
                'while [ -n "$left" ] && [ "$n" -lt 250 ]; do\n'
                "  next=$(printf '%s\\n' \"$left\" | while IFS= read -r d; do\n"
                '    [ -n "$d" ] && [ -d "$d" ] && ! rmdir -- "$d" 2>/dev/null && printf \'%s\\n\' "$d"\n'
                "  done)\n"
                '  left=$next; n=$((n + 1)); [ -n "$left" ] && sleep 0.02\n'
                "done\n"
                '[ -z "$left" ] || printf \'%s\\n\' "$left" >&2\n'
            )
            raw = await _run_sh(script, chunk, "cgroups")
            if raw is not None and raw.stderr.strip():
                logger.warning("cgroups still busy, left behind: %s", _decode(raw.stderr).split())

    async def remove(self, path: str) -> None:
        """Remove ``path`` and everything under it, in a batch that starts after this call.

        **Cancellation**: bounded by ``TRANSFER_TIMEOUT_SECONDS``; a cancelled caller running the
        batch kills its ``rm`` and the others start a new one.
        """
        await self._batches.submit(path, self._remove_all)

    async def _remove_all(self, paths: list[str]) -> None:
        for i in range(0, len(paths), _PATHS_PER_RM):
            chunk = paths[i : i + _PATHS_PER_RM]
            script = 'chmod -R u+rwx -- "$@" 2>/dev/null; rm -rf -- "$@"'
            raw = await _run_sh(script, chunk, "sandbox directories")
            if raw is not None and raw.exit_code != 0:
                logger.warning(
                    "could not remove sandbox directories %s: %s", chunk, _decode(raw.stderr)
                )
