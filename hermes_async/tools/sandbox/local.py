"""The local backend: each sandbox is a private directory on this host and the processes it runs.

``isolation="namespaces"`` (the default) gives each sandbox its own Linux world (bubblewrap);
``"process"`` is a directory and process groups, only on request. Nothing falls back to
``"process"`` on its own. No command outlives its sandbox. Design:
docs/decisions/031-local-sandboxes.md.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Literal

import anyio

from hermes_async._checks import NON_NEGATIVE_FINITE, POSITIVE_FINITE, Requirement, check_value
from hermes_async._cleanup import cleanup_scope
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.tools.sandbox.archive import check_tar_members
from hermes_async.tools.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT_BYTES,
    MAX_READ_BYTES,
    BackgroundProcess,
    ByteSink,
    ExecRequest,
    ExecResult,
    Sandbox,
    _enter_spec_workdir,
    _is_variable_name,
    resolve_path,
    small_int,
)
from hermes_async.tools.sandbox.errors import (
    NotARegularFileError,
    SandboxUnavailableError,
    TransferLimitError,
)
from hermes_async.tools.sandbox.host import (
    KILL_WAIT_SECONDS,
    TERMINATE_GRACE_SECONDS,
    TRANSFER_TIMEOUT_SECONDS,
    DirectoryRemover,
    RawResult,
    run_bounded,
)
from hermes_async.tools.sandbox.namespaces import (
    ENTERED_MARK,
    INSIDE_ROOT,
    Namespace,
    NamespaceOptions,
    in_cgroups,
    namespace_support,
    probe_namespaces,
    processes_in_pid_namespace,
)
from hermes_async.tools.sandbox.processes import (
    SANDBOX_MARKER_ENV,
    ProcessSweeper,
    find_sandbox_processes,
    signal_group,
    terminate_members,
)
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "DEFAULT_ENV_ALLOWLIST",
    "DEFAULT_EXEC_TIMEOUT_SECONDS",
    "KILL_WAIT_SECONDS",
    "MARKER_FILE",
    "MAX_READ_BYTES",
    "SANDBOX_DIR_PREFIX",
    "SANDBOX_MARKER_ENV",
    "TERMINATE_GRACE_SECONDS",
    "DirectoryRemover",
    "Isolation",
    "LocalSandbox",
    "RawResult",
    "find_sandbox_processes",
    "local_factory",
    "local_preflight",
    "resolve_isolation",
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

#: ``"namespaces"``, ``"process"`` (no isolation), or ``"auto"`` (``$HERMES_SANDBOX_ISOLATION``
#: in :func:`local_factory`, else namespaces).
Isolation = Literal["auto", "namespaces", "process"]
#: The options of a sandbox given none (frozen: one object serves every factory).
_DEFAULT_NAMESPACE = NamespaceOptions()

#: Commands without an explicit timeout get this one (the reference's ``TERMINAL_TIMEOUT``).
DEFAULT_EXEC_TIMEOUT_SECONDS = 180.0

#: Process mode: the file in a sandbox's directory that holds its marker value.
MARKER_FILE = ".state/marker"

#: The prefix of every local sandbox's directory name.
SANDBOX_DIR_PREFIX = "hermes-sbx-"

#: Bound on removing a sandbox's directory after its world failed to start.
FAILED_START_REMOVE_SECONDS = 30.0
#: Operator choice for ``isolation="auto"``: ``namespaces`` or ``process`` for every local
#: factory of the process (a CLI run cannot pass ``sandbox_options`` as a dict).
ISOLATION_ENV = "HERMES_SANDBOX_ISOLATION"

#: PATH inside a namespaced sandbox (the host's PATH names directories it cannot see).
_NAMESPACE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Exit codes of the transfer scripts: missing / too large / not a regular file.
_MISSING, _TOO_LARGE, _NOT_REGULAR = 66, 67, 68

_SAFE_TASK_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def _isolation_unavailable(reason: str) -> ConfigError:
    """The error for a sandbox that cannot be isolated here: what is missing, fix, opt-out."""
    return ConfigError(
        f"local sandboxes cannot be isolated on this machine: {reason}. Without isolation a "
        "model's commands see this host's files (writable), its network and its processes' "
        "environments (this process's secrets). Fix: scripts/sandbox/install.sh (as root; it "
        "installs bubblewrap and util-linux and checks them). Or opt out explicitly: "
        f"isolation='process' (env config: sandbox_options={{'isolation': 'process'}}; any "
        f"run, CLI included: {ISOLATION_ENV}=process)"
    )


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _not_found(path: str, code: int) -> FileNotFoundError:
    if code == _NOT_REGULAR:
        return NotARegularFileError(f"Not a regular file: {path!r}")
    return FileNotFoundError(f"No such file: {path!r}")


def _check_read(raw: RawResult, path: str, limit: int | None) -> None:
    """Raise what a :func:`_size_checked` ``cat`` of ``path`` reported."""
    if raw.exit_code in (_MISSING, _NOT_REGULAR):
        raise _not_found(path, raw.exit_code)
    if limit is not None and (raw.exit_code == _TOO_LARGE or raw.truncated):
        size = _decode(raw.stderr).strip()
        raise TransferLimitError(f"file {path!r}", limit=limit, size=small_int(size))
    if raw.exit_code != 0:
        raise OSError(f"cannot read {path!r}: {_decode(raw.stderr).strip()}")


def _size_checked(script: str) -> str:
    """A transfer script's prologue: exit 66 missing, 68 not a file, 67 over ``$2`` bytes."""
    return (
        f'[ -e "$1" ] || exit {_MISSING}; [ -f "$1" ] || exit {_NOT_REGULAR}; '
        's=$(stat -c %s -- "$1" 2>/dev/null || wc -c < "$1"); s=$((s)); '
        f'if [ "$2" -ge 0 ] && [ "$s" -gt "$2" ]; then echo "$s" >&2; exit {_TOO_LARGE}; fi; '
        + script
    )


