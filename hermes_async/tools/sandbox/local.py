"""The local backend: each sandbox is a private directory on this host and its process groups.

Layout of one sandbox (under ``root_dir``, default the system temp dir)::

    hermes-sbx-<task>-<hex>/
        work/    the working directory (``workdir``): commands start here
        home/    ``$HOME``, so ``~/greeting.txt`` lands inside the sandbox
        tmp/     ``$TMPDIR``
        .state/  background-process bookkeeping (see ``base.py``)

What it isolates and what it does not: the environment is an allowlist (host secrets such as
``OPENAI_API_KEY`` are never inherited), and every process it starts is tracked and killed on
close. It is *not* a filesystem jail: an absolute path like ``/etc/passwd`` is the host's. Use the
Docker or Modal backend when the model must not see the host.

Processes: every ``exec`` runs ``bash -c`` through :func:`anyio.open_process` in a new session
(``start_new_session=True``), so the shell and everything it forks share one process group whose
id is the shell's pid. On timeout the group gets SIGTERM, a grace period, then SIGKILL (exit 124);
when the shell exits normally, whatever it left running in its group (``cmd &``) is killed too, so
a foreground command can never leak a process. Long-running work belongs in
``terminal(background=true)``, which starts a detached session that lives until ``process kill``
or close. ``aclose`` kills every process carrying this sandbox's marker variable
(``HERMES_ASYNC_SANDBOX``) or belonging to one of its sessions, found in ``/proc``, so
``setsid``/``nohup`` escapes die too (SIGTERM, grace, SIGKILL; SIGKILL at once when the release is
``interrupted``); then it removes the directory. The ``/proc`` reading is shared: every sandbox of
one :func:`local_factory` (so of one ``SandboxManager``) closing at the same moment is served by
the same sweep, which yields to the event loop as it goes (see
:mod:`hermes_async.tools.sandbox.processes`), and their directories are removed together by one
``rm`` (:class:`DirectoryRemover`).

Output: stdout and stderr are drained concurrently (no full-pipe deadlock) into a bounded
head+tail buffer, so ``yes | head -c 500M`` costs at most ``output_limit`` bytes per stream.

No threads: file transfers are ``cat``/``tar`` subprocesses, never blocking file I/O on the
event loop.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process

from hermes_async._cleanup import cleanup_scope
from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox._batch import Batcher
from hermes_async.tools.sandbox.archive import check_tar_members
from hermes_async.tools.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT_BYTES,
    TIMEOUT_EXIT_CODE,
    BackgroundProcess,
    ExecRequest,
    ExecResult,
    Sandbox,
    resolve_path,
)
from hermes_async.tools.sandbox.output import OutputCapture
from hermes_async.tools.sandbox.processes import (
    SANDBOX_MARKER_ENV,
    ProcessSweeper,
    find_sandbox_processes,
    group_alive,
    signal_group,
    terminate_members,
)
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "DEFAULT_ENV_ALLOWLIST",
    "DEFAULT_EXEC_TIMEOUT_SECONDS",
    "SANDBOX_MARKER_ENV",
    "TERMINATE_GRACE_SECONDS",
    "DirectoryRemover",
    "LocalSandbox",
    "RawResult",
    "find_sandbox_processes",
    "local_factory",
    "run_bounded",
)

logger = logging.getLogger(__name__)

#: Host variables a sandbox inherits (values copied when set). Nothing else crosses over.
DEFAULT_ENV_ALLOWLIST: tuple[str, ...] = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
)

#: Commands without an explicit timeout get this one (the reference's ``TERMINAL_TIMEOUT``).
DEFAULT_EXEC_TIMEOUT_SECONDS = 180.0

#: SIGTERM -> SIGKILL grace for a timed-out or cancelled command. Short: a sandbox command that
#: ignores SIGTERM for 2 s is not going to clean up usefully, and cancellation must stay prompt.
TERMINATE_GRACE_SECONDS = 2.0

#: After SIGKILL, how long to wait for the kernel to reap (a bound, never expected to matter).
KILL_WAIT_SECONDS = 5.0

#: Deadline of starting one local process (fork + exec; milliseconds in practice), shielded.
PROCESS_START_TIMEOUT_SECONDS = 30.0

#: After the shell exited and its group was killed, how long to keep reading pipes that a
#: process outside the group (e.g. ``setsid x &`` without redirection) may still hold open.
PIPE_DRAIN_GRACE_SECONDS = 2.0

#: Deadline for file transfers (``cat``/``tar`` subprocesses).
TRANSFER_TIMEOUT_SECONDS = 300.0

#: Most directories one ``rm`` removes (far below the kernel's argument-size limit).
_PATHS_PER_RM = 512

#: Deadline for closing a command's stdin pipe after the input was written.
_STDIN_CLOSE_SECONDS = 1.0

_READ_CHUNK = 65536
_SAFE_TASK_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class RawResult:
    """Bytes-level outcome of :func:`run_bounded`.

    Attributes:
        exit_code: Exit status (``128 + n`` when killed by signal ``n``; 124 on timeout).
        stdout: Captured stdout (head + tail if truncated, with a marker in between).
        stderr: Captured stderr, likewise.
        timed_out: The timeout fired and the process group was killed.
        truncated: Some output was dropped.
        pgid: The process group (= session) id the command ran in.
    """

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    pgid: int


async def _drain(stream: ByteReceiveStream | None, sink: OutputCapture) -> None:
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
) -> RawResult:
    """Run ``argv`` in a new session, drain its output into bounded buffers, enforce ``timeout``.

    The building block of :class:`LocalSandbox` (and of host-side ``tar`` in ``ToolContext``).

    Args:
        argv: Program and arguments (no shell unless you pass one).
        cwd: Working directory.
        env: The complete environment (``None``: inherit; sandboxes always pass one).
        timeout: Seconds before the process group is terminated (exit 124, ``timed_out``).
        stdin: Bytes fed to standard input, then closed (``None``: ``/dev/null``).
        output_limit: Bytes kept per stream (head + tail); ``None`` keeps everything.
        terminate_grace: SIGTERM -> SIGKILL grace.
        on_start: Called with the process group id right after the start.
        on_exit: Called with the process group id once the group was killed and reaped.

    **Cancellation**: the whole process group is terminated (TERM, grace, KILL) in a shielded
    scope bounded by ``terminate_grace + KILL_WAIT_SECONDS + 1`` before the cancellation
    propagates.
    """
    # Shielded (and bounded): asyncio leaks the half-built subprocess transport (its pipes
    # and the child) when a cancellation lands inside subprocess creation. Starting a local
    # process takes milliseconds; the caller's cancellation is delivered right after, with the
    # group's cleanup below.
    with anyio.fail_after(PROCESS_START_TIMEOUT_SECONDS, shield=True):
        proc = await anyio.open_process(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    pgid = proc.pid
    if on_start is not None:
        on_start(pgid)
    out, err = OutputCapture(output_limit), OutputCapture(output_limit)
    timed_out = False
    ending = "cancelled or failed"  # why the group is cleaned up, for an overrun log line
    try:
        async with anyio.create_task_group() as tg:
            drained = anyio.Event()
            remaining = [2]

            async def drain(stream: ByteReceiveStream | None, sink: OutputCapture) -> None:
                await _drain(stream, sink)
                remaining[0] -= 1
                if remaining[0] == 0:
                    drained.set()

            tg.start_soon(drain, proc.stdout, out)
            tg.start_soon(drain, proc.stderr, err)
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
            with anyio.move_on_after(PIPE_DRAIN_GRACE_SECONDS):
                await drained.wait()
            tg.cancel_scope.cancel("the command ended and its output is drained")
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
    return RawResult(
        code, out.value(), err.value(), timed_out, out.truncated or err.truncated, pgid
    )


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class LocalSandbox(Sandbox):
    """A sandbox on this host: a private directory, an allowlisted environment, process groups.

    Create it with :meth:`create` (or through :func:`local_factory` and a ``SandboxManager``).

    Args:
        task_id: The rollout it belongs to.
        root: The sandbox's own directory (already created).
        env: The complete environment commands see.
        default_timeout: Seconds for ``exec`` calls that give no timeout.
        terminate_grace: SIGTERM -> SIGKILL grace on timeout and cancellation.
        shell: The shell that runs commands.
        sweeper: The ``/proc`` sweeper its close shares with other sandboxes (default: a
            private one).
        remover: The directory remover its close shares (default: a private one).
    """

    def __init__(
        self,
        task_id: str,
        root: str,
        env: Mapping[str, str],
        *,
        default_timeout: float = DEFAULT_EXEC_TIMEOUT_SECONDS,
        terminate_grace: float = TERMINATE_GRACE_SECONDS,
        shell: str = "/bin/bash",
        sweeper: ProcessSweeper | None = None,
        remover: DirectoryRemover | None = None,
    ) -> None:
        self.task_id = task_id
        self.root = root
        self.workdir = os.path.join(root, "work")
        self.home = os.path.join(root, "home")
        self.background_state_dir = os.path.join(root, ".state", "bg")
        self.sandbox_id = env.get(SANDBOX_MARKER_ENV, "")
        self.env = dict(env)
        self.default_timeout = default_timeout
        self.terminate_grace = terminate_grace
        self.shell = shell
        self.sweeper = sweeper or ProcessSweeper()
        self.remover = remover or DirectoryRemover()
        self._groups: set[int] = set()  # sessions of running execs and of background processes
        self._closed = False
        self._inflight = 0  # _run calls between the open check and their cleanup
        self._drained: anyio.Event | None = None  # set when _inflight drops to 0 while closing

    @classmethod
    async def create(
        cls,
        task_id: str,
        *,
        root_dir: str | None = None,
        env_allowlist: Iterable[str] = DEFAULT_ENV_ALLOWLIST,
        extra_env: Mapping[str, str] | None = None,
        default_timeout: float = DEFAULT_EXEC_TIMEOUT_SECONDS,
        terminate_grace: float = TERMINATE_GRACE_SECONDS,
        sweeper: ProcessSweeper | None = None,
        remover: DirectoryRemover | None = None,
    ) -> LocalSandbox:
        """Create a sandbox directory for ``task_id`` and return the sandbox.

        Args:
            task_id: The rollout it belongs to (used in the directory name, sanitized).
            root_dir: Parent directory of sandbox directories (default: the system temp dir).
            env_allowlist: Host variables copied into the sandbox when set.
            extra_env: Variables set explicitly (on top of the allowlist; never host secrets
                unless you put them here).
            default_timeout: Seconds for commands that give no timeout.
            terminate_grace: SIGTERM -> SIGKILL grace.
            sweeper: The ``/proc`` sweeper to share with other sandboxes (default: private).
            remover: The directory remover to share (default: private).

        Raises:
            SandboxError: The directory could not be created.

        **Cancellation**: nothing is left behind (creating the directories does not wait).
        """
        sandbox_id = f"sbx-{secrets.token_hex(8)}"
        safe_task = _SAFE_TASK_CHARS.sub("_", task_id)[:40] or "task"
        parent = root_dir or tempfile.gettempdir()
        try:
            root = tempfile.mkdtemp(prefix=f"hermes-sbx-{safe_task}-", dir=parent)
            for sub in ("work", "home", "tmp", os.path.join(".state", "bg")):
                os.makedirs(os.path.join(root, sub), exist_ok=True)
        except OSError as exc:
            raise SandboxError(
                f"cannot create a local sandbox directory under {parent!r}: {exc}; "
                "check that root_dir exists and is writable",
                task_id=task_id,
            ) from exc
        env: dict[str, str] = {}
        for name in env_allowlist:
            value = os.environ.get(name)
            if value is not None:
                env[name] = value
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.setdefault("LANG", "C.UTF-8")
        env.setdefault("TERM", "dumb")
        env.update(
            {
                "HOME": os.path.join(root, "home"),
                "TMPDIR": os.path.join(root, "tmp"),
                "PAGER": "cat",
                "GIT_PAGER": "cat",
            }
        )
        if extra_env:
            env.update(extra_env)
        env[SANDBOX_MARKER_ENV] = sandbox_id
        return cls(
            task_id,
            root,
            env,
            default_timeout=default_timeout,
            terminate_grace=terminate_grace,
            sweeper=sweeper,
            remover=remover,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._groups)} process groups"
        return f"<LocalSandbox task_id={self.task_id!r} root={self.root!r} [{state}]>"

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` ran."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(
                f"sandbox {self.sandbox_id} is closed; get a new one from the SandboxManager",
                task_id=self.task_id,
            )

    async def _run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        output_limit: int | None = DEFAULT_OUTPUT_LIMIT_BYTES,
    ) -> RawResult:
        self._check_open()
        full_env = {**self.env, **env, SANDBOX_MARKER_ENV: self.sandbox_id} if env else self.env
        self._inflight += 1
        try:
            return await run_bounded(
                argv,
                cwd=cwd or self.workdir,
                env=full_env,
                timeout=self.default_timeout if timeout is None else timeout,
                stdin=stdin,
                output_limit=output_limit,
                terminate_grace=self.terminate_grace,
                on_start=self._on_start,
                on_exit=self._groups.discard,
            )
        finally:
            self._inflight -= 1
            if self._inflight == 0 and self._drained is not None:
                self._drained.set()

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        """Run the command with ``bash -c`` in a new session (see :meth:`Sandbox.exec`).

        A ``cwd`` that does not exist gives exit 1 and a ``cd`` message, like a shell.

        **Cancellation**: the command's process group is terminated (TERM, grace, KILL) in a
        shielded, bounded scope before the cancellation propagates.
        """
        self._check_open()
        start = anyio.current_time()
        cwd = request.cwd
        try:
            raw = await self._run(
                [self.shell, "-c", request.command],
                cwd=self.workdir if cwd is None else self._resolve(cwd),
                env=request.env,
                timeout=request.timeout,
                stdin=request.stdin,
                output_limit=request.output_limit,
            )
        except (FileNotFoundError, NotADirectoryError):
            if cwd is None:
                raise
            # The start failed in chdir (subprocess reports it to the parent): act like `cd`.
            return ExecResult("", f"bash: cd: {cwd}: No such file or directory\n", 1)
        return ExecResult(
            stdout=_decode(raw.stdout),
            stderr=_decode(raw.stderr),
            exit_code=raw.exit_code,
            timed_out=raw.timed_out,
            truncated=raw.truncated,
            duration_seconds=anyio.current_time() - start,
        )

    async def _sh(
        self, script: str, *args: str, stdin: bytes | None = None, limit: int | None = None
    ) -> RawResult:
        return await self._run(
            ["/bin/sh", "-c", script, "sh", *args],
            timeout=TRANSFER_TIMEOUT_SECONDS,
            stdin=stdin,
            output_limit=limit,
        )

    def _resolve(self, path: str) -> str:
        return resolve_path(self.workdir, path, self.home)

    async def read_bytes(self, path: str) -> bytes:
        """Return the contents of ``path`` (via ``cat`` in the sandbox's environment).

        Raises:
            FileNotFoundError: ``path`` does not exist or is not a regular file.
            OSError: It exists but cannot be read.

        **Cancellation**: the ``cat`` process is killed.
        """
        target = self._resolve(path)
        raw = await self._sh('[ -f "$1" ] || exit 66; exec cat -- "$1"', target)
        if raw.exit_code == 66:
            raise FileNotFoundError(f"No such file: {path!r}")
        if raw.exit_code != 0:
            raise OSError(f"cannot read {path!r}: {_decode(raw.stderr).strip()}")
        return raw.stdout

    async def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path``, creating parent directories (see :meth:`Sandbox.write_bytes`).

        **Cancellation**: the file may be partially written.
        """
        target = self._resolve(path)
        raw = await self._sh(
            'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', target, stdin=data, limit=65536
        )
        if raw.exit_code != 0:
            raise OSError(f"cannot write {path!r}: {_decode(raw.stderr).strip()}")

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        """Validate then extract a tar archive into ``dest_dir`` (see :meth:`Sandbox.put_archive`).

        **Cancellation**: extraction may be partial.
        """
        check_tar_members(tar_data)
        target = self._resolve(dest_dir)
        raw = await self._sh(
            'mkdir -p -- "$1" && exec tar -x --no-same-owner --no-same-permissions -f - -C "$1"',
            target,
            stdin=tar_data,
            limit=65536,
        )
        if raw.exit_code != 0:
            raise OSError(f"cannot extract archive into {dest_dir!r}: {_decode(raw.stderr)}")

    async def get_archive(self, path: str) -> bytes:
        """Return a tar archive of ``path`` (see :meth:`Sandbox.get_archive`).

        **Cancellation**: the ``tar`` process is killed.
        """
        target = self._resolve(path)
        raw = await self._sh(
            '[ -e "$1" ] || exit 66; if [ -d "$1" ]; then exec tar -c -f - -C "$1" .; '
            'else exec tar -c -f - -C "$(dirname -- "$1")" -- "$(basename -- "$1")"; fi',
            target,
        )
        if raw.exit_code == 66:
            raise FileNotFoundError(f"No such file or directory: {path!r}")
        if raw.exit_code != 0:
            raise OSError(f"cannot archive {path!r}: {_decode(raw.stderr).strip()}")
        return raw.stdout

    def _background_started(self, process: BackgroundProcess) -> None:
        if process.pid is not None:
            self._groups.add(process.pid)

    def live_processes(self) -> list[int]:
        """Pids of live processes that belong to this sandbox (one synchronous ``/proc`` read).

        For tests and diagnostics; :meth:`aclose` uses the shared, yielding sweeper instead.
        """
        return find_sandbox_processes(self.sandbox_id, self._groups)

    def _on_start(self, pgid: int) -> None:
        self._groups.add(pgid)
        if self._closed:
            # Started while aclose() was running (spawning is not atomic with our check).
            signal_group(pgid, signal.SIGKILL)

    async def _kill_everything(self, *, graceful: bool) -> list[int]:
        return await terminate_members(
            self.sweeper,
            self.sandbox_id,
            self._groups,
            grace=self.terminate_grace,
            kill_wait=KILL_WAIT_SECONDS,
            graceful=graceful,
        )

    async def aclose(self, interrupted: bool = False) -> None:
        """Kill every process the sandbox started, then remove its directory. Idempotent.

        Graceful: SIGTERM to every process of the sandbox (found through the shared ``/proc``
        sweeper), up to ``terminate_grace`` for them to go, SIGKILL to the rest. Interrupted
        (the rollout was cancelled or timed out): SIGKILL at once. Then ``rm -rf`` of the root.

        **Cancellation**: every wait here is bounded; the owner of the release runs it under a
        shielded cleanup scope (``SandboxManager.release`` does) so it is never skipped.
        """
        if self._closed:
            return
        self._closed = True
        graceful = not interrupted
        survivors = await self._kill_everything(graceful=graceful)
        if self._inflight:
            # A command may have been spawning while we swept (its shell not yet visible, or
            # already forking): wait for those calls to finish (they are being killed), then
            # sweep once more, so nothing started "during" close survives it.
            self._drained = anyio.Event()
            with anyio.move_on_after(self.terminate_grace + KILL_WAIT_SECONDS + 2):
                await self._drained.wait()
            survivors = await self._kill_everything(graceful=False)
        if survivors:
            logger.warning("sandbox %s: processes %s survived SIGKILL", self.sandbox_id, survivors)
        await self.remover.remove(self.root)


class DirectoryRemover:
    """Remove sandbox directories, one ``rm`` for all the removals that arrive together.

    Starting a subprocess costs the event loop ~3 ms (fork + exec on its thread, plus
    asyncio's child watcher); 500 sandboxes closing at once would start 500 ``rm``. Removals
    requested while one ``rm`` runs are done by the next one, together (a
    :class:`~hermes_async.tools.sandbox._batch.Batcher`). ``chmod`` first: a model that did
    ``chmod 000 dir`` must not make cleanup fail. Failures are logged, never raised.
    """

    def __init__(self) -> None:
        self._batches: Batcher[str] = Batcher(self._remove_all)

    @property
    def runs(self) -> int:
        """How many ``rm`` batches ran."""
        return self._batches.runs

    async def remove(self, path: str) -> None:
        """Remove ``path`` and everything under it (in a batch that starts after this call).

        **Cancellation**: bounded by ``TRANSFER_TIMEOUT_SECONDS``; a cancelled caller that was
        running the batch kills its ``rm`` and the others start a new one.
        """
        await self._batches.submit(path)

    async def _remove_all(self, paths: list[str]) -> None:
        for i in range(0, len(paths), _PATHS_PER_RM):
            chunk = paths[i : i + _PATHS_PER_RM]
            script = 'chmod -R u+rwx -- "$@" 2>/dev/null; rm -rf -- "$@"'
            try:
                raw = await run_bounded(
                    ["/bin/sh", "-c", script, "sh", *chunk],
                    timeout=TRANSFER_TIMEOUT_SECONDS,
                    env={"PATH": "/usr/bin:/bin"},
                    output_limit=4096,
                )
            except OSError as exc:
                logger.warning("could not remove sandbox directories %s: %s", chunk, exc)
                continue
            if raw.exit_code != 0:
                logger.warning(
                    "could not remove sandbox directories %s: %s", chunk, _decode(raw.stderr)
                )


def local_factory(
    root_dir: str | None = None,
    *,
    env_allowlist: Iterable[str] = DEFAULT_ENV_ALLOWLIST,
    extra_env: Mapping[str, str] | None = None,
    default_timeout: float = DEFAULT_EXEC_TIMEOUT_SECONDS,
    terminate_grace: float = TERMINATE_GRACE_SECONDS,
) -> Callable[..., Awaitable[Sandbox]]:
    """A ``SandboxManager`` factory that creates :class:`LocalSandbox` es.

    It takes a :class:`~hermes_async.tools.sandbox.spec.SandboxSpec` (``spec=``): its ``env``
    is added, its ``workdir`` becomes a folder of that path inside the sandbox's work dir, its
    ``exec_timeout`` the default command timeout; the rest needs a container backend.

    Its sandboxes share one :class:`~hermes_async.tools.sandbox.processes.ProcessSweeper`, so
    those closing at the same moment are served by one ``/proc`` sweep, and one
    :class:`DirectoryRemover` (one ``rm`` for the directories removed together).

    Args:
        root_dir: Parent directory of the sandbox directories (default: system temp dir).
        env_allowlist: Host variables copied into each sandbox.
        extra_env: Variables set explicitly in each sandbox.
        default_timeout: Seconds for commands that give no timeout.
        terminate_grace: SIGTERM -> SIGKILL grace.
    """
    sweeper = ProcessSweeper()
    remover = DirectoryRemover()

    async def factory(task_id: str, spec: SandboxSpec | None = None) -> Sandbox:
        # A spec's env and workdir apply here (a folder of that path inside the sandbox's
        # work dir); images and resource limits need a container backend.
        env = dict(extra_env or {})
        if spec is not None:
            env.update(spec.env)
        sandbox = await LocalSandbox.create(
            task_id,
            root_dir=root_dir,
            env_allowlist=env_allowlist,
            extra_env=env,
            default_timeout=(
                spec.exec_timeout if spec is not None and spec.exec_timeout else default_timeout
            ),
            terminate_grace=terminate_grace,
            sweeper=sweeper,
            remover=remover,
        )
        if spec is not None and spec.workdir is not None:
            workdir = os.path.join(sandbox.workdir, spec.workdir.lstrip("/"))
            os.makedirs(workdir, exist_ok=True)
            sandbox.workdir = workdir
        return sandbox

    return factory
