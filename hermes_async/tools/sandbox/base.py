"""The sandbox interface every backend implements.

A sandbox is one rollout's private machine: a working directory, an allowlisted environment,
its processes. A failed command is an :class:`ExecResult`; an unreachable sandbox raises
:class:`~hermes_async.errors.SandboxError`. Contract: docs/architecture.md, "The sandbox contract".
"""

from __future__ import annotations

import math
import posixpath
import re
import secrets
import shlex
import time
import types
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from hermes_async._cleanup import cleanup_scope
from hermes_async._resource import AsyncResource
from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox.archive import check_tar_members, directory_tar
from hermes_async.tools.sandbox.errors import (
    SandboxUnavailableError,
    TransferLimitError,
)
from hermes_async.tools.sandbox.spec import SandboxSnapshot

__all__ = (
    "BACKGROUND_LOG_LIMIT_BYTES",
    "BACKGROUND_OUTPUT_CHARS",
    "DEFAULT_CLOSE_TIMEOUT_SECONDS",
    "DEFAULT_OUTPUT_LIMIT_BYTES",
    "MAX_READ_BYTES",
    "TIMEOUT_EXIT_CODE",
    "USER_NAME",
    "BackgroundProcess",
    "BackgroundStatus",
    "ByteSink",
    "ExecRequest",
    "ExecResult",
    "Sandbox",
    "SandboxFactory",
    "SandboxProvider",
    "SandboxUnavailableError",
    "TransferLimitError",
    "check_tar_members",
    "dropped_marker",
    "resolve_path",
    "small_int",
)

#: Exit code reported for a command killed by its timeout (what coreutils' ``timeout`` uses).
TIMEOUT_EXIT_CODE = 124

#: Output kept in memory per stream before head+tail truncation (1 MiB: far above what any tool
#: shows the model, far below what could hurt the host when hundreds of commands run at once).
DEFAULT_OUTPUT_LIMIT_BYTES = 1 << 20

#: Rolling output a background process keeps visible (the reference's 200,000-char buffer).
BACKGROUND_OUTPUT_CHARS = 200_000

#: Most bytes a background process's log keeps on disk (a ring of rotated segments; what falls
#: out is counted and marked). 8 MiB: forty times what the model can see of it
#: (:data:`BACKGROUND_OUTPUT_CHARS`), a few MiB of disk per runaway ``yes``.
BACKGROUND_LOG_LIMIT_BYTES = 8 << 20

#: Largest file ``read_bytes`` returns on the local and Docker backends (Inspect's
#: ``read_file`` cap): a bigger one raises
#: :class:`~hermes_async.tools.sandbox.errors.TransferLimitError`; stream it instead.
MAX_READ_BYTES = 100 << 20

#: Chunk size of streamed transfers (:meth:`Sandbox.stream_file`, :meth:`Sandbox.stream_archive`).
_TRANSFER_CHUNK_BYTES = 1 << 16

#: ``async (chunk) -> None``: where a streamed transfer's bytes go; raising stops the transfer.
ByteSink = Callable[[bytes], Awaitable[None]]

#: Background processes tracked per sandbox (the reference's cap); exited ones are forgotten first.
_MAX_BACKGROUND_PROCESSES = 64

#: Seconds a background process group gets between SIGTERM and SIGKILL.
BACKGROUND_KILL_GRACE_SECONDS = 2.0

#: Bound of a release owned by ``async with sandbox:`` (the manager's default ``close_timeout``).
DEFAULT_CLOSE_TIMEOUT_SECONDS = 30.0

#: Deadline for each short bookkeeping ``exec`` (status probe, kill, stdin write).
BACKGROUND_EXEC_TIMEOUT_SECONDS = 30.0

