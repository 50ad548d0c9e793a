"""The ssh sandbox backend: per-rollout directories on a remote host over one SSH connection.

Extra ``[ssh]`` (asyncssh, asyncio-only: under trio creation raises ``AsyncBackendError``).
Every network wait has a deadline, and close kills every process of the sandbox. Isolation is
the remote login's, not a container's. Design and limits: docs/decisions/030-ssh-sandboxes.md.
"""

from __future__ import annotations

import dataclasses
import getpass
import logging
import math
import os
import posixpath
import re
import secrets
import shlex
import stat
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from subprocess import DEVNULL
from typing import Any, Self

import anyio
import anyio.lowlevel

from hermes_async._asynclib import require_asyncio
from hermes_async._cleanup import acquisition_scope, cleanup_scope
from hermes_async._resource import AsyncResource
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.tools.sandbox._container import (
    ContainerExec,
    ContainerSandbox,
    pump_output,
    read_until_exit,
)
from hermes_async.tools.sandbox._sdk import import_sdk
from hermes_async.tools.sandbox.archive import check_tar_members
from hermes_async.tools.sandbox.base import MAX_READ_BYTES, PID_REUSE_SH, _enter_spec_workdir
from hermes_async.tools.sandbox.errors import (
    NotARegularFileError,
    SandboxUnavailableError,
    TransferLimitError,
)
from hermes_async.tools.sandbox.host import TERMINATE_GRACE_SECONDS
from hermes_async.tools.sandbox.output import OutputCapture
from hermes_async.tools.sandbox.processes import SANDBOX_MARKER_ENV
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = ("SshBackend", "SshSandbox", "SshSandboxConfig", "ssh_preflight")

logger = logging.getLogger(__name__)

#: The reference's environment variables, by the config field each one fills when unset.
_SSH_ENV_NAMES: Mapping[str, str] = {
    "host": "TERMINAL_SSH_HOST",
    "user": "TERMINAL_SSH_USER",
    "port": "TERMINAL_SSH_PORT",
    "key_path": "TERMINAL_SSH_KEY",
}

#: ``PATH`` of a command on the remote host (this host's ``PATH`` names this host's directories).
_DEFAULT_REMOTE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Bound of closing the connection (a disconnect message; nothing to wait for remotely).
_CONNECTION_CLOSE_SECONDS = 5.0
#: Bound of closing one channel after its command ended, failed or was cancelled.
_CHANNEL_CLOSE_SECONDS = 5.0
_READ_CHUNK = 65536
_HELPER_OUTPUT_BYTES = 1 << 16
_SAFE_TASK_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_ASYNCIO_ONLY = ("the ssh sandbox backend", "asyncssh")
_REMEDY = "use terminal_backend='local'"

#: ``$1`` root (``~`` and relative paths resolve against the remote home), ``$2`` prefix.
_RESOLVE_ROOT = 'r=$1; case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac; '

_CREATE = _RESOLVE_ROOT + (
    'mkdir -p -- "$r" || exit 1; '
    'd=$(mktemp -d "$r/$2.XXXXXX") || exit 1; d=$(cd -- "$d" && pwd -P) || exit 1; '
    'mkdir -p "$d/work" "$d/home" "$d/tmp" "$d/.exec" "$d/.state/bg" || exit 1; '
    'for t in setsid tar env; do command -v "$t" >/dev/null 2>&1 '
    '|| { echo "the remote host has no $t" >&2; rm -rf -- "$d"; exit 3; }; done; '
    'printf "%s\\n" "$d"'
)

#: The marker a creation's script carries, so a cleanup can find (and stop) it.
_CREATE_MARKER_ENV = "HERMES_ASYNC_CREATE"

#: Remove what a creation with prefix ``$2`` made. The creation's script may still be running
#: (a channel closed by a cancellation does not stop the remote command): kill it by its marker
#: first, then remove, in rounds until no such script was seen (and at least three rounds, for a
#: script whose login shell has not yet exec'd into it).
_REMOVE_PREFIX = _RESOLVE_ROOT + (
    "n=0; while :; do "
    f'f=$(grep -lzx "{_CREATE_MARKER_ENV}=$2" /proc/[0-9]*/environ 2>/dev/null); '
    'for q in $f; do q=${q#/proc/}; kill -KILL "${q%/environ}" 2>/dev/null; done; '
    'for d in "$r/$2".*; do [ -d "$d" ] && rm -rf -- "$d"; done; '
    'n=$((n + 1)); { [ -z "$f" ] && [ "$n" -ge 3 ]; } || [ "$n" -ge 50 ] && break; '
    "sleep 0.05; done; true"
)

