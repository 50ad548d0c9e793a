"""Linux namespaces for the local backend: one bubblewrap world per sandbox, joined per command.

Every command of a sandbox joins one long-lived world (``nsenter`` into bubblewrap's PID 1),
so membership is decided by the kernel, never by anything a command controls. Close kills PID
1 through a pidfd; the kernel ends the rest. If this process dies, the supervisor's pipe closes
and the supervisor ends the world. The design, its costs and the rejected alternatives:
docs/decisions/070-namespaced-worlds.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import pwd
import secrets
import select
import shlex
import shutil
import signal
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import anyio
from anyio.abc import Process
from anyio.lowlevel import RunVar

from hermes_async._cleanup import cleanup_scope
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.tools.sandbox.errors import SandboxUnavailableError, UnavailableReason
from hermes_async.tools.sandbox.host import start_process
from hermes_async.tools.sandbox.processes import group_alive, process_tag, signal_group, tag_alive

__all__ = (
    "DEFAULT_DISK_LIMIT_MB",
    "DEFAULT_MEMORY_LIMIT_MB",
    "DEFAULT_PIDS_LIMIT",
    "DEFAULT_RO_PATHS",
    "DEFAULT_SANDBOX_UID",
    "ENTERED_MARK",
    "INSIDE_ROOT",
    "DiskBackend",
    "Namespace",
    "NamespaceOptions",
    "Network",
    "in_cgroups",
    "namespace_support",
    "probe_namespaces",
    "processes_in_pid_namespace",
)

logger = logging.getLogger("hermes_async.tools.sandbox.local")

#: Where the sandbox's writable disk is mounted inside the world.
INSIDE_ROOT = "/sandbox"

#: Host paths shown read-only inside (a symlink is recreated as the same symlink).
DEFAULT_RO_PATHS: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
)

#: Memory limit (the ``memory`` cgroup; page cache included).
DEFAULT_MEMORY_LIMIT_MB = 2048
#: Most processes and threads (the ``pids`` cgroup): a fork bomb stops here.
DEFAULT_PIDS_LIMIT = 512
#: Size of the sandbox's writable disk (``/sandbox`` and ``/tmp``).
DEFAULT_DISK_LIMIT_MB = 2048
#: The sandbox user (``nobody`` on Debian): no capabilities, owns only the sandbox's files.
DEFAULT_SANDBOX_UID = 65534

#: ``"none"``: a loopback of its own; ``"host"``: the host's network.
Network = Literal["none", "host"]
#: How the disk cap is made: a loop-mounted ext4 image, a size-limited tmpfs, or the best
#: available (loop, else tmpfs).
DiskBackend = Literal["auto", "loop", "tmpfs"]

#: Deadline of starting one world (fork + exec of a few small programs, a loop mount).
START_TIMEOUT_SECONDS = 60.0
#: After SIGKILL of PID 1, how long the kernel may take to reap the world.
KILL_WAIT_SECONDS = 10.0
#: How often a graceful close looks whether the world's processes are gone.
_GRACE_POLL_SECONDS = 0.05
#: Processes of ours in a world's pids cgroup when nothing of the sandbox runs: the supervisor,
#: bubblewrap outside, its PID 1, the keeper ``sleep``.
_BASE_TASKS = 4

#: Exit code of the entry script when the world is not the sandbox's (hostname check failed).
_WRONG_WORLD = 125
_WRONG_WORLD_MARK = "hermes-async: not this sandbox's namespaces"
#: What the entry script writes to stderr once the hostname check passed, before anything of
#: the command runs (``run_bounded(stderr_prefix=...)`` removes it). Without it, the command's
#: own stderr and exit code could pass for a failed entry.
ENTERED_MARK = b"hermes-async: entered\n"

_CGROUP_ROOT = "/sys/fs/cgroup"
_CGROUP_DIR = "hermes-async"
_TEMPLATE_VERSION = 2

#: The world's directories under its root, the sandbox user's (``tmp`` is 1777).
_WORLD_DIRS = ("work", "home", "tmp", ".state", ".state/bg")

# <linux/loop.h>: LOOP_CTL_GET_FREE, LOOP_CONFIGURE (Linux 5.8), LO_FLAGS_AUTOCLEAR, and
# struct loop_config: fd, block_size, struct loop_info64, 8 reserved u64.
_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
_LOOP_CONFIG = struct.Struct("=II5Q4I64s64s32s2Q64x")

#: Where the disk images that sandboxes copy are kept (one per size and owner).
TEMPLATE_DIR = os.path.join(tempfile.gettempdir(), "hermes-async-disk-templates")


@dataclass(frozen=True, slots=True)
class NamespaceOptions:
    """How namespaced local sandboxes are built (see the module docstring).

    Attributes:
        network: ``"none"`` (default: loopback only) or ``"host"``.
        memory_limit_mb: Memory cgroup limit; ``None``: unlimited.
        pids_limit: Pids cgroup limit; ``None``: unlimited.
        disk_limit_mb: Size of the writable disk; ``None``: no cap (a plain host directory).
        disk_backend: How the cap is made (``"auto"``: loop device, else tmpfs).
        uid: The sandbox user's uid (> 0).
        gid: The sandbox user's gid (> 0).
        ro_paths: Host paths visible read-only (missing ones are skipped).
        ro_binds: More host paths to show read-only, at the same place.
    """

    network: Network = "none"
    memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB
    pids_limit: int | None = DEFAULT_PIDS_LIMIT
    disk_limit_mb: int | None = DEFAULT_DISK_LIMIT_MB
    disk_backend: DiskBackend = "auto"
    uid: int = DEFAULT_SANDBOX_UID
    gid: int = DEFAULT_SANDBOX_UID
    ro_paths: tuple[str, ...] = DEFAULT_RO_PATHS
    ro_binds: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("ro_paths", "ro_binds"):  # a config gives lists
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.network not in ("none", "host"):
            raise ConfigError(f"network must be 'none' or 'host', got {self.network!r}")
        if self.disk_backend not in ("auto", "loop", "tmpfs"):
            raise ConfigError(
                f"disk_backend must be 'auto', 'loop' or 'tmpfs', got {self.disk_backend!r}"
            )
        for name in ("memory_limit_mb", "pids_limit", "disk_limit_mb"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive integer or None, got {value!r}")
        if self.uid <= 0 or self.gid <= 0:
            raise ConfigError(
                f"the sandbox user must not be root: uid={self.uid}, gid={self.gid}; "
                "commands run with no privileges (default 65534, nobody)"
            )
        for path in (*self.ro_paths, *self.ro_binds):
            if not path.startswith("/") or path.rstrip("/") in ("", INSIDE_ROOT, "/tmp", "/proc"):
                raise ConfigError(
                    f"read-only path {path!r} must be absolute and not /, {INSIDE_ROOT}, "
                    "/tmp or /proc"
                )

    @property
    def user_name(self) -> str:
        """The sandbox user's name on this host (``$USER`` inside), or ``sandbox``."""
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return "sandbox"