async def resolve_isolation(isolation: Isolation) -> Literal["namespaces", "process"]:
    """What ``isolation`` means on this machine (probes bubblewrap once per process).

    Raises:
        ConfigError: Namespaces were asked for and cannot be made here.

    **Cancellation**: the probe is abandoned; the next call probes again.
    """
    if isolation == "process":
        return "process"
    reason = await probe_namespaces()
    if reason is not None:
        raise _isolation_unavailable(reason)
    return "namespaces"


def _chosen_isolation(isolation: object) -> Isolation:
    """``isolation`` checked, with ``"auto"`` replaced by ``$HERMES_SANDBOX_ISOLATION`` if set."""
    if isolation == "auto":
        isolation = os.environ.get(ISOLATION_ENV) or "auto"
    if isolation not in ("auto", "namespaces", "process"):
        raise ConfigError(f"isolation must be 'auto', 'namespaces' or 'process', got {isolation!r}")
    return isolation


async def local_preflight(**options: object) -> None:
    """Check before the first rollout that ``local_factory(**options)`` can create sandboxes.

    Raises:
        ConfigError: An invalid option, or namespaces that cannot be made here.

    **Cancellation**: the bubblewrap probe is killed.
    """
    local_factory(**options)  # type: ignore[arg-type]
    await resolve_isolation(_chosen_isolation(options.get("isolation", "auto")))