#: ``$1`` the sandbox root, ``$2`` its id (the marker's value), ``$3`` the grace in tenths of a
#: second (0: SIGKILL at once). Finds members by recorded session (a pid the kernel gave to
#: another process since is skipped) and by marker, kills them, removes the directory; exits 0
#: only when the directory is gone.
_CLOSE = r"""
root=$1; id=$2; grace=$3
[ -d "$root" ] || exit 0
{reuse}
members() {
    ids=" "
    for f in "$root"/.exec/*.pid "$root"/.state/bg/*/pid; do
        [ -f "$f" ] && read -r p < "$f" && ! reused "$p" "$f" && ids="$ids$p "
    done
    if [ -d /proc/self ]; then
        for s in /proc/[0-9]*/stat; do
            { read -r l < "$s"; } 2>/dev/null || continue
            p=${s#/proc/}; p=${p%/stat}
            r=${l##*) }; set -- $r
            [ "$1" = Z ] && continue
            case "$ids" in *" $4 "*) echo "$p" ;; esac
        done
        grep -lzx "HERMES_ASYNC_SANDBOX=$id" /proc/[0-9]*/environ 2>/dev/null \
            | sed 's,^/proc/,,; s,/environ$,,'
    else
        for p in $ids; do kill -0 "-$p" 2>/dev/null && echo "-$p"; done
    fi
}
# (no `--` after the signal: dash's kill takes it for a pid and refuses the whole call)
signal_all() { for p in $(members); do kill "-$1" "$p" 2>/dev/null; done; }
if [ "$grace" -gt 0 ]; then
    signal_all TERM
    i=0
    while [ "$i" -lt "$grace" ] && [ -n "$(members)" ]; do sleep 0.1; i=$((i + 1)); done
fi
# Done after two empty looks 20 ms apart: a process in the middle of an exec (`setsid cmd`)
# shows no environment, so no marker, for a moment.
n=0; quiet=0
while [ "$quiet" -lt 2 ] && [ "$n" -lt 50 ]; do
    if [ -n "$(members)" ]; then signal_all KILL; quiet=0; sleep 0.1
    else quiet=$((quiet + 1)); [ "$quiet" -lt 2 ] && sleep 0.02; fi
    n=$((n + 1))
done
chmod -R u+rwx -- "$root" 2>/dev/null
rm -rf -- "$root"
[ ! -e "$root" ] || { echo "could not remove $root" >&2; exit 1; }
[ -z "$(members)" ] || { echo "processes survived: $(members | tr '\n' ' ')" >&2; exit 2; }
""".replace("{reuse}", PID_REUSE_SH)


def _import_asyncssh() -> Any:
    with warnings.catch_warnings():
        # cryptography >= 51 deprecates DSA; asyncssh reads its DSA names at import, which
        # warns even when no DSA key is ever used. Only that warning, only from asyncssh.
        warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh\.")
        return import_sdk("asyncssh", backend="ssh", what="asyncssh")