#: Shell functions (POSIX sh, no fork) for the pids that scripts record in files. A pid file
#: ``F`` may have ``F.start`` beside it: the process's start time (field 22 of ``/proc/PID/stat``),
#: written by ``note_start PID F``. ``reused PID F`` is true when a live process PID started at
#: another time: the kernel gave the number to someone else (on an ssh host, perhaps another
#: sandbox's command), so PID is not signalled. A recorded session leader that is gone still
#: names its session: Linux keeps a number while any process has it as its session or group.
#: Without ``/proc`` (or an older file) nothing counts as reused, as before. The same rule on
#: this host, in Python: ``processes.process_tag`` and ``tag_alive``.
PID_REUSE_SH = (
    'start_ticks() { ticks=; { read -r l < "/proc/$1/stat"; } 2>/dev/null || return 1; '
    'set -- ${l##*) }; ticks=${20}; [ -n "$ticks" ]; }; '
    'note_start() { start_ticks "$1" && { echo "$ticks" > "$2.start"; } 2>/dev/null; true; }; '
    'reused() { [ -s "$2.start" ] && start_ticks "$1" '
    '&& { read -r s < "$2.start"; } 2>/dev/null && [ "$ticks" != "$s" ]; }'
)


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of one command; output decoded as UTF-8, bad bytes replaced.

    Attributes:
        exit_code: The exit status; ``124`` when killed by the timeout.
        timed_out: The command hit its timeout and its process group was killed.
        truncated: A stream passed the output limit; head and tail were kept.
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


@dataclass(frozen=True, slots=True)
class BackgroundProcess:
    """A process started with :meth:`Sandbox.start_background`.

    Attributes:
        session_id: ``proc_<hex>``, the id the model uses with the ``process`` tool.
        pid: Process (= group = session) id inside the sandbox, if known.
        exit_code: Set once it is known to have exited (``-1``: killed or lost).
        state_dir: Where its ``pid``, ``log`` and ``exit`` files are.
    """

    session_id: str
    command: str
    cwd: str
    pid: int | None
    started_at: float
    exit_code: int | None = None
    state_dir: str = ""

    @property
    def exited(self) -> bool:
        """Whether the process is known to have exited."""
        return self.exit_code is not None


@dataclass(frozen=True, slots=True)
class BackgroundStatus:
    """A snapshot of a background process.

    Attributes:
        output: The last ``tail_chars`` characters of its output, after a
            :func:`dropped_marker` when its log dropped some.
        dropped_bytes: Bytes its bounded log has dropped so far.
    """

    process: BackgroundProcess
    running: bool
    output: str
    dropped_bytes: int = 0

    @property
    def exit_code(self) -> int | None:
        """The exit code once exited, else ``None``."""
        return self.process.exit_code


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """One validated, normalised command: what :meth:`Sandbox.exec` hands to the backend.

    Fields as :meth:`Sandbox.exec`'s arguments; ``cwd=""`` becomes ``None``, a negative
    ``timeout`` ``0``, ``env`` read-only.

    Raises:
        TypeError: ``command`` is not a string.
        ValueError: A NUL byte, bad variable name or user, NaN timeout, negative limit.
    """

    command: str
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    timeout: float | None = None
    stdin: bytes | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT_BYTES
    user: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.command, str):
            raise TypeError(f"command must be a string, got {type(self.command).__name__}")
        if "\0" in self.command:
            raise ValueError("command contains a NUL byte; shells cannot run it")
        if self.cwd is not None and "\0" in self.cwd:
            raise ValueError(f"cwd contains a NUL byte: {self.cwd!r}")
        if self.cwd == "":
            object.__setattr__(self, "cwd", None)
        if self.env is not None:
            bad = [k for k in self.env if not _is_variable_name(k)]
            if bad:
                raise ValueError(
                    f"invalid environment variable name(s): {bad!r}; names must be non-empty "
                    "and contain neither '=' nor NUL"
                )
            bad = [k for k, v in self.env.items() if "\0" in v]
            if bad:
                raise ValueError(f"environment variable value(s) with a NUL byte: {bad!r}")
            env = types.MappingProxyType(dict(self.env)) if self.env else None
            object.__setattr__(self, "env", env)
        if self.timeout is not None:
            if math.isnan(self.timeout):
                raise ValueError("exec timeout is NaN; pass seconds >= 0 or None")
            object.__setattr__(self, "timeout", max(0.0, float(self.timeout)))
        if self.output_limit < 0:
            raise ValueError(f"output_limit must be >= 0 bytes, got {self.output_limit!r}")
        if self.user is not None and not USER_NAME.fullmatch(self.user):
            raise ValueError(
                f"user must be a user name or a uid (letters, digits, '_', '-', '.'), "
                f"got {self.user!r}"
            )