# --------------------------------------------------------------------------------------------
# Availability


_support: dict[tuple[int, str | None], str | None] = {}


def namespace_support() -> str | None:
    """Cheap check (PATH lookups, no process): ``None`` if the tools are here, else why not."""
    # Once per user and PATH: each rollout's sandbox factory asks, 20,000 at once at start-up.
    key = (os.geteuid(), os.environ.get("PATH"))
    if key not in _support:
        _support[key] = _namespace_support()
    return _support[key]


def _namespace_support() -> str | None:
    if os.geteuid() != 0:
        return "namespaced local sandboxes need root (nsenter into each sandbox's namespaces)"
    missing = [tool for tool in ("bwrap", "nsenter", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found on PATH (Debian packages: bubblewrap, util-linux)"
    return None


_probe_result: list[str | None] = []
# One per event loop: sandboxes created at once wait for the first one's probe or template
# instead of each running its own (64 bwrap probes at a cold start of 64).
_FIRST_USE: RunVar[anyio.Lock] = RunVar("hermes_async.namespaces.first_use")


def _first_use_lock() -> anyio.Lock:
    try:
        return _FIRST_USE.get()
    except LookupError:
        lock = anyio.Lock()
        _FIRST_USE.set(lock)
        return lock


async def probe_namespaces() -> str | None:
    """Start one throw-away world (once per process); ``None`` if it works, else why not.

    **Cancellation**: the probe process is killed; the next call probes again.
    """
    if _probe_result:
        return _probe_result[0]
    async with _first_use_lock():
        if not _probe_result:
            _probe_result.append(await _probe())
    return _probe_result[0]


async def _probe() -> str | None:
    reason = namespace_support()
    if reason is None:
        argv = [
            "bwrap",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            # The system paths a world shows, not `--ro-bind / /`: that binds every host
            # mount recursively and fails on some (a Docker overlay's resolv.conf bind).
            *_ro_args(DEFAULT_RO_PATHS),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--",
            "/bin/sh",
            "-c",
            "exit 0",
        ]
        try:
            with anyio.fail_after(30):
                result = await anyio.run_process(argv, check=False, stdin=subprocess.DEVNULL)
        except (OSError, TimeoutError) as exc:
            reason = f"bwrap could not run: {exc}"
        else:
            if result.returncode != 0:
                detail = result.stderr.decode("utf-8", "replace").strip()[:300]
                reason = f"bwrap failed (exit {result.returncode}): {detail}"
    return reason


# --------------------------------------------------------------------------------------------
# Cgroups (v1) and disks


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path in a v1 hierarchy (``/`` at the root), or None."""
    try:
        with open("/proc/self/cgroup", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            return parts[2]
    return None


@dataclass(frozen=True, slots=True)
class _Cgroups:
    """Where this process's sandboxes' cgroups go, per controller (``None``: not usable)."""

    memory: str | None
    pids: str | None

    @classmethod
    def discover(cls) -> _Cgroups:
        bases: dict[str, str | None] = {}
        owner = process_tag()
        for controller in ("memory", "pids"):
            own = _own_cgroup(controller)
            root = os.path.join(_CGROUP_ROOT, controller)
            base = None
            if own is not None and os.path.isdir(root):
                parent = os.path.join(root + own.rstrip("/"), _CGROUP_DIR)
                try:
                    os.makedirs(os.path.join(parent, owner), exist_ok=True)
                    base = os.path.join(parent, owner)
                    _sweep_dead_owners(parent)
                except OSError:
                    base = None
            bases[controller] = base
        return cls(bases["memory"], bases["pids"])


def _sweep_dead_owners(parent: str) -> None:
    """Remove the (empty) cgroups left by dead processes (a crashed run)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name[:1].isdigit() or tag_alive(name):
            continue  # not an owner's group, or its owner is alive
        owner_dir = os.path.join(parent, name)
        with contextlib.suppress(OSError):
            for child in os.listdir(owner_dir):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(owner_dir, child))
            os.rmdir(owner_dir)


class _Host:
    """Per-process facts about this host that every world needs (computed once)."""

    def __init__(self) -> None:
        self.cgroups = _Cgroups.discover()
        # This object outlives event loops (tests run asyncio then trio): its caches take no
        # lock; the slow first template waits on the per-loop _first_use_lock().
        self._templates: dict[tuple[str, int, int, int], str] = {}
        self._loop_ok: bool | None = None
        self.warned_limits = False

    def loop_available(self) -> bool:
        if self._loop_ok is None:
            # What `losetup -f` checks, without a program per sandbox.
            ok = shutil.which("mkfs.ext4") is not None
            if ok:
                try:
                    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
                    try:
                        fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
                    finally:
                        os.close(control)
                except OSError:
                    ok = False
            if not ok:
                logger.warning(
                    "namespaced sandboxes: no usable loop device (or mkfs.ext4); the disk "
                    "cap uses a size-limited tmpfs instead (memory-backed: counted in the "
                    "memory limit, which is raised by the disk cap)"
                )
            self._loop_ok = ok
        return self._loop_ok

    async def template(self, size_mb: int, uid: int, gid: int) -> str:
        """An ext4 image of ``size_mb`` holding the world's empty directories, owned by
        ``uid:gid`` (made once per host, then copied per sandbox).

        Kept in :data:`TEMPLATE_DIR`, not among the sandboxes: ~1 MiB on disk (sparse).
        """
        directory = TEMPLATE_DIR
        key = (directory, size_mb, uid, gid)
        path = self._templates.get(key)
        if path is not None:
            return path
        name = f".hermes-sbx-template-v{_TEMPLATE_VERSION}-{size_mb}m-{uid}-{gid}.img"
        path = os.path.join(directory, name)
        async with _first_use_lock():
            if key not in self._templates:
                self._templates[key] = await self._make_template(path, size_mb, uid, gid)
        return self._templates[key]

    async def _make_template(self, path: str, size_mb: int, uid: int, gid: int) -> str:
        # Made by an earlier process: one stat in the local temp directory, no shell.
        if os.path.isfile(path):  # noqa: ASYNC240
            return path
        # The directories are in the image (mke2fs -d), so a start runs no mkdir, chown or
        # chmod: three fewer programs per sandbox.
        script = (
            'mkdir -p -- "$(dirname -- "$1")"; t="$1.$$.tmp"; d="$1.$$.d"; '
            'img="$1" size="$2" owner="$3"; shift 3; mkdir -p "$d" && chmod 0755 "$d" && cd "$d" && '
            'mkdir -p "$@" && chown "$owner" "$@" && chmod 1777 tmp && cd / && '
            'truncate -s "$size" "$t" && '
            'mkfs.ext4 -q -F -O ^has_journal -E lazy_itable_init=1,nodiscard -m 0 -d "$d" "$t" '
            '&& mv -f "$t" "$img"; s=$?; rm -rf "$d"; [ $s = 0 ] || { rm -f "$t"; exit 1; }'
        )
        with anyio.fail_after(120):
            result = await anyio.run_process(
                ["/bin/sh", "-c", script, "sh", path, f"{size_mb}M", f"{uid}:{gid}", *_WORLD_DIRS],
                check=False,
            )
        if result.returncode != 0:
            detail = result.stderr.decode("utf-8", "replace").strip()[:300]
            raise SandboxError(
                f"cannot make the disk image template {path!r} (mkfs.ext4): {detail}; "
                "check root_dir is writable, or set disk_backend='tmpfs'"
            )
        return path


_HOST: list[_Host] = []


def _host() -> _Host:
    if not _HOST:
        _HOST.append(_Host())
    return _HOST[0]


# --------------------------------------------------------------------------------------------
# One world


# Host side of every command: join the sandbox's cgroups (before anything of the command runs,
# so all it forks is counted), then `exec` the rest (nsenter ...).
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'

# Inside, as the sandbox user: prove this is the sandbox's world (its unique hostname), say
# so on stderr (ENTERED_MARK), cd, exec the command. $1 hostname, $2 directory, then the command's argv.
_ENTER = (
    'read -r h < /proc/sys/kernel/hostname 2>/dev/null; [ "$h" = "$1" ] || '
    f'{{ echo "{_WRONG_WORLD_MARK}" >&2; exit {_WRONG_WORLD}; }}; '
    f"printf '%s\\n' '{ENTERED_MARK.decode().strip()}' >&2; "
    'cd -- "$2" 2>/dev/null || { printf \'bash: cd: %s: No such file or directory\\n\' "$2" >&2; '
    'exit 1; }; shift 2; exec "$@"'
)


def _ro_args(paths: Sequence[str], *, shown: Sequence[str] = ()) -> list[str]:
    """bwrap arguments showing ``paths`` read-only; ``shown``: paths an earlier list shows.

    A path's parents that nothing shows are made 0755 (bwrap makes them 0700, root's: the
    sandbox user could not reach ``/opt/tool`` behind its new ``/opt``).
    """
    args: list[str] = []
    made = [p.rstrip("/") for p in shown]
    for path in paths:
        if not (os.path.islink(path) or os.path.exists(path)):
            continue
        parents = []
        parent = os.path.dirname(path.rstrip("/"))
        while parent not in ("/", "") and not any(
            parent == m or parent.startswith(m + "/") for m in made
        ):
            parents.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(parents):
            args += ["--perms", "0755", "--dir", directory]
            made.append(directory)
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        else:
            args += ["--ro-bind", path, path]
        made.append(path.rstrip("/"))
    return args


def processes_in_pid_namespace(inode: int) -> list[int]:
    """Host pids of live processes in PID namespace ``inode`` (a ``/proc`` scan; tests only)."""
    wanted = f"pid:[{inode}]"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != wanted:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def in_cgroups(pid: int, directories: Sequence[str]) -> bool:
    """Whether process ``pid`` is in one of the cgroup ``directories`` (True without any)."""
    if not directories:
        return True
    names = {"/" + os.path.basename(d) for d in directories}
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    return any(line.endswith(name) for line in lines for name in names)


class Namespace:
    """One sandbox's world: its bubblewrap, PID 1 (held by a pidfd), cgroups and disk.

    Create with :meth:`start`; end with :meth:`terminate` then :meth:`release`.
    """

    def __init__(
        self,
        *,
        root: str,
        hostname: str,
        options: NamespaceOptions,
        launcher: Process,
        info: dict[str, int],
        pidfd: int,
        cgroups: tuple[str, ...],
        memory_cgroup: str | None,
        pids_cgroup: str | None,
        disk: str,
        keeper_pid: int = 0,
    ) -> None:
        self.root = root
        self.hostname = hostname
        self.options = options
        self.launcher = launcher
        self.init_pid = info["child-pid"]
        self.pid_namespace = info.get("pid-namespace", 0)
        self._has_cgroup_ns = "cgroup-namespace" in info
        self._pidfd: int | None = pidfd
        self.cgroups = cgroups
        self.memory_cgroup = memory_cgroup
        self.pids_cgroup = pids_cgroup
        #: How the disk cap is made: ``"loop"``, ``"tmpfs"`` or ``"none"``.
        self.disk = disk
        #: Host pid of the keeper (PID 2 of the world), spared by the graceful TERM: if it
        #: died, bubblewrap's PID 1 would end the world at once, without the grace.
        self.keeper_pid = keeper_pid

    # ------------------------------------------------------------------------ start

    @classmethod
    async def start(cls, root: str, options: NamespaceOptions, *, task_id: str) -> Namespace:
        """Start the world of a sandbox whose host directory is ``root`` (already created).

        Raises:
            SandboxError: bubblewrap (or the mount, or the cgroups) failed; the message has its
                error output.

        **Cancellation**: whatever started is killed (shielded, bounded) before it propagates.
        """
        host = _host()
        hostname = f"sbx-{secrets.token_hex(6)}"
        memory_mb = options.memory_limit_mb
        disk = "none"
        template = ""
        if options.disk_limit_mb is not None:
            use_loop = options.disk_backend == "loop" or (
                options.disk_backend == "auto" and host.loop_available()
            )
            if use_loop:
                disk = "loop"
                template = await host.template(options.disk_limit_mb, options.uid, options.gid)
            else:
                disk = "tmpfs"
                if memory_mb is not None:
                    memory_mb += options.disk_limit_mb  # tmpfs pages count as memory
        cgroups: list[str] = []
        limits: list[tuple[str, int]] = []  # (file, value), written by this process
        memory_cgroup = pids_cgroup = None
        name = os.path.basename(root)
        if memory_mb is not None and host.cgroups.memory is not None:
            memory_cgroup = os.path.join(host.cgroups.memory, name)
            limits.append((os.path.join(memory_cgroup, "memory.limit_in_bytes"), memory_mb << 20))
            cgroups.append(os.path.join(memory_cgroup, "cgroup.procs"))
        if options.pids_limit is not None and host.cgroups.pids is not None:
            pids_cgroup = os.path.join(host.cgroups.pids, name)
            limits.append((os.path.join(pids_cgroup, "pids.max"), options.pids_limit))
            cgroups.append(os.path.join(pids_cgroup, "cgroup.procs"))
        wanted_limits = memory_mb is not None or options.pids_limit is not None
        if wanted_limits and not cgroups and not host.warned_limits:
            host.warned_limits = True
            logger.warning(
                "namespaced sandboxes run WITHOUT memory and pids limits: no writable cgroup v1 "
                "memory/pids hierarchy under %s (cgroup v2 is not supported yet)",
                _CGROUP_ROOT,
            )
        fs = os.path.join(root, "fs")
        # The mount's arguments reach the launcher as its positional parameters: a loop
        # disk's are known only once its device is attached (in the try block below).
        mount: list[str] = []
        if disk == "tmpfs":
            size = (options.disk_limit_mb or 0) << 20
            mount = ["-t", "tmpfs", "-o", f"size={size},nosuid,nodev,mode=0755", "tmpfs", fs]
        loop_fd = -1
        info_r, info_w = os.pipe()
        os.set_blocking(info_r, False)
        owner = f"{options.uid}:{options.gid}"
        dirs = [f"{fs}/{d}" for d in _WORLD_DIRS]
        bwrap = [
            "bwrap",
            "--die-with-parent",
            "--new-session",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            *(["--unshare-net"] if options.network == "none" else []),
            "--hostname",
            hostname,
            *_ro_args(options.ro_paths),
            *_ro_args(options.ro_binds, shown=options.ro_paths),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--bind",
            fs,
            INSIDE_ROOT,
            "--bind",
            f"{fs}/tmp",
            "/tmp",
            "--chdir",
            "/",
            "--info-fd",
            str(info_w),
            "--",
            "sleep",
            "2147483647",
        ]
        # A loop disk's image holds the directories already (_Host.template).
        made = (
            []
            if disk == "loop"
            else [
                "mkdir -p " + " ".join(shlex.quote(d) for d in dirs),
                f"chown {owner} " + " ".join(shlex.quote(d) for d in dirs),
                f"chmod 1777 {shlex.quote(fs + '/tmp')}",
            ]
        )
        # Run by `unshare --mount` itself (no host shell before it): the supervisor joins the
        # cgroups before it forks anything, so all the world's processes are counted.
        script = "\n".join(
            [
                "set -e",
                "umask 022",
                *(f"echo $$ > {shlex.quote(c)}" for c in cgroups),
                "echo -1000 > /proc/self/oom_score_adj 2>/dev/null || true",
                '[ "$#" = 0 ] || mount "$@"',
                *made,
                # This shell is the supervisor: bubblewrap's parent, waiting for end-of-file on
                # the host's pipe (our close, or this process's death); then it ends the world.
                shlex.join(bwrap) + " >/dev/null &",
                "world=$!",
                "read -r _ || true",
                *_END_OF_WORLD,
            ]
        )
        launcher: Process | None = None
        pidfd: int | None = None
        try:
            if disk == "loop":
                mount, loop_fd = _loop_disk(template, os.path.join(root, "disk.img"), fs, task_id)
            # Made here, not by the launcher's script: no mkdir program per directory.
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(fs)
                os.chmod(fs, 0o755)
                for procs in cgroups:
                    os.makedirs(os.path.dirname(procs), exist_ok=True)
                for path, value in limits:
                    _write_cgroup_file(path, value)
            except OSError as exc:
                raise SandboxError(
                    f"cannot make the namespaced sandbox's directories: {exc}", task_id=task_id
                ) from exc
            launcher = await start_process(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "--",
                    "/bin/sh",
                    "-c",
                    script,
                    "hermes-launch",
                    *mount,
                ],
                timeout=START_TIMEOUT_SECONDS,
                stdin=subprocess.PIPE,  # the supervisor's lifeline (see the module doc)
                # The supervisor holds a read end of bubblewrap's report: if we die first,
                # the report cannot fail with SIGPIPE and kill bubblewrap before it wakes
                # the world's PID 1 (see _END_OF_WORLD).
                stdout=info_r,
                stderr=subprocess.PIPE,
                env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")},
                start_new_session=True,
                pass_fds=(info_w,),
            )
            os.close(info_w)
            info_w = -1
            with anyio.fail_after(START_TIMEOUT_SECONDS):
                info = await _read_info(info_r)
            if info is None:
                stderr = b""
                with anyio.move_on_after(5):
                    assert launcher.stderr is not None
                    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
                        while len(stderr) < 65536:
                            stderr += await launcher.stderr.receive()
                raise SandboxError(
                    "could not start the namespaced sandbox (bubblewrap): "
                    f"{stderr.decode('utf-8', 'replace').strip()[:1000] or 'no error output'}; "
                    "run scripts/sandbox/install.sh, or use isolation='process'",
                    task_id=task_id,
                )
            pidfd = os.pidfd_open(info["child-pid"])
            uts = info.get("uts-namespace")
            try:
                seen = os.readlink(f"/proc/{info['child-pid']}/ns/uts")
            except OSError:
                seen = ""
            if uts is not None and seen != f"uts:[{uts}]":
                raise SandboxError(
                    f"the namespaced sandbox's PID 1 ({info['child-pid']}) exited at once",
                    task_id=task_id,
                )
            # bubblewrap reports PID 1 before it has built the world (mounts, pivot_root,
            # hostname); the world is ready once PID 1's child has become the keeper.
            # Polled with a backoff (2 ms doubling to 50 ms): hundreds of sandboxes starting
            # at once each polling every 2 ms kept the event loop busy (lag of seconds).
            pause = 0.002
            with anyio.fail_after(START_TIMEOUT_SECONDS):
                while not (keepers := _keeper_pids(info["child-pid"])):
                    if launcher.returncode is not None:
                        raise SandboxError(
                            "the namespaced sandbox's bubblewrap exited while building it",
                            task_id=task_id,
                        )
                    await anyio.sleep(pause)
                    pause = min(pause * 2, 0.05)
        except BaseException:
            if info_w >= 0:
                os.close(info_w)
            os.close(info_r)
            if loop_fd >= 0:
                os.close(loop_fd)  # an unmounted device clears itself
            if pidfd is not None:
                os.close(pidfd)
            with cleanup_scope("kill a namespaced sandbox that failed to start", 10):
                if launcher is not None:
                    signal_group(launcher.pid, signal.SIGKILL)
                    await launcher.aclose()
                    # The launcher's setup steps (the mount, `mkdir`) are in its
                    # group: once they are all gone, none can write into the directory the
                    # caller removes next.
                    while group_alive(launcher.pid):
                        signal_group(launcher.pid, signal.SIGKILL)
                        await anyio.sleep(0.01)
                # The world's PID 1 is outside the launcher's process group and may be
                # starting still: kill whatever is in its cgroups, then remove them.
                await _abandon_cgroups([os.path.dirname(c) for c in cgroups])
            raise
        os.close(info_r)
        if loop_fd >= 0:
            os.close(loop_fd)  # the world's mount holds the device now (mounted before bwrap)
        return cls(
            root=root,
            hostname=hostname,
            options=options,
            launcher=launcher,
            info=info,
            pidfd=pidfd,
            cgroups=tuple(cgroups),
            memory_cgroup=memory_cgroup,
            pids_cgroup=pids_cgroup,
            disk=disk,
            keeper_pid=keepers[0],
        )

    # ------------------------------------------------------------------------ commands

    def command(self, argv: Sequence[str], cwd: str) -> list[str]:
        """The host argv that runs ``argv`` inside the world, in directory ``cwd``."""
        enter = ["nsenter", "-t", str(self.init_pid), "--mount", "--pid", "--ipc", "--uts"]
        if self._has_cgroup_ns:
            enter.append("--cgroup")
        if self.options.network == "none":
            enter.append("--net")
        enter += ["--root", "--wd", "-S", str(self.options.uid), "-G", str(self.options.gid)]
        return [
            "/bin/sh",
            "-c",
            _JOIN,
            "hermes-join",
            *self.cgroups,
            "--",
            *enter,
            "--",
            "/bin/sh",
            "-c",
            _ENTER,
            "hermes-enter",
            self.hostname,
            cwd,
            *argv,
        ]

    @staticmethod
    def wrong_world(exit_code: int, stderr: bytes) -> bool:
        """Whether a command's result says it never reached the world (see :meth:`command`):
        the cgroup join, ``nsenter`` or the hostname check failed. Ask only of a result whose
        stderr lacked :data:`ENTERED_MARK`."""
        if exit_code == _WRONG_WORLD and _WRONG_WORLD_MARK.encode() in stderr:
            return True
        if exit_code == 126 and b"cgroup.procs" in stderr:
            return True
        return exit_code != 0 and stderr.startswith(b"nsenter: ")

    # ------------------------------------------------------------------------ state

    def alive(self) -> bool:
        """Whether PID 1 still runs (a non-blocking look at the pidfd)."""
        if self._pidfd is None:
            return False
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return not poller.poll(0)

    def _read_cgroup(self, cgroup: str | None, name: str) -> str:
        if cgroup is None:
            return ""
        try:
            with open(os.path.join(cgroup, name), encoding="ascii") as f:
                return f.read()
        except OSError:
            return ""

    def oom_kills(self) -> int:
        """Processes the memory limit killed so far (``0`` without a memory cgroup)."""
        for line in self._read_cgroup(self.memory_cgroup, "memory.oom_control").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def tasks(self) -> int | None:
        """Tasks in the world's pids cgroup (ours included), or ``None`` without one."""
        text = self._read_cgroup(self.pids_cgroup, "pids.current").strip()
        return int(text) if text.isdigit() else None

    def unavailable(self, task_id: str | None) -> SandboxUnavailableError:
        """The error for a world whose PID 1 is gone."""
        oom = self.oom_kills()
        reason: UnavailableReason = "oom" if oom else "exited"
        detail = f"its PID 1 (host pid {self.init_pid}) died"
        if oom:
            detail += f"; the memory limit ({self.options.memory_limit_mb} MiB) killed {oom}"
        return SandboxUnavailableError(detail, reason=reason, backend="local", task_id=task_id)

    # ------------------------------------------------------------------------ close

    def signal_members(self, sig: int) -> int | None:
        """Send ``sig`` to every process of the world but its PID 1 and keeper, from the host.

        The members come from the world's cgroup (``cgroup.procs``: the kernel's list, no
        ``/proc`` scan); each is pinned with a pidfd and checked to be in the world's PID
        namespace before it is signalled, so a pid reused meanwhile is never hit. No process
        is spawned (asyncio forks on the event loop's thread: hundreds of closes at once each
        starting a ``kill`` stalled it for seconds).

        Returns:
            How many were signalled, or ``None`` without a cgroup (then signal from inside).
        """
        cgroup = self.pids_cgroup or self.memory_cgroup
        if cgroup is None:
            return None
        members = self._read_cgroup(cgroup, "cgroup.procs").split()
        wanted = f"pid:[{self.pid_namespace}]"
        sent = 0
        for text in members:
            pid = int(text)
            if pid in (self.init_pid, self.keeper_pid):
                continue
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # already gone
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") == wanted:
                    signal.pidfd_send_signal(fd, sig)
                    sent += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        return sent

    async def wait_quiet(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the world to hold only its own processes."""
        deadline = anyio.current_time() + grace
        while anyio.current_time() < deadline and self.alive():
            tasks = self.tasks()
            if tasks is not None and tasks <= _BASE_TASKS:
                return
            await anyio.sleep(_GRACE_POLL_SECONDS)

    async def kill(self) -> None:
        """SIGKILL PID 1 (the kernel kills the whole world) and wait, bounded, until it is gone.

        **Cancellation**: run under the release's cleanup scope; every wait is bounded.
        """
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        with anyio.move_on_after(KILL_WAIT_SECONDS):
            if self._pidfd is not None:
                while self.alive():
                    await anyio.wait_readable(self._pidfd)
            # End the supervisor: end-of-file on its pipe.
            if self.launcher.stdin is not None:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await self.launcher.stdin.aclose()
            await self.launcher.wait()
        if self.launcher.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.launcher.pid, signal.SIGKILL)

    @property
    def cgroup_dirs(self) -> tuple[str, ...]:
        """The world's cgroup directories (to remove once it is gone)."""
        return tuple(os.path.dirname(procs) for procs in self.cgroups)

    async def release(self) -> None:
        """Close our handles (after :meth:`kill`). Idempotent. The cgroups are the caller's to
        remove (:attr:`cgroup_dirs`), in a child process.

        **Cancellation**: bounded (the launcher's pipes).
        """
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        with anyio.move_on_after(5):
            await self.launcher.aclose()


# The supervisor's last step. --die-with-parent misses a world still being set up: bubblewrap
# dies before it wakes the world's PID 1, which then waits forever. So the supervisor stops
# bubblewrap (it can fork nothing more), kills its child (PID 1: the kernel ends the world)
# and bubblewrap. The parent check keeps a reused pid safe.
_END_OF_WORLD = (
    'if read -r _ _ state ppid _ 2>/dev/null </proc/"$world"/stat && [ "$ppid" = $$ ]; then',
    '  kill -STOP "$world" 2>/dev/null || true',
    "  n=0",  # a loaded machine can take a while to schedule the stop: up to ~5 s
    '  while [ $n -lt 500 ] && [ "$state" != T ] && [ "$state" != Z ] &&',
    '    read -r _ _ state _ 2>/dev/null </proc/"$world"/stat; do sleep 0.01; n=$((n + 1)); done',
    '  kill -KILL $(cat /proc/"$world"/task/"$world"/children 2>/dev/null || true) "$world" \\',
    "    2>/dev/null || true",
    "fi",
)

_KEEPER_CMDLINE = b"sleep\x002147483647\x00"


def _cgroup_members(directory: str) -> list[int] | None:
    """Pids in cgroup ``directory`` (a sysfs read), ``None`` if it does not exist."""
    try:
        with open(os.path.join(directory, "cgroup.procs"), encoding="ascii") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return []


async def _abandon_cgroups(directories: Sequence[str]) -> None:
    """SIGKILL every member of the cgroups of a world that failed to start, and remove them
    (retried while the members exit; the caller bounds it). Membership is the kernel's
    record: only the world's processes are in these groups."""
    left = list(directories)
    while left:
        for directory in list(left):
            members = _cgroup_members(directory)
            if members is None:
                left.remove(directory)
                continue
            for pid in members:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                left.remove(directory)
            except OSError:
                continue  # busy: members still exiting
            else:
                left.remove(directory)
        if left:
            await anyio.sleep(0.02)


def _loop_disk(template: str, image: str, fs: str, task_id: str) -> tuple[list[str], int]:
    """Copy the template to ``image`` and attach it: the mount's arguments, and the device's
    fd (``-1`` where this host cannot attach: then ``mount -o loop`` does)."""
    try:
        _copy_sparse(template, image)
    except OSError as exc:
        raise SandboxError(
            f"cannot copy the disk image for the namespaced sandbox: {exc}", task_id=task_id
        ) from exc
    try:
        # Attached here and mounted by type: `mount -o loop` probed the image and searched the
        # loop devices, ~3 ms of CPU more per sandbox.
        fd, device = _attach_loop(image)
    except OSError as exc:
        logger.debug("loop device not attached here (%s); mount -o loop instead", exc)
        return ["-o", "loop,nosuid,nodev", image, fs], -1
    return ["-t", "ext4", "-o", "nosuid,nodev", device, fs], fd


def _write_cgroup_file(path: str, value: int) -> None:
    """Write ``value`` to a cgroup control file (a sysfs write: no disk)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(value).encode("ascii"))
    finally:
        os.close(fd)


def _copy_sparse(source: str, target: str) -> None:
    """Copy ``source`` to a new file ``target``, its data extents only (holes stay holes).

    In-kernel (``copy_file_range``): ~0.4 ms for a template's ~0.6 MiB, where a ``cp``
    program cost ~2.5 ms of fork and exec per sandbox.
    """
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(dst, os.fstat(src).st_size)
            offset = 0
            while True:
                try:
                    start = os.lseek(src, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # no data after offset
                        return
                    raise
                end = os.lseek(src, start, os.SEEK_HOLE)
                while start < end:
                    copied = os.copy_file_range(src, dst, end - start, start, start)
                    if copied == 0:
                        raise OSError(errno.EIO, f"{source} shrank while it was copied")
                    start += copied
                offset = end
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _attach_loop(image: str) -> tuple[int, str]:
    """Attach ``image`` to a free loop device; returns an open fd of the device and its path.

    The device clears itself when its last user closes it (``LO_FLAGS_AUTOCLEAR``): the
    world's mount once the caller closes the fd, or the fd alone if the mount never happens.
    Raises OSError where this kernel or ``/dev`` cannot (the caller falls back to
    ``mount -o loop``).
    """
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
        try:
            name = os.fsencode(image)[-63:]
            for _ in range(16):  # another process may take the free device first: EBUSY
                number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
                device = f"/dev/loop{number}"
                fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
                config = _LOOP_CONFIG.pack(
                    backing, 0, 0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR, name, b"", b"", 0, 0
                )
                try:
                    fcntl.ioctl(fd, _LOOP_CONFIGURE, config)
                except OSError as exc:
                    os.close(fd)
                    if exc.errno == errno.EBUSY:
                        continue
                    raise
                return fd, device
            raise OSError(errno.EBUSY, "no free loop device after 16 tries")
        finally:
            os.close(backing)
    finally:
        os.close(control)


def _keeper_pids(init_pid: int) -> list[int]:
    """Host pids of PID 1's children that run the keeper (``sleep``): bubblewrap execs it
    last, so one is there once the world is built."""
    found: list[int] = []
    try:
        with open(f"/proc/{init_pid}/task/{init_pid}/children", "rb") as f:
            children = f.read().split()
    except OSError:
        return found
    for child in children:
        try:
            with open(f"/proc/{int(child)}/cmdline", "rb") as f:
                if f.read() == _KEEPER_CMDLINE:
                    found.append(int(child))
        except (OSError, ValueError):
            pass
    return found


_MAX_INFO_BYTES = 65536


async def _read_info(fd: int) -> dict[str, int] | None:
    """bubblewrap's ``--info-fd`` JSON, or ``None`` if it closed the pipe without one."""
    data = b""
    decoder = json.JSONDecoder()
    while True:
        await anyio.wait_readable(fd)
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if not chunk:
            break
        data += chunk
        if len(data) > _MAX_INFO_BYTES:  # bubblewrap's report is one short JSON object
            return None
        try:
            value, _ = decoder.raw_decode(data.decode("utf-8", "replace").lstrip())
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("child-pid"), int):
            return {k: v for k, v in value.items() if isinstance(v, int)}
    return None