class LocalSandbox(Sandbox):
    """A sandbox on this host: namespaced or a directory and process groups.

    Create it with :meth:`create` (or through :func:`local_factory` and a ``SandboxManager``).
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
        namespace: Namespace | None = None,
    ) -> None:
        self.task_id = task_id
        self.root = root
        self.namespace = namespace
        inside = INSIDE_ROOT if namespace is not None else root
        self.workdir = os.path.join(inside, "work")
        self.home = os.path.join(inside, "home")
        self.background_state_dir = os.path.join(inside, ".state", "bg")
        self.sandbox_id = env.get(SANDBOX_MARKER_ENV, "") or os.path.basename(root)
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
        isolation: Isolation = "auto",
        namespace_options: NamespaceOptions | None = None,
    ) -> LocalSandbox:
        """Create a sandbox for ``task_id`` and return it.

        Args:
            env_allowlist: Host variables copied into the sandbox when set.
            extra_env: Variables set explicitly (never host secrets unless you put them here).
            sweeper: The ``/proc`` sweeper to share with other sandboxes (default: private).
            remover: The directory remover to share (default: private).

        Raises:
            ConfigError: Namespaces were asked for and cannot be made on this machine.
            SandboxError: The directory could not be created, or the world did not start.

        **Cancellation**: nothing is left behind (shielded, bounded cleanup).
        """
        mode = await resolve_isolation(isolation)
        sandbox_id = f"sbx-{secrets.token_hex(8)}"
        safe_task = _SAFE_TASK_CHARS.sub("_", task_id)[:40] or "task"
        parent = root_dir or tempfile.gettempdir()
        subdirs = () if mode == "namespaces" else ("work", "home", "tmp", ".state/bg")
        try:
            root = tempfile.mkdtemp(prefix=f"{SANDBOX_DIR_PREFIX}{safe_task}-", dir=parent)
            for sub in subdirs:
                os.makedirs(os.path.join(root, sub), exist_ok=True)
        except OSError as exc:
            raise SandboxError(
                f"cannot create a local sandbox directory under {parent!r}: {exc}; "
                "check that root_dir exists and is writable",
                task_id=task_id,
            ) from exc
        remover = remover or DirectoryRemover()
        options = namespace_options or _DEFAULT_NAMESPACE
        env: dict[str, str] = {}
        for name in env_allowlist:
            value = os.environ.get(name)
            if value is not None:
                env[name] = value
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.setdefault("LANG", "C.UTF-8")
        env.setdefault("TERM", "dumb")
        inside = INSIDE_ROOT if mode == "namespaces" else root
        env.update(
            {
                "HOME": os.path.join(inside, "home"),
                "TMPDIR": "/tmp" if mode == "namespaces" else os.path.join(root, "tmp"),
                "PAGER": "cat",
                "GIT_PAGER": "cat",
            }
        )
        if mode == "namespaces":
            user = options.user_name
            env.update({"PATH": _NAMESPACE_PATH, "USER": user, "LOGNAME": user})
        if extra_env:
            env.update(extra_env)
        namespace = None
        if mode == "namespaces":
            try:
                namespace = await Namespace.start(root, options, task_id=task_id)
            except BaseException:
                with cleanup_scope(
                    f"remove the directory of sandbox {task_id!r} after a failed start",
                    FAILED_START_REMOVE_SECONDS,
                    reason="the namespaced world did not start",
                    log=logger,
                ):
                    await remover.remove(root)
                raise
        else:
            env[SANDBOX_MARKER_ENV] = sandbox_id
            _write_marker(root, sandbox_id)
        return cls(
            task_id,
            root,
            env,
            default_timeout=default_timeout,
            terminate_grace=terminate_grace,
            sweeper=sweeper,
            remover=remover,
            namespace=namespace,
        )

    def __repr__(self) -> str:
        mode = self.isolation
        state = "closed" if self._closed else f"{len(self._groups)} process groups"
        return f"<LocalSandbox task_id={self.task_id!r} {mode} root={self.root!r} [{state}]>"

    @property
    def isolation(self) -> Literal["namespaces", "process"]:
        return "namespaces" if self.namespace is not None else "process"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def gone(self) -> SandboxUnavailableError | None:
        """Why the sandbox is gone (namespaces mode: its world died), else ``None``."""
        ns = self.namespace
        if ns is None or self._closed or ns.alive():
            return None
        return ns.unavailable(self.task_id)

    async def alive(self) -> bool:
        """Open and, in namespaces mode, its world's PID 1 alive; starts no command."""
        if self._closed:
            return False
        return self.namespace is None or self.namespace.alive()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(
                f"sandbox {self.sandbox_id} is closed; get a new one from the SandboxManager",
                task_id=self.task_id,
            )
        if self.namespace is not None and not self.namespace.alive():
            raise self.namespace.unavailable(self.task_id)

    async def _run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        output_limit: int | None = DEFAULT_OUTPUT_LIMIT_BYTES,
        stdout_sink: ByteSink | None = None,
    ) -> RawResult:
        self._check_open()
        ns = self.namespace
        if ns is None:
            full_env = {**self.env, **env, SANDBOX_MARKER_ENV: self.sandbox_id} if env else self.env
            host_cwd = cwd or self.workdir
        else:
            full_env = {**self.env, **env} if env else self.env
            argv = ns.command(argv, cwd or self.workdir)
            host_cwd = "/"
        self._inflight += 1
        try:
            raw = await run_bounded(
                argv,
                cwd=host_cwd,
                env=full_env,
                timeout=self.default_timeout if timeout is None else timeout,
                stdin=stdin,
                output_limit=output_limit,
                terminate_grace=self.terminate_grace,
                on_start=self._on_start,
                on_exit=self._groups.discard,
                stdout_sink=stdout_sink,
                stderr_prefix=ENTERED_MARK if ns is not None else b"",
            )
        finally:
            self._inflight -= 1
            if self._inflight == 0 and self._drained is not None:
                self._drained.set()
        if ns is not None and not self._closed:
            if not ns.alive():
                raise ns.unavailable(self.task_id)
            if not raw.stderr_prefixed and ns.wrong_world(raw.exit_code, raw.stderr):
                raise SandboxError(
                    f"could not enter the namespaced sandbox: {_decode(raw.stderr).strip()[:500]}",
                    task_id=self.task_id,
                )
        return raw

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        """Run the command with ``bash -c`` in a new session (see :meth:`Sandbox.exec`).

        Raises:
            SandboxUnavailableError: The sandbox's world is gone (namespaces mode).

        **Cancellation**: the command's process group is terminated (TERM, grace, KILL) in a
        shielded, bounded scope before the cancellation propagates.
        """
        self._check_open()
        start = anyio.current_time()
        cwd = request.cwd
        ns = self.namespace
        oom_before = ns.oom_kills() if ns is not None else 0
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
            if cwd is None or ns is not None:
                raise
            # The start failed in chdir (subprocess reports it to the parent): act like `cd`.
            return ExecResult("", f"bash: cd: {cwd}: No such file or directory\n", 1)
        stderr = _decode(raw.stderr)
        if ns is not None and raw.exit_code == 128 + signal.SIGKILL and ns.oom_kills() > oom_before:
            stderr += (
                f"\n[hermes-async: killed by the sandbox's memory limit "
                f"({ns.options.memory_limit_mb} MiB)]\n"
            )
        return ExecResult(
            stdout=_decode(raw.stdout),
            stderr=stderr,
            exit_code=raw.exit_code,
            timed_out=raw.timed_out,
            truncated=raw.truncated,
            duration_seconds=anyio.current_time() - start,
        )

    async def _sh(
        self,
        script: str,
        *args: str,
        stdin: bytes | None = None,
        limit: int | None = None,
        sink: ByteSink | None = None,
    ) -> RawResult:
        return await self._run(
            ["/bin/sh", "-c", script, "sh", *args],
            timeout=TRANSFER_TIMEOUT_SECONDS,
            stdin=stdin,
            output_limit=limit,
            stdout_sink=sink,
        )

    def _resolve(self, path: str) -> str:
        return resolve_path(self.workdir, path, self.home)

    async def read_bytes(self, path: str) -> bytes:
        """Return the contents of ``path`` (via ``cat`` in the sandbox's environment).

        Raises:
            FileNotFoundError: ``path`` does not exist or is not a regular file.
            TransferLimitError: It is larger than :data:`MAX_READ_BYTES` (stream it instead).
            OSError: It exists but cannot be read.

        **Cancellation**: the ``cat`` process is killed.
        """
        target = self._resolve(path)
        raw = await self._sh(
            _size_checked('exec cat -- "$1"'), target, str(MAX_READ_BYTES), limit=MAX_READ_BYTES
        )
        _check_read(raw, path, MAX_READ_BYTES)
        return raw.stdout

    async def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path``, creating parent directories.

        **Cancellation**: the file may be partially written.
        """
        target = self._resolve(path)
        raw = await self._sh(
            'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', target, stdin=data, limit=65536
        )
        if raw.exit_code != 0:
            raise OSError(f"cannot write {path!r}: {_decode(raw.stderr).strip()}")

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        """Validate then extract a tar archive into ``dest_dir``.

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

    _ARCHIVE = (
        f'[ -e "$1" ] || exit {_MISSING}; if [ -d "$1" ]; then exec tar -c -f - -C "$1" .; '
        'else exec tar -c -f - -C "$(dirname -- "$1")" -- "$(basename -- "$1")"; fi'
    )

    async def get_archive(self, path: str) -> bytes:
        """Return a tar archive of ``path``.

        **Cancellation**: the ``tar`` process is killed.
        """
        target = self._resolve(path)
        raw = await self._sh(self._ARCHIVE, target)
        if raw.exit_code == _MISSING:
            raise FileNotFoundError(f"No such file or directory: {path!r}")
        if raw.exit_code != 0:
            raise OSError(f"cannot archive {path!r}: {_decode(raw.stderr).strip()}")
        return raw.stdout

    async def stream_file(self, path: str, sink: ByteSink, *, max_bytes: int | None = None) -> int:
        """Stream ``path``'s bytes from a ``cat`` in the sandbox, size checked first.

        **Cancellation**: the ``cat`` process is killed.
        """
        target = self._resolve(path)
        limit = -1 if max_bytes is None else max_bytes
        counter = _Counter(sink, max_bytes, f"file {path!r}")
        raw = await self._sh(_size_checked('exec cat -- "$1"'), target, str(limit), sink=counter)
        _check_read(raw, path, max_bytes)
        return counter.total

    async def stream_archive(
        self, path: str, sink: ByteSink, *, max_bytes: int | None = None
    ) -> int:
        """Stream a tar of ``path`` from a ``tar`` in the sandbox.

        **Cancellation**: the ``tar`` process is killed.
        """
        counter = _Counter(sink, max_bytes, f"archive of {path!r}")
        raw = await self._sh(self._ARCHIVE, self._resolve(path), sink=counter)
        if raw.exit_code == _MISSING:
            raise FileNotFoundError(f"No such file or directory: {path!r}")
        if raw.exit_code != 0:
            raise OSError(f"cannot archive {path!r}: {_decode(raw.stderr).strip()}")
        return counter.total

    def _background_started(self, process: BackgroundProcess) -> None:
        if process.pid is not None and self.namespace is None:
            self._groups.add(process.pid)

    def live_processes(self) -> list[int]:
        """Host pids of live processes that belong to this sandbox, for tests and diagnostics.

        Namespaces mode: while the sandbox is open, the world's PID 1 and its keeper are left out.
        """
        ns = self.namespace
        if ns is None:
            return find_sandbox_processes(self.sandbox_id, self._groups)
        found = processes_in_pid_namespace(ns.pid_namespace)
        if not self._closed:
            own = {ns.init_pid, ns.keeper_pid}
            return [pid for pid in found if pid not in own]
        # The kernel reuses a dead namespace's inode number: a newer world may hold it now.
        found = [pid for pid in found if in_cgroups(pid, ns.cgroup_dirs)]
        if ns.launcher.returncode is None:
            found.append(ns.launcher.pid)
        return found

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

    async def _end_world(self, ns: Namespace, *, graceful: bool) -> None:
        if graceful and ns.alive():
            # TERM every process of the world but PID 1, then give them the grace to go.
            try:
                with anyio.fail_after(self.terminate_grace + 5):
                    if ns.signal_members(signal.SIGTERM) is None:
                        # No cgroup to list them: kill(-1) inside, as the sandbox user, spares
                        # PID 1 (root's) and the sending shell.
                        await run_bounded(
                            ns.command(["/bin/sh", "-c", "kill -TERM -1 2>/dev/null; true"], "/"),
                            env=self.env,
                            timeout=self.terminate_grace + 5,
                            output_limit=4096,
                        )
                    await ns.wait_quiet(self.terminate_grace)
            except (OSError, TimeoutError) as exc:
                logger.debug("graceful stop of %s failed: %s", self.sandbox_id, exc)
        await ns.kill()

    async def aclose(self, interrupted: bool = False) -> None:
        """Kill every process the sandbox started, then remove its directory. Idempotent.

        SIGTERM, ``terminate_grace``, SIGKILL (at once when interrupted); then ``rm -rf``.

        **Cancellation**: every wait is bounded; the release's owner shields it.
        """
        if self._closed:
            return
        self._closed = True
        ns = self.namespace
        if ns is not None:
            try:
                await self._end_world(ns, graceful=not interrupted)
                if self._inflight:
                    # Commands still returning (their processes died with the world).
                    self._drained = anyio.Event()
                    with anyio.move_on_after(self.terminate_grace + KILL_WAIT_SECONDS + 2):
                        await self._drained.wait()
            finally:
                await ns.release()
            # Together: the cgroups may stay busy while the kernel reaps the world, and the
            # directory must not wait for them (a release that runs out of its bound would
            # leave it behind).
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.remover.remove, self.root)
                tg.start_soon(self.remover.remove_cgroups, ns.cgroup_dirs)
            return
        survivors = await self._kill_everything(graceful=not interrupted)
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