@dataclass(frozen=True, slots=True)
class SshSandboxConfig:
    """How ssh sandboxes are made, and where.

    Attributes:
        host: The remote host (``TERMINAL_SSH_HOST`` when unset; required).
        port: Its SSH port (``TERMINAL_SSH_PORT``, else 22).
        user: The login (``TERMINAL_SSH_USER``, else this process's user name).
        key_path: Private key file (``TERMINAL_SSH_KEY``; unset: asyncssh's defaults). With a
            key given, only that key is offered.
        check_host_key: ``False`` accepts any host key: the explicit, logged opt-out.
        remote_root: Remote directory under which each sandbox gets its own (``/tmp``).
        call_timeout: Deadline of opening a channel and of each short remote step.
        close_timeout: Deadline of the close script (kill everything, remove the directory).
        keepalive_interval_seconds: Three unanswered keepalives drop the connection; ``0``: none.
        max_sessions: The server's ``MaxSessions``: one goes to SFTP, one is spare, the rest
            carry commands.
    """

    host: str | None = None
    port: int | None = None
    user: str | None = None
    key_path: str | None = None
    known_hosts: str | None = None
    check_host_key: bool = True
    remote_root: str = "/tmp"
    connect_timeout: float = 30.0
    call_timeout: float = 60.0
    transfer_timeout: float = 600.0
    default_exec_timeout: float = 180.0
    kill_timeout: float = 30.0
    close_timeout: float = 60.0
    keepalive_interval_seconds: float = 15.0
    max_sessions: int = 10
    path: str = _DEFAULT_REMOTE_PATH
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in (
            "connect_timeout",
            "call_timeout",
            "transfer_timeout",
            "default_exec_timeout",
            "kill_timeout",
            "close_timeout",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ConfigError(f"SshSandboxConfig.{name} must be > 0 seconds, got {value!r}")
        if not self.keepalive_interval_seconds >= 0:
            raise ConfigError(
                "SshSandboxConfig.keepalive_interval_seconds must be >= 0, got "
                f"{self.keepalive_interval_seconds!r}"
            )
        if not (isinstance(self.max_sessions, int) and self.max_sessions >= 2):
            raise ConfigError(
                f"SshSandboxConfig.max_sessions must be an int >= 2 (the server's MaxSessions), "
                f"got {self.max_sessions!r}"
            )
        if self.port is not None and not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise ConfigError(f"SshSandboxConfig.port must be 1..65535, got {self.port!r}")
        if not self.remote_root or "\0" in self.remote_root:
            raise ConfigError(f"SshSandboxConfig.remote_root is invalid: {self.remote_root!r}")

    def resolved(self, environ: Mapping[str, str] | None = None) -> SshSandboxConfig:
        """This config with unset fields from ``TERMINAL_SSH_*``, port 22 and this user by default.

        Raises:
            ConfigError: No host anywhere, or ``TERMINAL_SSH_PORT`` is not a port number.
        """
        environ = os.environ if environ is None else environ
        changes: dict[str, Any] = {}
        for name, variable in _SSH_ENV_NAMES.items():
            value = environ.get(variable)
            if getattr(self, name) is None and value:
                if name == "port":
                    if not value.isdigit() or not 0 < int(value) < 65536:
                        raise ConfigError(f"{variable}={value!r} is not a port number (1..65535)")
                    changes[name] = int(value)
                else:
                    changes[name] = value
        host = changes.get("host", self.host)
        if not host:
            raise ConfigError(
                "terminal_backend='ssh' needs a host: set sandbox_options host=... or "
                "TERMINAL_SSH_HOST (and user/TERMINAL_SSH_USER, key_path/TERMINAL_SSH_KEY)"
            )
        if changes.get("port", self.port) is None:
            changes["port"] = 22
        if changes.get("user", self.user) is None:
            changes["user"] = getpass.getuser()
        return dataclasses.replace(self, **changes) if changes else self

    @property
    def target(self) -> str:
        """``user@host:port`` for messages (no secret in it)."""
        return f"{self.user}@{self.host}:{self.port}"


def _connect_options(config: SshSandboxConfig) -> dict[str, Any]:
    options: dict[str, Any] = {
        "host": config.host,
        "port": config.port,
        "username": config.user,
        "connect_timeout": config.connect_timeout,
        "login_timeout": config.connect_timeout,
        "keepalive_interval": config.keepalive_interval_seconds,
        "keepalive_count_max": 3,
        # No ~/.ssh/config: the settings here are the whole truth (no alias, user or
        # ProxyCommand from a file the operator may not know is read).
        "config": [],
        "password_auth": False,
        "kbdint_auth": False,
    }
    if config.key_path is not None:
        options["client_keys"] = [config.key_path]
        options["agent_path"] = None
    if not config.check_host_key:
        options["known_hosts"] = None
    elif config.known_hosts is not None:
        options["known_hosts"] = config.known_hosts
    return options


async def _connect(config: SshSandboxConfig, task_id: str | None = None) -> Any:
    """Open and authenticate a connection within ``connect_timeout``."""
    asyncssh = _import_asyncssh()
    if not config.check_host_key:
        logger.warning(
            "ssh backend: host-key checking is OFF for %s (check_host_key=False): a machine "
            "in the middle could impersonate it",
            config.target,
        )
    target = config.target
    try:
        with anyio.fail_after(config.connect_timeout + 1):
            return await asyncssh.connect(**_connect_options(config))
    except TimeoutError as exc:
        raise SandboxError(
            f"ssh: {target} did not answer within {config.connect_timeout:g} s; check host and "
            "port (TERMINAL_SSH_HOST / TERMINAL_SSH_PORT) and that sshd runs there, or raise "
            "connect_timeout",
            task_id=task_id,
        ) from exc
    except asyncssh.HostKeyNotVerifiable as exc:
        where = config.known_hosts or "~/.ssh/known_hosts"
        raise SandboxError(
            f"ssh: the host key of {target} is not in {where} ({exc}); add it "
            f"(`ssh-keyscan -p {config.port} {config.host} >> {where}` after checking its "
            "fingerprint), point known_hosts at a file that has it, or opt out with "
            "check_host_key=False",
            task_id=task_id,
        ) from exc
    except asyncssh.PermissionDenied as exc:
        raise SandboxError(
            f"ssh: {target} refused the login ({exc}); check user (TERMINAL_SSH_USER) and "
            "key_path (TERMINAL_SSH_KEY), and that the key is in the remote authorized_keys",
            task_id=task_id,
        ) from exc
    except asyncssh.KeyImportError as exc:
        raise SandboxError(
            f"ssh: cannot load the private key {config.key_path!r} ({exc}); check key_path "
            "(TERMINAL_SSH_KEY): an unencrypted OpenSSH or PEM private key",
            task_id=task_id,
        ) from exc
    except (OSError, asyncssh.Error) as exc:
        raise SandboxError(
            f"ssh: cannot connect to {target}: {type(exc).__name__}: {exc}; check host and port "
            "(TERMINAL_SSH_HOST / TERMINAL_SSH_PORT) and key_path (TERMINAL_SSH_KEY)",
            task_id=task_id,
        ) from exc


class _Link:
    """One SSH connection, its channel cap, its SFTP session and who uses it."""

    def __init__(self, conn: Any, config: SshSandboxConfig) -> None:
        self.conn = conn
        self.config = config
        # One slot is the SFTP session's; one is spare for a session the server frees a moment
        # after our side saw its channel close.
        self._cap = max(1, config.max_sessions - 2)
        self.channels = anyio.CapacityLimiter(self._cap)
        # Channels closed before their command ended, or whose close overran its bound: the
        # server still counts each against MaxSessions (OpenSSH keeps a session until its
        # command exits), so each keeps its slot until it is seen closed.
        self._stuck: list[Any] = []
        self.users = 0
        self._sftp: Any = None
        self._sftp_lock = anyio.Lock()

    @property
    def closed(self) -> bool:
        return bool(self.conn.is_closed())

    async def sftp(self) -> Any:
        """The connection's SFTP session, started on first use (bounded)."""
        async with self._sftp_lock:
            if self._sftp is None:
                self._sftp = await _open_session(
                    self, self.conn.start_sftp_client, self.config.call_timeout
                )
            return self._sftp

    def keep_counted(self, process: Any) -> None:
        """``process``'s channel is closing without us waiting for it: it keeps its slot."""
        self._stuck.append(process)
        self._resize()

    async def reclaim(self) -> None:
        """Give back the slots of kept channels that have closed since."""
        if not self._stuck:
            return
        still_open = []
        for process in self._stuck:
            # A zero-deadline wait: it completes without suspending only if already closed.
            with anyio.move_on_after(0) as probe:
                await process.channel.wait_closed()
            if probe.cancelled_caught:
                still_open.append(process)
        self._stuck = still_open
        self._resize()

    def _resize(self) -> None:
        # At least one slot: past that, the open is refused and retried (_open_channel).
        self.channels.total_tokens = max(1, self._cap - len(self._stuck))

    @property
    def stuck_channels(self) -> int:
        """Kept channels (see :meth:`keep_counted`) still open, each holding a slot."""
        return len(self._stuck)

    async def close(self) -> None:
        """Close the connection (its channels with it), bounded; never raises."""
        with cleanup_scope(
            f"close the SSH connection to {self.config.target}",
            _CONNECTION_CLOSE_SECONDS,
            reason="its last sandbox closed",
            log=logger,
        ):
            try:
                self.conn.close()
                await self.conn.wait_closed()
            except Exception as exc:  # closing is cleanup: it must not mask the outcome
                logger.debug("closing the SSH connection to %s: %s", self.config.target, exc)


def _lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection itself is gone (not just one channel)."""
    return any(
        cls.__name__
        in ("ConnectionLost", "DisconnectError", "SFTPConnectionLost", "SFTPNoConnection")
        for cls in type(exc).__mro__
    ) or isinstance(exc, ConnectionError)


async def _run_channel(
    link: _Link,
    command: str,
    write_out: Callable[[bytes], Awaitable[None]],
    err: OutputCapture,
    *,
    call_timeout: float,
    on_open: Callable[[Any], None] | None = None,
    on_close: Callable[[Any], None] | None = None,
) -> int | None:
    """Run ``command`` on its own channel and return its exit code (``None`` if none came).

    stdout goes to ``write_out``, stderr to ``err``; signal ``n`` is ``128 + n``.

    **Cancellation**: the channel is closed without waiting and keeps its slot until it has
    closed; the caller kills the remote group; the cancellation propagates.
    """
    await link.reclaim()
    async with link.channels:
        process = await _open_channel(link, command, call_timeout)
        if on_open is not None:
            on_open(process)
        ended = False
        try:

            async def read_streams() -> None:
                await pump_output(_chunks(process.stdout), _chunks(process.stderr), write_out, err)

            async def poll_exit() -> int | None:
                return _code(process.returncode)

            code = await read_until_exit(read_streams, poll_exit)
            if code is None:
                # The streams ended; the exit status follows at once (or never: a lost link).
                with anyio.move_on_after(call_timeout):
                    await process.wait_closed()
                code = _code(process.returncode)
            ended = True
            return code
        finally:
            try:
                process.close()
            except Exception as exc:  # cleanup: the outcome above is what counts
                logger.debug("closing an SSH channel: %s", exc)
            if ended:
                # The command is done: its channel closes at once (bounded all the same).
                with cleanup_scope(
                    "close an SSH channel", _CHANNEL_CLOSE_SECONDS, log=logger
                ) as closing:
                    try:
                        await process.wait_closed()
                    except Exception as exc:  # cleanup: the outcome above is what counts
                        logger.debug("closing an SSH channel: %s", exc)
                    await link.reclaim()
                if closing.overran:
                    link.keep_counted(process)
            else:
                link.keep_counted(process)
            if on_close is not None:
                on_close(process)


#: SSH channel-open failure codes that mean "not now": connect failed is what OpenSSH answers
#: a session past its MaxSessions ("open failed", checked against OpenSSH 9.2); administratively
#: prohibited and resource shortage are what other servers use for the same.
_RETRY_OPEN_CODES = (1, 2, 4)


async def _chunks(reader: Any) -> AsyncIterator[bytes]:
    """An asyncssh reader's data in chunks (its own ``async for`` yields lines)."""
    while chunk := await reader.read(_READ_CHUNK):
        yield chunk


async def _open_channel(link: _Link, command: str, call_timeout: float) -> Any:
    """Open a session channel running ``command`` (see :func:`_open_session`)."""
    return await _open_session(
        link,
        lambda: link.conn.create_process(command, encoding=None, stdin=DEVNULL),
        call_timeout,
    )


async def _open_session(
    link: _Link, open_session: Callable[[], Awaitable[Any]], call_timeout: float
) -> Any:
    """``open_session()``, retried within ``call_timeout`` while the server has no session slot."""
    delay = 0.02
    refused = 0
    try:
        with anyio.fail_after(call_timeout):
            while True:
                try:
                    return await open_session()
                except Exception as exc:
                    code = getattr(exc, "code", None)
                    if code not in _RETRY_OPEN_CODES or link.closed:
                        raise
                    refused += 1
                    logger.debug(
                        "ssh: %s refused a channel (code %s: %s); retrying in %g s",
                        link.config.target,
                        code,
                        getattr(exc, "reason", exc),
                        delay,
                    )
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.5)
    except TimeoutError:
        if not refused:
            raise
        raise TimeoutError(
            f"ssh: {link.config.target} refused a channel {refused} times within "
            f"{call_timeout:g} s (its MaxSessions is full: is max_sessions="
            f"{link.config.max_sessions} what the server allows?)"
        ) from None