#: What ``ExecRequest.user`` may hold: a user name or a uid.
USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


#: A number a sandbox-written file may hold (an exit code, a pid, a byte count): ASCII digits
#: only (``int`` also takes ``"٣"`` and refuses ``"²"`` and 4,301 digits).
_SMALL_INT = re.compile(r"-?[0-9]{1,18}")


def small_int(text: str) -> int | None:
    """``text`` (stripped) as an int if it is a short decimal number, else ``None``: how a
    number the sandbox printed or wrote is read (``str.isdigit`` takes ``"²"``, which ``int``
    refuses)."""
    text = text.strip()
    return int(text) if _SMALL_INT.fullmatch(text) else None


def _is_variable_name(name: object) -> bool:
    """What ``execve`` accepts as a variable name (also the local factory's check)."""
    return isinstance(name, str) and bool(name) and "=" not in name and "\0" not in name


def dropped_marker(dropped_bytes: int) -> str:
    """The line in front of a background output whose log dropped ``dropped_bytes``."""
    return (
        f"[... {dropped_bytes:,} bytes of earlier output dropped: a background log keeps its "
        f"last {BACKGROUND_LOG_LIMIT_BYTES >> 20} MiB ...]\n"
    )


def resolve_path(workdir: str, path: str, home: str) -> str:
    """Resolve ``path`` inside a sandbox: against ``workdir``, ``~`` against ``home``; normalised.

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


class Sandbox(AsyncResource):
    """One rollout's isolated execution environment.

    ``async with sandbox:`` owns the release: on exit ``aclose`` runs shielded, bounded by
    :attr:`close_timeout` (``None``: an owner bounds it), ``interrupted`` if the block raised.
    :attr:`workdir` is where commands start and relative paths resolve.
    """

    task_id: str
    workdir: str
    background_state_dir: str = "/tmp/.hermes_async/bg"
    close_timeout: float | None = DEFAULT_CLOSE_TIMEOUT_SECONDS

    async def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT_BYTES,
        user: str | None = None,
    ) -> ExecResult:
        """Run ``command`` through the sandbox's shell and wait for it.

        Args:
            cwd: Working directory (default :attr:`workdir`).
            env: Extra variables on top of the allowlisted environment.
            timeout: Seconds before the whole process group is killed (exit 124).
            stdin: Bytes written to standard input, then closed.
            output_limit: Bytes kept per stream; beyond it, head and tail are kept.
            user: Run as this user (see :attr:`switches_users`).

        Raises:
            ValueError: An invalid argument (see :class:`ExecRequest`).
            SandboxError: The sandbox is closed or unreachable, or it cannot switch users.

        **Cancellation**: the command's process group is killed before this returns.
        """
        request = ExecRequest(
            command,
            cwd=cwd,
            env=env,
            timeout=timeout,
            stdin=stdin,
            output_limit=output_limit,
            user=user,
        )
        if user is not None and not self.switches_users:
            raise SandboxError(
                f"the {type(self).__name__} backend cannot run a command as user {user!r}; "
                "use the Docker backend or run without user=",
                task_id=getattr(self, "task_id", None),
            )
        return await self.exec_request(request)

    @property
    def switches_users(self) -> bool:
        """Whether ``exec(..., user=...)`` works here (the Docker backend and the fake)."""
        return False

    @abstractmethod
    async def exec_request(self, request: ExecRequest) -> ExecResult:
        """Run one validated command: the backend's hook behind :meth:`exec`, same semantics.

        **Cancellation**: the command's process group must be killed before this returns.
        """

    @abstractmethod
    async def read_bytes(self, path: str) -> bytes:
        """Return the contents of ``path``.

        Raises:
            FileNotFoundError: ``path`` does not exist or is not a regular file.
        """

    @abstractmethod
    async def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path``, creating parent directories.

        Raises:
            OSError: The path cannot be written.
        """

    @abstractmethod
    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        """Extract a tar archive into ``dest_dir``, after :func:`check_tar_members`.

        Raises:
            ValueError: A member is absolute, escapes ``dest_dir``, or is a device or outside link.
        """

    async def put_tree(self, dest_dir: str, source: Path) -> None:
        """Copy host folder ``source`` into ``dest_dir``; links stay links.

        This default packs the folder in memory; the Docker backend streams it.

        **Cancellation**: the copy may be partial.
        """
        await self.put_archive(dest_dir, directory_tar(source, prefix="./"))

    @abstractmethod
    async def get_archive(self, path: str) -> bytes:
        """Return a tar of ``path``: a folder's members as ``./x/y``, a file as its basename.

        Raises:
            FileNotFoundError: ``path`` does not exist.
        """

    async def stream_file(self, path: str, sink: ByteSink, *, max_bytes: int | None = None) -> int:
        """Hand regular file ``path`` to ``sink`` in chunks; return its size.

        Past ``max_bytes`` it stops (the sink may hold a part). This default reads the file whole.

        Raises:
            FileNotFoundError: ``path`` does not exist or is not a regular file.
            TransferLimitError: The file is larger than ``max_bytes``.

        **Cancellation**: the transfer stops; whatever the sandbox ran for it is killed.
        """
        return await _deliver_whole(await self.read_bytes(path), sink, f"file {path!r}", max_bytes)

    async def stream_archive(
        self, path: str, sink: ByteSink, *, max_bytes: int | None = None
    ) -> int:
        """Hand a tar of ``path`` (as :meth:`get_archive`) to ``sink``; stops past ``max_bytes``.

        **Cancellation**: the transfer stops; whatever the sandbox ran for it is killed.
        """
        return await _deliver_whole(
            await self.get_archive(path), sink, f"archive of {path!r}", max_bytes
        )

    def can_snapshot(self) -> bool:
        """Whether :meth:`snapshot` works on this backend (it overrides it)."""
        return type(self).snapshot is not Sandbox.snapshot

    async def snapshot(self) -> SandboxSnapshot:
        """Freeze the sandbox's files into a snapshot new sandboxes start from (not its processes).

        Raises:
            SandboxError: The backend has no snapshots, or taking one failed.
        """
        raise SandboxError(
            f"the {type(self).__name__} backend cannot snapshot a sandbox",
            task_id=getattr(self, "task_id", None),
        )

    async def alive(self) -> bool:
        """Whether the sandbox can run commands now; the caller bounds it.

        The default wants ``true`` to exit 0; a raise counts as dead.
        """
        if getattr(self, "gone", None) is not None:
            return False
        result = await self.exec("true", timeout=10)
        return result.exit_code == 0

    async def watch(self) -> None:
        """Watch the sandbox while it lives; the manager runs it in its task group.

        It must not raise for a sandbox problem: record it so the next operation raises
        :class:`~hermes_async.tools.sandbox.errors.SandboxUnavailableError`.

        **Cancellation**: cancelled at the release; nothing to clean up.
        """

    @abstractmethod
    async def aclose(self, interrupted: bool = False) -> None:
        """Kill every process the sandbox started and remove it. Idempotent.

        Args:
            interrupted: The rollout was cancelled or timed out; graceful steps may be skipped.

        **Cancellation**: not shielded here: the release's owner runs it under one shielded, bounded
        scope (:func:`hermes_async._cleanup.bounded_cleanup` when standalone).
        """

    async def _close_on_exit(self, exc: BaseException | None) -> None:
        """Close the sandbox under a shielded, bounded scope: the block owns the release.

        **Cancellation**: the close completes, or is abandoned at :attr:`close_timeout`.
        """
        if self.close_timeout is None:
            await self.aclose(interrupted=exc is not None)
            return
        with cleanup_scope(
            f"close the sandbox of {getattr(self, 'task_id', '?')!r}",
            self.close_timeout,
            reason="its async-with block raised or was cancelled" if exc else "its block ended",
        ):
            await self.aclose(interrupted=exc is not None)

    # ----------------------------------------------------------------------------------------
    # Background processes: a default built only on exec/write_bytes (see the module docstring).

    def _background_table(self) -> dict[str, BackgroundProcess]:
        try:
            table: dict[str, BackgroundProcess] = self.__dict__["_hermes_background"]
        except KeyError:
            table = self.__dict__["_hermes_background"] = {}
        return table

    def background_processes(self) -> list[BackgroundProcess]:
        """Every tracked background process, oldest first (exited ones included)."""
        return sorted(self._background_table().values(), key=lambda p: p.started_at)

    def get_background(self, session_id: str) -> BackgroundProcess | None:
        """The tracked process ``session_id``, or ``None``."""
        return self._background_table().get(session_id)

    def forget_background(self, session_id: str) -> None:
        """Stop tracking ``session_id`` (it is not killed)."""
        self._background_table().pop(session_id, None)

    def _background_started(self, process: BackgroundProcess) -> None:
        """Hook: a background process was started (LocalSandbox records its session id)."""

    async def start_background(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> BackgroundProcess:
        """Start ``command`` detached, in its own session; return at once.

        Raises:
            SandboxError: The wrapper could not start, or too many processes are running.

        **Cancellation**: a started process keeps running; ``aclose`` kills it.
        """
        table = self._background_table()
        if len(table) >= _MAX_BACKGROUND_PROCESSES:
            for old in self.background_processes():
                if old.exited:
                    table.pop(old.session_id, None)
                if len(table) < _MAX_BACKGROUND_PROCESSES:
                    break
            else:
                raise SandboxError(
                    f"too many background processes ({len(table)} running, limit "
                    f"{_MAX_BACKGROUND_PROCESSES}); kill some with process(action='kill')",
                    task_id=getattr(self, "task_id", None),
                )
        session_id = f"proc_{secrets.token_hex(6)}"
        state = posixpath.join(self.background_state_dir, session_id)
        # Relative to the working directory, not to the state directory the wrapper starts in.
        cwd = posixpath.normpath(posixpath.join(self.workdir, cwd or "."))
        await self.write_bytes(posixpath.join(state, "cmd.sh"), command.encode())
        await self.write_bytes(posixpath.join(state, "run.sh"), _wrapper_script(state, cwd))
        # Wait (bounded) for the wrapper to write its pid: only then is it in its own session,
        # safe from the kill of the launching shell's process group.
        launch = (
            f"cd {shlex.quote(state)} && "
            "if command -v setsid >/dev/null 2>&1; then "
            "setsid sh ./run.sh </dev/null >/dev/null 2>&1 & "
            "else set -m; sh ./run.sh </dev/null >/dev/null 2>&1 & fi; "
            "i=0; while [ ! -s pid ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done; "
            "cat pid"
        )
        result = await self.exec(launch, env=env, timeout=BACKGROUND_EXEC_TIMEOUT_SECONDS)
        pid_text = result.stdout.strip().splitlines()[-1:] if result.stdout.strip() else []
        pid = small_int(pid_text[0]) if pid_text else None
        if result.exit_code != 0 or pid is None or pid < 0:
            raise SandboxError(
                f"could not start a background process (exit {result.exit_code}): "
                f"{result.output.strip()[:500]!r}; the sandbox needs sh, setsid and mkfifo",
                task_id=getattr(self, "task_id", None),
            )
        process = BackgroundProcess(
            session_id=session_id,
            command=command,
            cwd=cwd,
            pid=pid,
            started_at=time.time(),
            state_dir=state,
        )
        table[session_id] = process
        self._background_started(process)
        return process

    async def background_status(
        self, session_id: str, *, tail_chars: int = BACKGROUND_OUTPUT_CHARS
    ) -> BackgroundStatus:
        """Probe ``session_id``: running or exited, and its output tail.

        Raises:
            KeyError: No such tracked process.

        **Cancellation**: nothing to clean up; the probe is a short ``exec``.
        """
        proc = self._background_table()[session_id]
        state = shlex.quote(proc.state_dir)
        # One round trip: line 1 "running"|"exited", line 2 the exit code (or empty), line 3
        # the bytes the ring dropped, then the log's tail (the previous segment, then the
        # current one).
        # The command can write every file of its state directory: regular files only (a
        # FIFO would block the probe), one short line of `exit` and `dropped` (more lines would
        # shift the ones after), the log's tail by seeking (not a sparse terabyte read through).
        n = int(tail_chars) * 4
        tail = (
            f'for f in "$d/log.0" "$d/log"; do [ -f "$f" ] && tail -c {n} "$f"; done 2>/dev/null '
            f"| tail -c {n}; "
            if tail_chars
            else ""
        )
        probe = (
            f"{PID_REUSE_SH}; d={state}; pid={proc.pid}; "
            'line() { c=; [ -f "$1" ] && c=$(head -c 32 "$1" 2>/dev/null | head -n 1); '
            "printf '%s\\n' \"${c:-$2}\"; }; "
            'if [ -f "$d/exit" ]; then echo exited; '
            'elif [ -d /proc/$pid ] && ! grep -q "^State:.*Z" /proc/$pid/status 2>/dev/null; '
            'then if reused "$pid" "$d/pid"; then echo exited; else echo running; fi; '
            'elif [ ! -d /proc ] && kill -0 "$pid" 2>/dev/null; then echo running; '
            "else echo exited; fi; "
            'line "$d/exit" ""; line "$d/dropped" 0; '
            f"{tail}true"
        )
        result = await self.exec(
            probe,
            timeout=BACKGROUND_EXEC_TIMEOUT_SECONDS,
            output_limit=max(DEFAULT_OUTPUT_LIMIT_BYTES, tail_chars * 4 + 1024),
        )
        state_line, _, rest = result.stdout.partition("\n")
        code_line, _, rest = rest.partition("\n")
        dropped_line, _, output = rest.partition("\n")
        running = state_line.strip() == "running" and proc.exit_code is None
        if not running and proc.exit_code is None:
            code = small_int(code_line)
            proc = replace(proc, exit_code=-1 if code is None else code)
            if session_id in self._background_table():
                self._background_table()[session_id] = proc
        dropped = max(0, small_int(dropped_line) or 0)
        output = output[-tail_chars:] if tail_chars else ""
        if dropped and tail_chars:
            output = dropped_marker(dropped) + output
        return BackgroundStatus(proc, running, output, dropped)

    async def kill_background(self, session_id: str) -> bool:
        """Kill ``session_id``'s process group (TERM, grace, KILL); ``False`` if it had exited.

        Raises:
            KeyError: No such tracked process.

        **Cancellation**: the kill is one ``exec``; if cancelled, ``aclose`` still kills it.
        """
        status = await self.background_status(session_id, tail_chars=0)
        if not status.running:
            return False
        proc = status.process
        pg = int(proc.pid or 0)
        if pg <= 1:  # no pid recorded: `kill -- -0` would signal the kill script's own group
            return False
        grace_steps = int(BACKGROUND_KILL_GRACE_SECONDS * 10)
        # `alive` ignores zombies: killed processes re-parented to an init that reaps slowly
        # (or never, in a container whose PID 1 is `sleep`) still answer `kill -0`.
        script = (
            f"pg={pg}; alive() {{ if [ -d /proc/self ]; then "
            'for s in /proc/[0-9]*/stat; do read -r l < "$s" 2>/dev/null || continue; '
            'r=${l##*) }; set -- $r; [ "$1" != Z ] && [ "$3" = "$pg" ] && return 0; done; '
            'return 1; else kill -0 -- -"$pg" 2>/dev/null; fi; }; '
            'kill -TERM -- -"$pg" 2>/dev/null; i=0; '
            f"while [ $i -lt {grace_steps} ] && alive; do sleep 0.1; i=$((i+1)); done; "
            'kill -KILL -- -"$pg" 2>/dev/null; true'
        )
        await self.exec(script, timeout=BACKGROUND_EXEC_TIMEOUT_SECONDS)
        if session_id in self._background_table():
            self._background_table()[session_id] = replace(proc, exit_code=-1)
        return True

    async def write_background_stdin(self, session_id: str, data: bytes) -> int:
        """Write ``data`` to the process's standard input; return the bytes written.

        Raises:
            KeyError: No such tracked process.
            OSError: Its standard input is closed or it exited.

        **Cancellation**: a partial write may have happened.
        """
        proc = self._background_table()[session_id]
        fifo = shlex.quote(posixpath.join(proc.state_dir, "stdin"))
        keeper = shlex.quote(posixpath.join(proc.state_dir, "keeper"))
        # Only write while the keeper holds the FIFO open; otherwise opening it would block.
        script = (
            f"{PID_REUSE_SH}; k=$(cat {keeper} 2>/dev/null); "
            f'[ -n "$k" ] && kill -0 "$k" 2>/dev/null && ! reused "$k" {keeper} '
            f"|| {{ echo 'stdin is closed' >&2; exit 3; }}; cat >> {fifo}"
        )
        result = await self.exec(script, stdin=data, timeout=BACKGROUND_EXEC_TIMEOUT_SECONDS)
        if result.exit_code != 0:
            raise OSError(
                f"cannot write to {session_id}'s stdin: "
                f"{(result.stderr or result.stdout).strip() or f'exit {result.exit_code}'}"
            )
        return len(data)

    async def close_background_stdin(self, session_id: str) -> None:
        """Close the process's standard input. Idempotent.

        Raises:
            KeyError: No such tracked process.

        **Cancellation**: nothing to clean up.
        """
        proc = self._background_table()[session_id]
        keeper = shlex.quote(posixpath.join(proc.state_dir, "keeper"))
        await self.exec(
            f"{PID_REUSE_SH}; k=$(cat {keeper} 2>/dev/null); "
            f'[ -n "$k" ] && ! reused "$k" {keeper} && kill "$k" 2>/dev/null; true',
            timeout=BACKGROUND_EXEC_TIMEOUT_SECONDS,
        )

    async def kill_all_background(self) -> None:
        """Kill every tracked background process that may still be running.

        **Cancellation**: stops early; ``aclose`` still kills whatever is left.
        """
        for proc in self.background_processes():
            if not proc.exited:
                await self.kill_background(proc.session_id)


#: The ring's segment: the log file rotates to ``log.0`` once it holds this much; one ``dd`` call
#: copies at most this much, so neither file exceeds twice it and both together stay within
#: :data:`BACKGROUND_LOG_LIMIT_BYTES`.
_LOG_SEGMENT_BYTES = BACKGROUND_LOG_LIMIT_BYTES // 4
_LOG_READ_BYTES = 8192
_LOG_READS = _LOG_SEGMENT_BYTES // _LOG_READ_BYTES


def _wrapper_script(state_dir: str, cwd: str) -> bytes:
    d = shlex.quote(state_dir)
    c = shlex.quote(cwd)
    # The keeper holds the FIFO's write end so the command's stdin stays open (no EOF) until
    # `close`; its open() blocks until the command opens the read end, so start it first in
    # the background. `pid` is written last: its appearance tells the launcher that the
    # wrapper is in its own session and the keeper is recorded. Both pids are noted with their
    # start times (PID_REUSE_SH), so a later kill never reaches a process that reused them.
    #
    # Output goes through `ring`, never straight to a file: `dd` copies up to one segment
    # (it reads with read(2), never past what it writes, unlike busybox's `head -c`), the log
    # rotates to log.0 once a segment is full, and `dropped` counts the bytes that fell out.
    # `dd` without `iflag=fullblock` writes each read as it comes (a server's "listening" line
    # shows at once); it reports `N+M records in`, fewer than asked only at end of input.
    # The exit status is published (exit.tmp then `mv`: a reader never sees half a file)
    # only once the ring has drained, so a reader that sees `exit` sees all the output.
    # The ring ignores SIGTERM (inherited by its `dd`): a graceful close TERMs the whole group,
    # and a reader that died first would kill the command with SIGPIPE at its next write (bash
    # reports a TERMed child on stderr) before its own TERM handler could run. The ring ends at
    # EOF, when the command is gone, or with the SIGKILL that follows the grace.
    script = f"""d={d}
{PID_REUSE_SH}
mkfifo "$d/stdin" 2>/dev/null
sleep 2147483647 > "$d/stdin" &
note_start $! "$d/keeper"
echo $! > "$d/keeper"
note_start $$ "$d/pid"
echo $$ > "$d/pid.tmp" && mv "$d/pid.tmp" "$d/pid"
ring() {{
  : > "$d/log"; dropped=0
  while :; do
    r=$(LC_ALL=C dd bs={_LOG_READ_BYTES} count={_LOG_READS} 2>&1 >>"$d/log")
    r=${{r%% records in*}}; r=${{r##*[!0-9+]}}
    size=$(( $(wc -c < "$d/log") ))
    if [ "$size" -ge {_LOG_SEGMENT_BYTES} ]; then
      if [ -f "$d/log.0" ]; then dropped=$(( dropped + $(wc -c < "$d/log.0") )); fi
      echo "$dropped" > "$d/dropped"
      mv -f "$d/log" "$d/log.0"; : > "$d/log"
    fi
    case $r in *+*) [ $(( ${{r%+*}} + ${{r#*+}} )) -ge {_LOG_READS} ] || break ;; *) break ;; esac
  done
}}
{{
  if cd {c}; then
    if command -v bash >/dev/null 2>&1; then sh_=bash; else sh_=sh; fi
    "$sh_" "$d/cmd.sh" < "$d/stdin" 2>&1
    echo $? > "$d/rc"
  else
    printf 'cd: %s: No such file or directory\n' {c}
    exec 3< "$d/stdin"
    echo 1 > "$d/rc"
  fi
  kill "$(cat "$d/keeper")" 2>/dev/null
}} | {{ trap '' TERM; ring; }}
cat "$d/rc" > "$d/exit.tmp" 2>/dev/null || echo 1 > "$d/exit.tmp"
mv "$d/exit.tmp" "$d/exit"
exit 0
"""
    return script.encode()


async def _deliver_whole(data: bytes, sink: ByteSink, what: str, max_bytes: int | None) -> int:
    """Check ``data`` against ``max_bytes``, hand it to ``sink`` in chunks; its size."""
    if max_bytes is not None and len(data) > max_bytes:
        raise TransferLimitError(what, limit=max_bytes, size=len(data))
    view = memoryview(data)
    for i in range(0, len(data), _TRANSFER_CHUNK_BYTES):
        await sink(bytes(view[i : i + _TRANSFER_CHUNK_BYTES]))
    return len(data)


async def _enter_spec_workdir(sandbox: Sandbox, workdir: str) -> None:
    """Make and enter a spec's ``workdir`` by a command (sandbox paths aren't the host's).

    Raises:
        SandboxError: The folder cannot be made.
    """
    inside = posixpath.join(sandbox.workdir, workdir.lstrip("/"))
    made = await sandbox.exec(f"mkdir -p -- {shlex.quote(inside)}", timeout=30)
    if made.exit_code != 0:
        raise SandboxError(
            f"cannot create the spec's workdir {workdir!r} in the sandbox: "
            f"{made.stderr.strip()[:200]}",
            task_id=sandbox.task_id,
        )
    sandbox.workdir = inside


#: ``async (task_id) -> Sandbox``: how a manager creates sandboxes (a backend's factory).
SandboxFactory = Callable[[str], Awaitable[Sandbox]]


class SandboxProvider(Protocol):
    """Gives tools the sandbox of a rollout (implemented by ``SandboxManager``)."""

    async def get(self, task_id: str) -> Sandbox:
        """The sandbox for ``task_id``, created on first use."""
        ...

    async def release(self, task_id: str, *, interrupted: bool = False) -> None:
        """Close ``task_id``'s sandbox; idempotent, shielded and bounded by the provider."""
        ...
