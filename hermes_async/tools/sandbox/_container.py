"""Pieces shared by the container backends (Docker, Modal): decisions without I/O.

* :data:`EXEC_WRAPPER` / :data:`KILL_SCRIPT`: how a command gets its own process group inside a
  container and how that group is killed from outside (timeout, cancellation).
* :class:`OutputCapture`: head + tail truncation of a stream.
* :func:`require_asyncio`: the fail-fast check for asyncio-only client libraries.

The process-group protocol, step by step (POSIX ``sh``; busybox, dash and bash all qualify):

1. The backend runs ``sh -c EXEC_WRAPPER hermes-exec ID CWD STDIN_FILE COMMAND``.
2. The wrapper ``cd``\\ s, then starts ``setsid bash -c COMMAND`` (``sh`` when the image has no
   bash) in the background: the child is not a group leader, so ``setsid`` makes it the leader
   of a new session and process group whose id is its pid. Everything the command starts
   inherits that group.
3. The wrapper writes the pid to ``/tmp/.hermes-exec/ID.pid``, then checks for a cancel marker
   (the backend may have given up before the wrapper started), waits, kills what the command
   left running in its group (as the local backend does), and exits with the command's status.
4. To kill, the backend runs ``KILL_SCRIPT ID``: it first creates the cancel marker, then
   kills the group named in the pid file. Whichever of the two scripts runs second sees the
   other's file, so a kill is never lost.

A process that calls ``setsid`` itself (a daemon) leaves the group and survives; the container
itself is removed when the sandbox closes.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
from collections.abc import Awaitable, Callable

import anyio

from hermes_async.errors import ConfigError
from hermes_async.tools.sandbox.base import TIMEOUT_EXIT_CODE, ExecResult

__all__ = [
    "EXEC_DIR",
    "EXEC_WRAPPER",
    "KILL_SCRIPT",
    "OutputCapture",
    "exec_argv",
    "kill_argv",
    "read_until_exit",
    "require_asyncio",
    "resolve_path",
    "single_file_tar",
]

#: Directory inside the container for the wrapper's pid, cancel and stdin files.
EXEC_DIR = "/tmp/.hermes-exec"

EXEC_WRAPPER = r"""
d=/tmp/.hermes-exec; id=$1; dir=$2; in=$3; cmd=$4
mkdir -p "$d" 2>/dev/null
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
echo "$pid" >"$d/$id.pid"
if [ -e "$d/$id.cancel" ]; then kill -KILL -"$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null; fi
wait "$pid"
rc=$?
# Like the local backend: whatever the command left running in its group (`cmd &`) dies with it.
kill -KILL -"$pid" 2>/dev/null
rm -f "$d/$id.pid" "$d/$id.cancel" "$in"
exit $rc
"""

KILL_SCRIPT = r"""
d=/tmp/.hermes-exec; id=$1
mkdir -p "$d" 2>/dev/null
: >"$d/$id.cancel"
if [ -f "$d/$id.pid" ]; then
    pid=$(cat "$d/$id.pid")
    # Before the child's setsid() the group does not exist yet: kill the pid itself then.
    kill -KILL -"$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    # Wait (bounded) until the group is gone, so the caller sees nothing left running.
    n=0
    while kill -0 -"$pid" 2>/dev/null && [ "$n" -lt 50 ]; do
        kill -KILL -"$pid" 2>/dev/null; sleep 0.1; n=$((n + 1))
    done