def _code(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


async def _remote_sh(
    link: _Link,
    script: str,
    *args: str,
    timeout: float,
    output_limit: int = _HELPER_OUTPUT_BYTES,
    marker: tuple[str, str] | None = None,
) -> tuple[int | None, str, str]:
    """Run a short ``sh`` script of ours within ``timeout``: (exit code, stdout, stderr)."""
    out, err = OutputCapture(output_limit), OutputCapture(output_limit)

    async def collect(chunk: bytes) -> None:
        out.feed(chunk)

    argv = ["/bin/sh", "-c", script, "sh", *args]
    if marker is not None:
        argv = ["exec", "env", f"{marker[0]}={marker[1]}", *argv]
    command = shlex.join(argv)
    with anyio.fail_after(timeout):
        code = await _run_channel(link, command, collect, err, call_timeout=timeout)
    return code, out.text(), err.text()


class SshBackend(AsyncResource):
    """Creates :class:`SshSandbox` es over one shared connection: a ``SandboxManager`` factory.

    ``async with SshBackend(config) as backend:`` keeps the connection open for the block.

    Raises:
        ConfigError: No host is configured, or an invalid option.
    """

    def __init__(self, config: SshSandboxConfig | None = None) -> None:
        self.config = (config or SshSandboxConfig()).resolved()
        self._link: _Link | None = None
        self._lock: anyio.Lock | None = None
        self._held: _Link | None = None
        self.connections_opened = 0

    def __repr__(self) -> str:
        return f"SshBackend({self.config.target}, remote_root={self.config.remote_root!r})"

    async def __aenter__(self) -> Self:
        """Open the connection and keep it until the block ends.

        **Cancellation**: nothing is held if cancelled while connecting.
        """
        require_asyncio(*_ASYNCIO_ONLY, remedy=_REMEDY)
        self._held = await self.acquire()
        return self

    async def aclose(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            await self.release(held)

    async def acquire(self, task_id: str | None = None) -> _Link:
        """The live connection (opened if there is none or it died), with one more user.

        **Cancellation**: a connection being opened is abandoned (asyncssh closes it).
        """
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            link = self._link
            if link is None or link.closed:
                conn = await _connect(self.config, task_id)
                link = self._link = _Link(conn, self.config)
                self.connections_opened += 1
            link.users += 1
            return link

    async def release(self, link: _Link) -> None:
        """One user fewer; the last one closes the connection (bounded)."""
        link.users -= 1
        if link.users <= 0:
            if self._link is link:
                self._link = None
            await link.close()

    async def __call__(self, task_id: str, spec: SandboxSpec | None = None) -> SshSandbox:
        """Make the sandbox directory for ``task_id`` on the remote host.

        A spec's ``env``, ``workdir`` and ``exec_timeout`` apply; images and limits are ignored.

        Raises:
            AsyncBackendError: Not running under asyncio.
            ConfigError: asyncssh is not installed.
            SandboxError: The host is unreachable or refuses, or the directory cannot be made.

        **Cancellation**: the directory step finishes, what was made is removed (both shielded,
        bounded), then the cancellation propagates.
        """
        require_asyncio(*_ASYNCIO_ONLY, remedy=_REMEDY)
        cfg = self.config
        link = await self.acquire(task_id)
        safe = _SAFE_TASK_CHARS.sub("_", task_id)[:40] or "task"
        prefix = f"hermes-sbx-{safe}-{secrets.token_hex(4)}"
        root = ""
        try:
            # An acquisition, not a cleanup, and not to be cut in half (as host.start_process):
            # a channel closed by a cancellation does not stop the remote script, which could
            # then make the directory after any cleanup ran. Shielded, so a cancellation lands
            # once its path is known (the script takes milliseconds; bounded by the deadline).
            with acquisition_scope(cfg.call_timeout):
                code, out, err = await _remote_sh(
                    link,
                    _CREATE,
                    cfg.remote_root,
                    prefix,
                    timeout=cfg.call_timeout,
                    marker=(_CREATE_MARKER_ENV, prefix),
                )
            root = out.strip().splitlines()[-1] if out.strip() else ""
            await anyio.lowlevel.checkpoint()  # a cancellation that came meanwhile lands here
            if code != 0 or not posixpath.isabs(root):
                raise SandboxError(
                    f"ssh: cannot make a sandbox directory under {cfg.remote_root!r} on "
                    f"{cfg.target} (exit {code}): {err.strip()[:300]!r}; check remote_root",
                    task_id=task_id,
                )
            env = dict(cfg.env)
            if spec is not None:
                env.update(spec.env)
            sandbox = SshSandbox(
                task_id,
                self,
                link,
                root,
                cfg,
                env=env,
                default_exec_timeout=(
                    spec.exec_timeout
                    if spec is not None and spec.exec_timeout
                    else cfg.default_exec_timeout
                ),
            )
            await sandbox._write_env_file()
            if spec is not None and spec.workdir is not None:
                await _enter_spec_workdir(sandbox, spec.workdir)
        except BaseException:
            with cleanup_scope(
                f"remove the half-made ssh sandbox {prefix} on {cfg.target}",
                cfg.call_timeout,
                reason="sandbox creation failed or was cancelled",
                log=logger,
            ):
                try:
                    if link.closed:
                        logger.warning(
                            "ssh: %s may be left on %s (connection lost)", prefix, cfg.target
                        )
                    elif posixpath.isabs(root):
                        await _remote_sh(link, 'rm -rf -- "$1"', root, timeout=cfg.call_timeout)
                    else:  # the script failed or overran: stop it, remove what it made
                        await _remote_sh(
                            link,
                            _REMOVE_PREFIX,
                            cfg.remote_root,
                            prefix,
                            timeout=cfg.call_timeout,
                        )
                except Exception as exc:  # cleanup: the creation's own error is what counts
                    logger.warning("could not remove %s on %s: %s", prefix, cfg.target, exc)
                await self.release(link)
            raise
        return sandbox


class SshSandbox(ContainerSandbox):
    """One rollout's directory on the remote host. Create it with :class:`SshBackend`.

    Attributes:
        root: The sandbox's directory on the remote host.
        sandbox_id: Its name, also ``HERMES_ASYNC_SANDBOX`` in its processes.
        env: The environment every command starts with.
    """

    kind = "ssh"

    def __init__(
        self,
        task_id: str,
        backend: SshBackend,
        link: _Link,
        root: str,
        config: SshSandboxConfig,
        *,
        env: Mapping[str, str],
        default_exec_timeout: float,
    ) -> None:
        super().__init__(
            task_id,
            f"{root}/work",
            home=f"{root}/home",
            default_exec_timeout=default_exec_timeout,
            kill_timeout=config.kill_timeout,
            close_timeout=config.close_timeout,
        )
        self.root = root
        self.env_file = f"{root}/.env.sh"
        self.exec_dir = f"{root}/.exec"
        self.background_state_dir = f"{root}/.state/bg"
        self.sandbox_id = posixpath.basename(root)
        self.config = config
        self.env: dict[str, str] = {
            "PATH": config.path,
            "HOME": self.home,
            "TMPDIR": f"{root}/tmp",
            "USER": str(config.user),
            "LOGNAME": str(config.user),
            **env,
            SANDBOX_MARKER_ENV: self.sandbox_id,
        }
        self._backend = backend
        self._link = link
        self._channels: set[Any] = set()

    async def _write_env_file(self) -> None:
        lines = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.env.items())
        await self._sftp_write(self.env_file, lines.encode(), make_parents=False)

    def __repr__(self) -> str:
        return f"SshSandbox({self.task_id!r}, {self.label})"

    @property
    def label(self) -> str:
        """``user@host:port:/root`` (for log lines)."""
        return f"{self.config.target}:{self.root}"

    # ----------------------------------------------------------------- errors

    def _unavailable(self, what: str, exc: BaseException) -> SandboxUnavailableError:
        return self._mark_gone(
            f"the SSH connection to {self.config.target} was lost during {what}: "
            f"{type(exc).__name__}: {exc}",
            reason="unreachable",
        )

    def _live(self, what: str) -> _Link:
        self._check_open()
        if self._link.closed:
            raise self._unavailable(what, ConnectionError("the connection is closed"))
        return self._link

    def _translate(self, what: str, exc: Exception) -> Exception:
        """A transport failure as the error the caller must see."""
        if self._link.closed or _lost(exc):
            return self._unavailable(what, exc)
        if isinstance(exc, TimeoutError):
            detail = f": {exc}" if str(exc) else ""
            return SandboxError(
                f"ssh: {what} on {self.config.target} did not finish in time{detail}",
                task_id=self.task_id,
            )
        return SandboxError(
            f"ssh: {what} on {self.config.target} failed: {type(exc).__name__}: {exc}",
            task_id=self.task_id,
        )

    # ----------------------------------------------------------------- exec hooks

    async def _run_argv(self, run: ContainerExec) -> int:
        link = self._live("a command")
        # The sandbox's own variables come from its env file (never on a command line: asyncssh
        # logs every command at INFO, and the remote `ps` shows it); a call's extra `env` and
        # the marker follow it, so they win.
        extra = [f"{k}={v}" for k, v in (run.env or {}).items()]
        command = shlex.join(
            [
                "exec",
                "env",
                "-i",
                "/bin/sh",
                "-c",
                '. "$0" || exit 125; exec env "$@"',
                self.env_file,
                *extra,
                f"{SANDBOX_MARKER_ENV}={self.sandbox_id}",
                *run.argv,
            ]
        )
        # What the caller's sink raised propagates as itself; everything else is the transport's.
        sink_failures: list[Exception] = []

        async def deliver(chunk: bytes) -> None:
            try:
                await run.write_out(chunk)
            except Exception as exc:
                sink_failures.append(exc)
                raise

        try:
            code = await _run_channel(
                link,
                command,
                deliver,
                run.err,
                call_timeout=self.config.call_timeout,
                on_open=self._channels.add,
                on_close=self._channels.discard,
            )
        except Exception as exc:
            if exc in sink_failures:
                raise
            raise self._translate("a command", exc) from exc
        if code is None:
            if link.closed:
                raise self._unavailable("a command", ConnectionError("no exit status came"))
            raise SandboxError(
                f"ssh: a command on {self.config.target} ended without an exit status",
                task_id=self.task_id,
            )
        return code

    async def _stage_file(self, path: str, data: bytes) -> None:
        await self._sftp_write(path, data, make_parents=True)

    # ----------------------------------------------------------------- files (SFTP)

    async def _sftp(self) -> Any:
        link = self._live("an SFTP session")
        try:
            return await link.sftp()
        except Exception as exc:
            raise self._translate("starting the SFTP session", exc) from exc

    async def _sftp_write(self, path: str, data: bytes, *, make_parents: bool) -> None:
        asyncssh = _import_asyncssh()
        sftp = await self._sftp()
        try:
            with anyio.fail_after(self.config.transfer_timeout):
                if make_parents:
                    await sftp.makedirs(posixpath.dirname(path), exist_ok=True)
                handle = await sftp.open(path, "wb")
                try:
                    await handle.write(data)
                finally:
                    with cleanup_scope("close an SFTP file", _CHANNEL_CLOSE_SECONDS, log=logger):
                        await handle.close()
        except asyncssh.SFTPError as exc:
            if self._link.closed or _lost(exc):
                raise self._unavailable(f"a write of {path!r}", exc) from exc
            raise OSError(f"cannot write {path!r} in the sandbox: {exc.reason}") from exc
        except Exception as exc:
            raise self._translate(f"a write of {path!r}", exc) from exc

    async def read_bytes(self, path: str) -> bytes:
        """Return the contents of ``path`` over SFTP (at most :data:`MAX_READ_BYTES`).

        Raises:
            FileNotFoundError: ``path`` does not exist or is not a regular file.
            TransferLimitError: It is larger than :data:`MAX_READ_BYTES`.

        **Cancellation**: the remote file handle is closed (bounded).
        """
        self._check_open()
        asyncssh = _import_asyncssh()
        target = self._resolve(path)
        sftp = await self._sftp()
        try:
            with anyio.fail_after(self.config.transfer_timeout):
                attrs = await sftp.stat(target)
                if attrs.permissions is None or not stat.S_ISREG(attrs.permissions):
                    raise NotARegularFileError(f"not a regular file in the sandbox: {path!r}")
                if (attrs.size or 0) > MAX_READ_BYTES:
                    raise TransferLimitError(
                        f"file {path!r}", limit=MAX_READ_BYTES, size=int(attrs.size)
                    )
                handle = await sftp.open(target, "rb")
                try:
                    data = await handle.read(MAX_READ_BYTES + 1)
                finally:
                    with cleanup_scope("close an SFTP file", _CHANNEL_CLOSE_SECONDS, log=logger):
                        await handle.close()
        except asyncssh.SFTPNoSuchFile as exc:
            raise FileNotFoundError(f"no such file in the sandbox: {path!r}") from exc
        except asyncssh.SFTPError as exc:
            if self._link.closed or _lost(exc):
                raise self._unavailable(f"a read of {path!r}", exc) from exc
            raise OSError(f"cannot read {path!r} in the sandbox: {exc.reason}") from exc
        except (FileNotFoundError, TransferLimitError):
            raise
        except Exception as exc:
            raise self._translate(f"a read of {path!r}", exc) from exc
        if len(data) > MAX_READ_BYTES:
            raise TransferLimitError(f"file {path!r}", limit=MAX_READ_BYTES)
        return bytes(data)

    async def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` over SFTP, creating parent directories.

        **Cancellation**: the file may be partly written; its handle is closed (bounded).
        """
        self._check_open()
        await self._sftp_write(self._resolve(path), data, make_parents=True)

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        """Validate, upload and extract a tar archive into ``dest_dir`` (created).

        **Cancellation**: the archive may be partly extracted; the staged copy goes with the sandbox.
        """
        self._check_open()
        check_tar_members(tar_data)
        dest = self._resolve(dest_dir)
        staged = f"{self.exec_dir}/{secrets.token_hex(8)}.tar"
        await self._sftp_write(staged, tar_data, make_parents=False)
        code, err = await self._helper(
            [
                "/bin/sh",
                "-c",
                'mkdir -p -- "$1" && tar -x --no-same-owner -f "$2" -C "$1"; rc=$?; '
                'rm -f -- "$2"; exit $rc',
                "sh",
                dest,
                staged,
            ],
            self.config.call_timeout,
        )
        if code != 0:
            raise OSError(f"cannot extract archive into {dest_dir!r}: {err.strip()[:300]}")

    # ----------------------------------------------------------------- close

    async def aclose(self, interrupted: bool = False) -> None:
        """Kill every process of the sandbox and remove its directory; idempotent.

        SIGTERM, a grace, SIGKILL (at once if ``interrupted``). A dead connection is replaced for
        the cleanup unless ``interrupted``; what cannot be cleaned is logged.

        **Cancellation**: not shielded here (the release's owner does it); each step is bounded.
        """
        if self._closed:
            return
        self._closed = True
        link = self._link
        extra: _Link | None = None
        try:
            if link.closed and not interrupted:
                extra = await self._backend.acquire(self.task_id)
            target = extra or link
            if target.closed:
                logger.warning(
                    "ssh sandbox %s: the connection is gone; its directory and any processes "
                    "are left on the remote host",
                    self.label,
                )
                return
            grace = "0" if interrupted else str(int(TERMINATE_GRACE_SECONDS * 10))
            code, _, err = await _remote_sh(
                target,
                _CLOSE,
                self.root,
                self.sandbox_id,
                grace,
                timeout=self.config.close_timeout,
            )
            if code != 0:
                logger.warning("ssh sandbox %s: close incomplete: %s", self.label, err.strip())
        except Exception as exc:  # close must not raise for a remote problem: log where
            logger.warning(
                "could not clean up ssh sandbox %s (its directory and processes may be left "
                "there): %s",
                self.label,
                exc,
            )
        finally:
            for process in list(self._channels):
                try:
                    process.close()
                except Exception as exc:  # already closing with its connection
                    logger.debug("closing a channel of %s: %s", self.label, exc)
            if extra is not None:
                await self._backend.release(extra)
            await self._backend.release(link)


async def ssh_preflight(**options: Any) -> None:
    """Connect (bounded) and check the remote host has what sandboxes need.

    Raises:
        AsyncBackendError: Not running under asyncio.
        ConfigError: No host, an invalid option, or asyncssh is missing.
        SandboxError: Unreachable, refused, an unverified host key, or missing tools.

    **Cancellation**: the connection is closed.
    """
    require_asyncio(*_ASYNCIO_ONLY, remedy=_REMEDY)
    names = {f.name for f in dataclasses.fields(SshSandboxConfig)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)} for terminal_backend='ssh'; "
            f"valid: {', '.join(sorted(names))}"
        )
    config = SshSandboxConfig(**options).resolved()
    _import_asyncssh()
    try:
        conn = await _connect(config)
    except SandboxError as exc:
        raise SandboxError(f"terminal_backend='ssh': {exc.message}") from exc
    link = _Link(conn, config)
    try:
        code, _, err = await _remote_sh(
            link,
            'for t in setsid mktemp tar env; do command -v "$t" >/dev/null 2>&1 || '
            '{ echo "missing: $t" >&2; exit 3; }; done',
            timeout=config.call_timeout,
        )
    except TimeoutError as exc:
        raise SandboxError(
            f"terminal_backend='ssh': {config.target} accepted the login but did not run a "
            f"command within {config.call_timeout:g} s"
        ) from exc
    finally:
        await link.close()
    if code != 0:
        raise SandboxError(
            f"terminal_backend='ssh': {config.target} cannot host sandboxes: {err.strip()}; "
            "install util-linux (setsid), coreutils (mktemp, env) and tar there"
        )