class _Counter:
    """A sink wrapper that counts bytes and stops the transfer past ``limit``."""

    __slots__ = ("limit", "sink", "total", "what")

    def __init__(self, sink: ByteSink, limit: int | None, what: str) -> None:
        self.sink = sink
        self.limit = limit
        self.what = what
        self.total = 0

    async def __call__(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.limit is not None and self.total > self.limit:
            raise TransferLimitError(self.what, limit=self.limit)
        await self.sink(chunk)


#: Variable names, as a list or tuple (a bare string would be read as its characters).
_NAMES = Requirement(
    lambda v: (
        not isinstance(v, str | bytes)
        and isinstance(v, Iterable)
        and all(_is_variable_name(n) for n in v)
    ),
    "a list of variable names (no '=' or NUL; a bare string would be read as its characters)",
)


def _check_environment(where: str, env: object) -> None:
    """Check variables to set; the message names the variable, never its value."""
    if env is None:
        return
    if not isinstance(env, Mapping):
        raise ConfigError(f"{where} must be a mapping of variable names to strings or None")
    for name, value in env.items():
        if not _is_variable_name(name):
            raise ConfigError(f"{where} has an invalid variable name {name!r} (empty, '=' or NUL)")
        if not isinstance(value, str) or "\0" in value:
            shown = type(value).__name__ if not isinstance(value, str) else "a string with NUL"
            raise ConfigError(
                f"{where}[{name!r}] must be a string without NUL, got {shown} (value not shown)"
            )


def _write_marker(root: str, sandbox_id: str) -> None:
    """Process mode: a crashed owner's sweep finds a leftover directory's processes by it."""
    with open(os.path.join(root, MARKER_FILE), "w", encoding="ascii") as f:
        f.write(sandbox_id)


def local_factory(
    root_dir: str | None = None,
    *,
    env_allowlist: Iterable[str] = DEFAULT_ENV_ALLOWLIST,
    extra_env: Mapping[str, str] | None = None,
    default_timeout: float = DEFAULT_EXEC_TIMEOUT_SECONDS,
    terminate_grace: float = TERMINATE_GRACE_SECONDS,
    isolation: Isolation = "auto",
    namespace: NamespaceOptions | None = None,
) -> Callable[..., Awaitable[Sandbox]]:
    """A ``SandboxManager`` factory that creates :class:`LocalSandbox` es.

    Also the options of ``terminal_backend="local"``. Its sandboxes share one ``/proc`` sweeper
    and one directory remover. A spec's ``env``, ``workdir`` and ``exec_timeout`` apply.

    Args:
        env_allowlist: Host variables copied into each sandbox.
        isolation: ``"auto"`` (``$HERMES_SANDBOX_ISOLATION``, else namespaces),
            ``"namespaces"`` or ``"process"``.
        namespace: Network, limits, disk and user of namespaced sandboxes.

    Raises:
        ConfigError: An invalid option, or bubblewrap, nsenter or root missing. That
            bubblewrap starts is checked at the first creation or by :func:`local_preflight`.
    """
    check_value("local_factory default_timeout", default_timeout, POSITIVE_FINITE)
    check_value("local_factory terminate_grace", terminate_grace, NON_NEGATIVE_FINITE)
    check_value("local_factory env_allowlist", env_allowlist, _NAMES)
    _check_environment("local_factory extra_env", extra_env)
    isolation = _chosen_isolation(isolation)
    options = namespace if namespace is not None else _DEFAULT_NAMESPACE
    if not isinstance(options, NamespaceOptions):
        raise ConfigError(f"namespace must be a NamespaceOptions, got {type(options).__name__}")
    if isolation != "process" and (reason := namespace_support()) is not None:
        raise _isolation_unavailable(reason)
    return _LocalFactory(
        root_dir,
        tuple(env_allowlist),
        extra_env,
        default_timeout,
        terminate_grace,
        isolation,
        options,
    )


class _LocalFactory:
    """What :func:`local_factory` returns: ``async (task_id, spec=None) -> LocalSandbox``.

    A slotted object, not a closure, and the sweeper and remover its sandboxes share are made
    with the first sandbox: every standalone run makes a factory, and most never use it.
    """

    __slots__ = (
        "_allowlist",
        "_default_timeout",
        "_extra_env",
        "_isolation",
        "_options",
        "_remover",
        "_root_dir",
        "_sweeper",
        "_terminate_grace",
    )

    def __init__(
        self,
        root_dir: str | None,
        allowlist: tuple[str, ...],
        extra_env: Mapping[str, str] | None,
        default_timeout: float,
        terminate_grace: float,
        isolation: Isolation,
        options: NamespaceOptions,
    ) -> None:
        self._root_dir = root_dir
        self._allowlist = allowlist
        self._extra_env = extra_env
        self._default_timeout = default_timeout
        self._terminate_grace = terminate_grace
        self._isolation = isolation
        self._options = options
        self._sweeper: ProcessSweeper | None = None
        self._remover: DirectoryRemover | None = None

    async def __call__(self, task_id: str, spec: SandboxSpec | None = None) -> Sandbox:
        if self._sweeper is None or self._remover is None:
            self._sweeper, self._remover = ProcessSweeper(), DirectoryRemover()
        # A spec's env and workdir apply here (a folder of that path inside the sandbox's
        # work dir); images and resource limits need a container backend.
        env = dict(self._extra_env or {})
        if spec is not None:
            env.update(spec.env)
        sandbox = await LocalSandbox.create(
            task_id,
            root_dir=self._root_dir,
            env_allowlist=self._allowlist,
            extra_env=env,
            default_timeout=(
                spec.exec_timeout
                if spec is not None and spec.exec_timeout
                else self._default_timeout
            ),
            terminate_grace=self._terminate_grace,
            sweeper=self._sweeper,
            remover=self._remover,
            isolation=self._isolation,
            namespace_options=self._options,
        )
        if spec is not None and spec.workdir is not None:
            try:
                await _enter_spec_workdir(sandbox, spec.workdir)
            except BaseException:
                await sandbox.aclose(interrupted=True)  # shielded and bounded itself
                raise
        return sandbox