fi
exit 0
"""


def exec_argv(exec_id: str, cwd: str, stdin_path: str, command: str) -> list[str]:
    """The argv that runs ``command`` through :data:`EXEC_WRAPPER`."""
    return ["/bin/sh", "-c", EXEC_WRAPPER, "hermes-exec", exec_id, cwd, stdin_path, command]


def kill_argv(exec_id: str) -> list[str]:
    """The argv that kills the process group of the command started as ``exec_id``."""
    return ["/bin/sh", "-c", KILL_SCRIPT, "hermes-kill", exec_id]


def resolve_path(workdir: str, path: str, home: str = "/root") -> str:
    """Resolve ``path`` against ``workdir`` (``~`` against ``home``) and normalise it.

    Raises:
        ValueError: ``path`` is empty or contains a NUL byte.
    """
    if not path or "\0" in path:
        raise ValueError(f"invalid sandbox path {path!r}: must be non-empty and without NUL")
    if path == "~":
        path = home
    elif path.startswith("~/"):
        path = posixpath.join(home, path[2:])
    return posixpath.normpath(posixpath.join(workdir, path))


class OutputCapture:
    """Keep the first ``limit // 2`` and last ``limit - limit // 2`` bytes, counting the rest.

    Memory stays bounded however much a command prints; the model sees the start (usually
    the command's own messages) and the end (usually the error) with a marker in between.
    """

    __slots__ = ("_head", "_limit", "_tail", "dropped")

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"output_limit must be >= 0, got {limit!r}")
        self._limit = limit
        self._head = bytearray()
        self._tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        """Append a chunk of output."""
        head_room = self._limit // 2 - len(self._head)
        if head_room > 0:
            self._head += data[:head_room]
            data = data[head_room:]
        if not data:
            return
        keep = self._limit - self._limit // 2
        self._tail += data
        excess = len(self._tail) - keep
        if excess > 0:
            del self._tail[:excess]
            self.dropped += excess

    @property
    def truncated(self) -> bool:
        """Whether bytes were dropped from the middle."""
        return self.dropped > 0

    def text(self) -> str:
        """The kept output as text (UTF-8, undecodable bytes replaced), with a marker."""
        head = bytes(self._head).decode("utf-8", errors="replace")
        tail = bytes(self._tail).decode("utf-8", errors="replace")
        if not self.dropped:
            return head + tail
        return f"{head}\n\n... [{self.dropped} bytes of output omitted] ...\n\n{tail}"


def single_file_tar(name: str, data: bytes, *, mode: int = 0o644) -> bytes:
    """A tar archive holding one regular file ``name`` with ``data``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def require_asyncio(backend: str, library: str) -> None:
    """Fail fast when an asyncio-only client library would run under another event loop.

    Raises:
        ConfigError: The current async library is not asyncio (e.g. trio).
    """
    current = _current_async_library()
    if current != "asyncio":
        raise ConfigError(
            f"the {backend} sandbox backend needs asyncio, but this code runs under {current!r}: "
            f"its client library {library} is built on asyncio and cannot run on another event "
            "loop; run the environment under asyncio (anyio.run(..., backend='asyncio')) or use "
            "terminal_backend='local'"
        )


async def read_until_exit(
    read_streams: Callable[[], Awaitable[None]],
    poll_exit: Callable[[], Awaitable[int | None]],
    *,
    first_poll_seconds: float = 0.5,
    max_poll_interval_seconds: float = 2.0,
    drain_grace_seconds: float = 0.2,
) -> int | None:
    """Read a command's output until its streams end or the command has exited.

    The streams normally end when the command exits. They stay open while a background
    child (``server &``) still holds them, though, so a poller asks the engine whether the
    command itself has exited (first after ``first_poll_seconds``, then backing off); once it
    has, reading continues for ``drain_grace_seconds`` and then stops.

    Returns:
        The exit code if the poller learnt it, else ``None`` (the caller asks the engine).

    Raises:
        Exception: Whatever ``read_streams`` raised, unwrapped (a failing poll only stops
            polling).

    **Cancellation**: both the reader and the poller are cancelled; nothing is left running
    on the host side.
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
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(poll)
        try:
            await read_streams()
        except Exception as exc:
            error = exc  # re-raised below, unwrapped
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return exit_code


def _current_async_library() -> str:
    # sniffio names the library when it is installed (it comes with trio); anyio itself does
    # not depend on it, so fall back to asking asyncio whether its loop is the one running.
    try:
        import sniffio

        return str(sniffio.current_async_library())
    except Exception:
        pass
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return "an event loop other than asyncio"
    return "asyncio"


async def run_killable(
    run: Callable[[], Awaitable[int]],
    kill: Callable[[], Awaitable[None]],
    limit: float,
    out: OutputCapture,
    err: OutputCapture,
) -> ExecResult:
    """Run one exec with the shared timeout semantics of the container backends.

    ``run`` streams the command's output into ``out``/``err`` and returns its exit code;
    ``kill`` kills the command's process group (it must itself be shielded and bounded). On
    timeout the group is killed and the result has exit code 124 and ``timed_out``; on
    cancellation or error the group is killed before the exception propagates.
    """
    start = anyio.current_time()
    exit_code: int | None = None
    try:
        with anyio.move_on_after(limit) as scope:
            exit_code = await run()
        timed_out = scope.cancelled_caught
    except BaseException:
        await kill()
        raise
    if timed_out:
        await kill()
        exit_code = TIMEOUT_EXIT_CODE
    assert exit_code is not None
    return ExecResult(
        stdout=out.text(),
        stderr=err.text(),
        exit_code=exit_code,
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
        duration_seconds=anyio.current_time() - start,
    )
