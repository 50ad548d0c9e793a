"""What the remote-API backends (E2B, Daytona) share: a driver seam, exec, creation, the reaper.

Each backend wraps its SDK in a :class:`RemoteDriver` and a :class:`RemoteClient`; the rest is
here. A create call is shielded until the sandbox's id is known, and every sandbox carries
this run's labels so the reaper can delete leftovers. Design:
docs/decisions/032-remote-api-sandboxes.md.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import shlex
import uuid
from abc import abstractmethod
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import anyio
import anyio.lowlevel

from hermes_async._asynclib import require_asyncio
from hermes_async._checks import ABSOLUTE_PATH, AT_LEAST_ONE, NON_EMPTY_STRING, check_fields
from hermes_async._cleanup import acquisition_scope, bounded_cleanup, cleanup_scope
from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox._container import (
    EXEC_DIR,
    EXEC_WRAPPER,
    ContainerExec,
)
from hermes_async.tools.sandbox._sdk import error_named
from hermes_async.tools.sandbox._staged import StagedTransferSandbox
from hermes_async.tools.sandbox.base import (
    TIMEOUT_EXIT_CODE,
    ByteSink,
    ExecRequest,
    ExecResult,
    _deliver_whole,
    small_int,
)
from hermes_async.tools.sandbox.errors import (
    NotARegularFileError,
    SandboxUnavailableError,
    TransferLimitError,
)
from hermes_async.tools.sandbox.modal import (
    CreationRateLimiter,
    _check_cloud_fields,
    _cloud_config_for,
)
from hermes_async.tools.sandbox.output import OutputCapture
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "HERMES_LABEL",
    "RUN_LABEL",
    "TASK_LABEL",
    "RemoteBackend",
    "RemoteClient",
    "RemoteDriver",
    "RemoteSandboxConfig",
    "SdkErrors",
    "remote_config_for",
)

logger = logging.getLogger("hermes_async.tools.sandbox.remote")

_T = TypeVar("_T")
_C = TypeVar("_C", bound="RemoteSandboxConfig")

#: The fixed label every sandbox this project creates carries (value ``"1"``).
HERMES_LABEL = "hermes-async"
#: The label holding the creating factory's run id.
RUN_LABEL = "hermes-async-run"
#: The label holding the task id (a rollout) the sandbox was made for.
TASK_LABEL = "hermes-async-task"

_RESULT_MARK = "HERMES-EXEC-RESULT"
_SEP_MARK = "HERMES-EXEC-SEP"
_END_MARK = "HERMES-EXEC-END"

#: Exit codes of the file-check script: missing / not a regular file / too large.
_MISSING, _NOT_REGULAR, _TOO_LARGE = 66, 68, 67

# The outer script: `sh -c RUN hermes-run WRAPPER ID LIMIT CWD STDIN COMMAND`. It runs the
# Docker/Modal wrapper with both streams in files, then prints one result block (rc, the full
# sizes, then base64 of each stream capped head + tail to LIMIT) and removes the files. It
# always exits 0 so an SDK that raises on a non-zero exit (E2B) hands the block back.
_RUN_SCRIPT = rf"""
w=$1; id=$2; lim=$3; dir=$4; in=$5; cmd=$6
d={EXEC_DIR}; mkdir -p "$d" 2>/dev/null
o="$d/$id.out"; e="$d/$id.err"
sh -c "$w" hermes-exec "$id" "$dir" "$in" "$cmd" >"$o" 2>"$e" </dev/null
rc=$?
emit() {{
  n=$(wc -c <"$1" 2>/dev/null || echo 0); n=$((n))
  if [ "$n" -gt "$lim" ]; then h=$((lim / 2)); t=$((lim - h))
    {{ head -c "$h" "$1"; if [ "$t" -gt 0 ]; then tail -c "$t" "$1"; fi; }} | base64
  else base64 <"$1"; fi
}}
no=$(wc -c <"$o" 2>/dev/null || echo 0); ne=$(wc -c <"$e" 2>/dev/null || echo 0)
printf '\n{_RESULT_MARK} %s %s %s\n' "$rc" $((no)) $((ne))
emit "$o"; echo {_SEP_MARK}; emit "$e"; echo {_END_MARK}
rm -f "$o" "$e"
exit 0
"""

# `sh -c CHECK sh PATH CAP`: what kind of file PATH is, and its size (printed).
_CHECK_FILE = (
    f'[ -e "$1" ] || exit {_MISSING}; [ -f "$1" ] || exit {_NOT_REGULAR}; '
    's=$(stat -c %s -- "$1" 2>/dev/null || wc -c < "$1"); s=$((s)); echo "$s"; '
    f'if [ "$2" -ge 0 ] && [ "$s" -gt "$2" ]; then exit {_TOO_LARGE}; fi; exit 0'
)


class RemoteDriver(Protocol):
    """One remote sandbox as the SDK exposes it: run, read, write, delete.

    Methods raise ``SandboxUnavailableError`` when the sandbox is gone, ``SandboxError`` for other
    SDK failures. The caller bounds each call; ``timeout`` is the SDK's own backstop.
    """

    @property
    def sandbox_id(self) -> str: ...

    async def run(self, command: str, *, env: Mapping[str, str] | None, timeout: float) -> str:
        """Run ``command`` through the sandbox's shell; return its standard output as text."""
        ...

    async def read(self, path: str) -> bytes:
        """The bytes of the absolute ``path``."""
        ...

    async def write(self, path: str, data: bytes) -> None:
        """Write ``data`` to the absolute ``path``, creating parents."""
        ...

    async def delete(self) -> None:
        """Delete the sandbox (a sandbox already gone is not an error)."""
        ...


class RemoteClient(Protocol):
    """A provider's control plane as one factory uses it: create, list by labels, delete."""

    async def create(self, labels: Mapping[str, str]) -> RemoteDriver:
        """Create a sandbox carrying ``labels``; return it once it accepts commands."""
        ...

    async def list_ids(self, labels: Mapping[str, str]) -> list[tuple[str, dict[str, str]]]:
        """``(id, labels)`` of every live sandbox carrying all of ``labels``."""
        ...

    async def delete_id(self, sandbox_id: str) -> None:
        """Delete sandbox ``sandbox_id`` (already gone is not an error)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RemoteSandboxConfig:
    """The settings every remote backend shares (each backend's config adds its own).

    Attributes:
        env: Variables set in the sandbox at creation (nothing from the host is forwarded).
        sandbox_lifetime_seconds: The provider's hard lifetime of a sandbox.
        create_timeout: Deadline of one creation (a cancellation waits at most this long).
        call_timeout: Deadline of every other API call (file transfer, kill).
        reap_timeout: Deadline of one reaper sweep (list + deletes).
        reap_on_start: Sweep this run's leftovers at the factory's first use.
    """

    workdir: str = "/home/user"
    home: str = "/home/user"
    cpus: float = 1.0
    memory_mb: int = 2048
    block_network: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    sandbox_lifetime_seconds: int = 3600
    create_timeout: float = 120.0
    call_timeout: float = 60.0
    delete_timeout: float = 30.0
    reap_timeout: float = 60.0
    default_exec_timeout: float = 180.0
    max_creates_per_second: float = 4.0
    max_concurrent_creates: int = 16
    reap_on_start: bool = True

    #: The subclass's field naming what sandboxes are built from (E2B's ``template``,
    #: Daytona's ``image``): checked non-empty with the rest, and set from a spec's ``image``
    #: (:func:`remote_config_for`). Every subclass sets it.
    image_field: ClassVar[str]

    def __post_init__(self) -> None:
        check_fields(self, ("workdir", "home"), ABSOLUTE_PATH)
        _check_cloud_fields(self, "delete_timeout", "reap_timeout")
        check_fields(self, ("memory_mb",), AT_LEAST_ONE)
        check_fields(self, (self.image_field,), NON_EMPTY_STRING)


@dataclass(frozen=True, slots=True)
class _ReapReport:
    """What one reaper sweep did: ids found, deleted, failed, and skipped (not this run's)."""

    found: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SdkErrors:
    """How one provider's SDK names its failures (by class name, see :func:`error_named`)."""

    kind: str
    gone: tuple[str, ...]
    gone_words: str
    auth: str
    rate_limit: str
    file_missing: str
    timeout: str
    hint: str

    def translate(self, what: str, exc: Exception, sandbox_id: str | None) -> Exception:
        """An SDK failure as this package's error; "gone" needs a ``sandbox_id``."""
        if error_named(exc, *self.gone) and sandbox_id is not None:
            return SandboxUnavailableError(
                f"{self.kind} reports sandbox {sandbox_id} {self.gone_words} during {what}",
                reason="unreachable",
                backend=self.kind,
            )
        if error_named(exc, self.auth):
            return SandboxError(
                f"{self.kind} refused {what}: not authenticated ({exc}); {self.hint}"
            )
        if error_named(exc, self.rate_limit):
            return SandboxError(
                f"{self.kind} rate-limited {what} ({exc}); lower max_creates_per_second"
            )
        return SandboxError(f"{self.kind} failed {what}: {type(exc).__name__}: {exc}")

    async def call(self, what: str, awaitable: Awaitable[_T], sandbox_id: str | None) -> _T:
        """Await one SDK call, its failure translated (:meth:`translate`)."""
        try:
            return await awaitable
        except Exception as exc:
            raise self.translate(what, exc, sandbox_id) from exc

    async def create(self, what: str, awaitable: Awaitable[_T]) -> _T:
        """Await a create call: the SDK's timeout as ``TimeoutError``, other failures translated."""
        try:
            return await awaitable
        except Exception as exc:
            if error_named(exc, self.timeout):
                raise TimeoutError(f"{self.kind} create timed out: {exc}") from exc
            raise self.translate(what, exc, None) from exc

    async def read(self, path: str, awaitable: Awaitable[Any], sandbox_id: str) -> bytes:
        """Await a file download: a missing file as ``FileNotFoundError``."""
        try:
            data = await awaitable
        except Exception as exc:
            if error_named(exc, self.file_missing):
                raise FileNotFoundError(f"no such file in the sandbox: {path}") from exc
            raise self.translate(f"a read of {path}", exc, sandbox_id) from exc
        return bytes(data)

    async def delete(self, what: str, awaitable: Awaitable[object]) -> None:
        """Await a delete: a sandbox already gone counts as deleted."""
        try:
            await awaitable
        except Exception as exc:
            if error_named(exc, *self.gone):
                return
            raise self.translate(what, exc, None) from exc


def remote_config_for(config: _C, spec: SandboxSpec | None, *, name: str) -> _C:
    """``config`` with a per-item spec applied.

    Raises:
        ConfigError: The spec asks for a local build (``build_context`` without an image).
    """
    return _cloud_config_for(
        config,
        spec,
        image_field=config.image_field,
        name=name,
        publish="publish it (a registry image, or an E2B template)",
    )


async def _bounded(what: str, awaitable: Awaitable[_T], timeout: float, task_id: str | None) -> _T:
    try:
        with anyio.fail_after(timeout):
            return await awaitable
    except TimeoutError as exc:
        raise SandboxError(f"{what} did not answer within {timeout:g} s", task_id=task_id) from exc


def _decode(lines: list[str]) -> bytes:
    try:
        return base64.b64decode("".join(lines), validate=False)
    except (binascii.Error, ValueError) as exc:
        raise SandboxError(f"a remote command's result block is not base64: {exc}") from exc


def _capture(data: bytes, full_size: int, limit: int) -> OutputCapture:
    capture = OutputCapture(limit)
    capture.feed(data)
    # The sandbox sent head + tail already; count what it dropped from the middle.
    capture.dropped += max(0, full_size - len(data))
    return capture


def parse_result(stdout: str) -> tuple[int, int, int, bytes, bytes] | None:
    """``(rc, out_size, err_size, out_kept, err_kept)`` from a result block, or ``None``."""
    lines = stdout.splitlines()
    start = None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(_RESULT_MARK + " "):
            start = i
            break
    if start is None:
        return None
    fields = lines[start].split()
    try:
        rc, n_out, n_err = int(fields[1]), int(fields[2]), int(fields[3])
        sep = lines.index(_SEP_MARK, start + 1)
        end = lines.index(_END_MARK, sep + 1)
    except (IndexError, ValueError):
        return None
    return rc, n_out, n_err, _decode(lines[start + 1 : sep]), _decode(lines[sep + 1 : end])


class _RemoteSandbox(StagedTransferSandbox):
    """One remote sandbox over a :class:`RemoteDriver`; created by a :class:`RemoteBackend`."""

    kind = "remote"

    def __init__(
        self,
        task_id: str,
        driver: RemoteDriver,
        config: RemoteSandboxConfig,
        *,
        kind: str,
        on_close: RemoteBackend[Any] | None = None,
    ) -> None:
        super().__init__(
            task_id,
            config.workdir,
            home=config.home,
            default_exec_timeout=config.default_exec_timeout,
            kill_timeout=config.call_timeout,
            close_timeout=config.delete_timeout,
        )
        self.kind = kind
        self.config = config
        self._driver = driver
        self._backend = on_close

    @property
    def sandbox_id(self) -> str:
        return self._driver.sandbox_id

    @property
    def label(self) -> str:
        return self.sandbox_id

    async def _call(self, what: str, awaitable: Awaitable[_T]) -> _T:
        try:
            return await _bounded(
                f"{self.kind} ({what} in sandbox {self.sandbox_id})",
                awaitable,
                self.config.call_timeout,
                self.task_id,
            )
        except SandboxUnavailableError as exc:
            raise self._gone_from(exc) from exc

    def _gone_from(self, exc: SandboxUnavailableError) -> SandboxUnavailableError:
        return self._mark_gone(exc.detail, reason=exc.reason, backend=exc.backend)

    # ----------------------------------------------------------------- exec

    async def _run_argv(self, run: ContainerExec) -> int:
        """Run a short helper (the group kill, mkdir, tar): its text output, exit code."""
        result, timed_out = await self._run_script(
            shlex.join(run.argv), run.env, 1 << 16, run.limit
        )
        if result is None:
            what = f"did not finish within {run.limit:g} s" if timed_out else "gave no result"
            raise SandboxError(
                f"{self.kind} sandbox {self.sandbox_id}: a helper command {what}",
                task_id=self.task_id,
            )
        rc, _, _, out, err = result
        run.out.feed(out)
        run.err.feed(err)
        return rc

    async def _stage_file(self, path: str, data: bytes) -> None:
        await self._call(f"a write of {path}", self._driver.write(path, data))

    def _run_command(self, exec_id: str, command: str, cwd: str, stdin: str, limit: int) -> str:
        argv = ["sh", "-c", _RUN_SCRIPT, "hermes-run", EXEC_WRAPPER, exec_id, str(limit)]
        return shlex.join([*argv, cwd, stdin, command])

    async def _run_script(
        self,
        command: str,
        env: Mapping[str, str] | None,
        limit_bytes: int,
        timeout: float,
        *,
        exec_id: str | None = None,
        cwd: str = "/",
        stdin: str = "",
    ) -> tuple[tuple[int, int, int, bytes, bytes] | None, bool]:
        """Run ``command`` through the wrapper: (result block or ``None``, whether it timed out)."""
        kill_on_timeout = exec_id is not None
        exec_id = exec_id or uuid.uuid4().hex
        line = self._run_command(exec_id, command, cwd, stdin, limit_bytes)
        done = anyio.Event()
        reply: list[str] = []
        failure: list[Exception] = []
        backstop = timeout + self.kill_timeout + 30 if math.isfinite(timeout) else 0

        async def runner() -> None:
            try:
                reply.append(await self._driver.run(line, env=env, timeout=backstop))
            except SandboxUnavailableError as exc:
                failure.append(self._gone_from(exc))
            except Exception as exc:  # re-raised below, unwrapped (no exception group)
                failure.append(exc)
            finally:
                done.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(runner)
                with anyio.move_on_after(timeout):
                    await done.wait()
                timed_out = not done.is_set()
                if timed_out and kill_on_timeout:
                    await self._kill_group(exec_id, f"the command timed out after {timeout:g} s")
                    # The first call reports what the command printed before it died.
                    with anyio.move_on_after(self.kill_timeout):
                        await done.wait()
                if not done.is_set():
                    tg.cancel_scope.cancel(
                        f"the command timed out after {timeout:g} s and did not report in time"
                    )
        except BaseException:
            if not done.is_set() and kill_on_timeout:
                await self._kill_group(exec_id, "the command was cancelled or failed")
            raise
        if failure:
            raise failure[0]
        if not reply:
            if not timed_out:
                raise SandboxError(
                    f"{self.kind} sandbox {self.sandbox_id}: a command gave no output",
                    task_id=self.task_id,
                )
            return None, timed_out
        return parse_result(reply[0]), timed_out

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        """Run the command in the sandbox, in its own process group.

        Raises:
            SandboxUnavailableError: The sandbox is gone (before or while the command ran).
            SandboxError: The provider is unreachable, or the command's result was garbled.

        **Cancellation**: the command's process group is killed (shielded, bounded by
        ``call_timeout``) before the cancellation propagates.
        """
        self._check_open()
        limit = self.default_exec_timeout if request.timeout is None else request.timeout
        cwd = self.workdir if request.cwd is None else self._resolve(request.cwd)
        exec_id = uuid.uuid4().hex
        stdin_path = ""
        start = anyio.current_time()
        if request.stdin is not None:
            stdin_path = f"{EXEC_DIR}/{exec_id}.in"
            await self._stage_file(stdin_path, request.stdin)
        result, timed_out = await self._run_script(
            request.command,
            request.env,
            request.output_limit,
            limit,
            exec_id=exec_id,
            cwd=cwd,
            stdin=stdin_path,
        )
        duration = anyio.current_time() - start
        if self._gone is not None:
            raise self._gone
        if result is None:
            if not timed_out:
                raise SandboxError(
                    f"{self.kind} sandbox {self.sandbox_id}: the command's result block is "
                    "missing or garbled (does the image have sh, base64, head and tail?)",
                    task_id=self.task_id,
                )
            out = err = OutputCapture(0)
            code = TIMEOUT_EXIT_CODE
        else:
            code, n_out, n_err, out_kept, err_kept = result
            out = _capture(out_kept, n_out, request.output_limit)
            err = _capture(err_kept, n_err, request.output_limit)
            if timed_out:
                code = TIMEOUT_EXIT_CODE
        return ExecResult(
            stdout=out.text(),
            stderr=err.text(),
            exit_code=code,
            timed_out=timed_out,
            truncated=out.truncated or err.truncated,
            duration_seconds=duration,
        )

    # ----------------------------------------------------------------- files

    async def _sh(self, script: str, *args: str) -> tuple[int, str, str]:
        out, err = OutputCapture(1 << 16), OutputCapture(1 << 16)
        argv = ["/bin/sh", "-c", script, "sh", *args]
        code = await self._run_argv(ContainerExec(argv, None, out, err, self.config.call_timeout))
        return code, out.text().strip(), err.text().strip()

    async def _read(self, path: str) -> bytes:
        return await self._call(f"a read of {path}", self._driver.read(path))

    async def stream_file(self, path: str, sink: ByteSink, *, max_bytes: int | None = None) -> int:
        """Check ``path`` in the sandbox, then download it to ``sink`` in chunks.

        **Cancellation**: nothing is left running in the sandbox.
        """
        self._check_open()
        source = self._resolve(path)
        cap = -1 if max_bytes is None else max_bytes
        code, out, err = await self._sh(_CHECK_FILE, source, str(cap))
        if code == _MISSING:
            raise FileNotFoundError(f"no such file or directory in the sandbox: {path!r}")
        if code == _NOT_REGULAR:
            raise NotARegularFileError(f"not a regular file in the sandbox: {path!r}")
        if code == _TOO_LARGE and max_bytes is not None:
            size = small_int(out)
            raise TransferLimitError(f"file {path!r}", limit=max_bytes, size=size)
        if code != 0:
            raise OSError(f"cannot read {path!r} in the sandbox: {err or f'exit {code}'}")
        data = await self._read(source)
        return await _deliver_whole(data, sink, f"file {path!r}", max_bytes)

    async def stream_archive(
        self, path: str, sink: ByteSink, *, max_bytes: int | None = None
    ) -> int:
        """Build the archive in the sandbox, check its size, download it to ``sink``.

        **Cancellation**: the staged archive is removed (bounded).
        """
        self._check_open()
        staged, size = await self._archive(path)
        try:
            if max_bytes is not None and size > max_bytes:
                raise TransferLimitError(f"archive of {path!r}", limit=max_bytes, size=size)
            data = await self._read(staged)
        finally:
            await self._remove_staged(staged)
        return await _deliver_whole(data, sink, f"archive of {path!r}", max_bytes)

    # ----------------------------------------------------------------- close

    async def aclose(self, interrupted: bool = False) -> None:
        """Delete the sandbox. Idempotent; ``interrupted`` changes nothing.

        **Cancellation**: one call bounded by ``delete_timeout``; a sandbox not deleted is left to
        the reaper and its lifetime.
        """
        if self._closed:
            return
        self._closed = True
        try:
            await _bounded(
                f"{self.kind} (delete of sandbox {self.sandbox_id})",
                self._driver.delete(),
                self.config.delete_timeout,
                self.task_id,
            )
        except Exception as exc:
            logger.warning(
                "could not delete %s sandbox %s (the reaper or its lifetime ends it): %s",
                self.kind,
                self.sandbox_id,
                exc,
            )
        else:
            if self._backend is not None:
                self._backend._forget(self.sandbox_id)


class RemoteBackend(Generic[_C]):
    """A factory of remote sandboxes for one run: labels, rate limit, the reaper.

    A backend sets the class attributes and implements :meth:`_import_sdk` and
    :meth:`_make_client`.

    Args:
        sdk: The SDK module, or a double with the same async surface; default: import it.
        run_id: This run's id (default: random); its sandboxes carry it as a label.
    """

    #: The backend's name in messages (``"E2B"``).
    kind = "remote"
    #: Its ``terminal_backend`` name (``"e2b"``).
    name = "remote"
    #: What makes the SDK asyncio-only, for the error under trio.
    sdk_library = "its SDK"
    #: What to check when creation fails or hangs.
    credentials_hint = "check the provider's credentials and network access"

    def __init__(self, config: _C, *, sdk: object | None = None, run_id: str | None = None) -> None:
        self.config = config
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self.rate_limiter = CreationRateLimiter(
            config.max_creates_per_second, config.max_concurrent_creates
        )
        self.live: set[str] = set()
        self.reaps: list[_ReapReport] = []
        self._sdk = sdk
        self._client: RemoteClient | None = None
        self._started = False
        self._start_lock: anyio.Lock | None = None

    # ----------------------------------------------------------------- hooks

    @abstractmethod
    def _import_sdk(self) -> Any:
        """Import the SDK module (``ConfigError`` naming the extra when it is missing)."""

    @abstractmethod
    def _make_client(self, sdk: Any, config: _C) -> RemoteClient:
        """The control-plane client over ``sdk`` (the module or a double)."""

    def _check_runtime(self) -> None:
        require_asyncio(
            f"the {self.name} sandbox backend",
            self.sdk_library,
            remedy="use terminal_backend='local'",
        )

    def _config_for(self, spec: SandboxSpec | None) -> _C:
        return remote_config_for(self.config, spec, name=self.name)

    def labels(self, task_id: str | None = None) -> dict[str, str]:
        """The labels of this run's sandboxes (with ``task_id``'s when given)."""
        labels = {HERMES_LABEL: "1", RUN_LABEL: self.run_id}
        if task_id is not None:
            labels[TASK_LABEL] = task_id
        return labels

    def _forget(self, sandbox_id: str) -> None:
        self.live.discard(sandbox_id)

    def _client_for(self) -> RemoteClient:
        if self._client is None:
            sdk = self._sdk if self._sdk is not None else self._import_sdk()
            self._client = self._make_client(sdk, self.config)
        return self._client

    # ----------------------------------------------------------------- create

    async def __call__(self, task_id: str, spec: SandboxSpec | None = None) -> _RemoteSandbox:
        """Create the sandbox for ``task_id`` (rate limited, shielded until its id is known).

        Raises:
            ConfigError: The SDK is missing, or it cannot run on this async library.
            SandboxError: The provider refused or failed, or creation exceeded ``create_timeout``.

        **Cancellation**: waits for the id (at most ``create_timeout``), deletes the sandbox
        (shielded, bounded), then propagates.
        """
        self._check_runtime()
        config = self._config_for(spec)
        client = self._client_for()
        await self._start_once(client)
        labels = self.labels(task_id)
        async with self.rate_limiter:
            try:
                # Shielded: a cancellation must not cut the call between "the provider made
                # it" and "we know its id" (verifiers #411). Bounded by the create deadline.
                with acquisition_scope(config.create_timeout):
                    driver = await client.create(labels)
            except TimeoutError as exc:
                await self._sweep_task(client, task_id, "its create timed out")
                raise SandboxError(
                    f"creating a {self.kind} sandbox did not finish within "
                    f"{config.create_timeout:g} s; {self.credentials_hint}",
                    task_id=task_id,
                ) from exc
        self.live.add(driver.sandbox_id)
        sandbox = _RemoteSandbox(task_id, driver, config, kind=self.kind, on_close=self)
        try:
            # Deliver a cancellation that arrived during the shielded create, now that the
            # sandbox can be deleted.
            await anyio.lowlevel.checkpoint()
        except BaseException:
            with cleanup_scope(
                f"delete {self.kind} sandbox {driver.sandbox_id} created for a cancelled caller",
                config.delete_timeout,
                reason="the caller was cancelled while the sandbox was being created",
                log=logger,
            ):
                await sandbox.aclose(interrupted=True)
            raise
        return sandbox

    async def _start_once(self, client: RemoteClient) -> None:
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = anyio.Lock()
        async with self._start_lock:
            if not self._started:  # the first caller sweeps; the ones it held skip it
                if self.config.reap_on_start:
                    await self.reap(reason="the factory's first use")
                self._started = True

    # ----------------------------------------------------------------- reaper

    async def _sweep_task(self, client: RemoteClient, task_id: str, reason: str) -> None:
        with cleanup_scope(
            f"sweep {self.kind} sandboxes of task {task_id!r} (run {self.run_id})",
            self.config.reap_timeout,
            reason=reason,
            log=logger,
        ):
            await self._sweep(client, self.labels(task_id), reason)

    async def _sweep(
        self, client: RemoteClient, labels: Mapping[str, str], reason: str
    ) -> _ReapReport:
        found: list[str] = []
        deleted: list[str] = []
        failed: list[str] = []
        skipped: list[str] = []
        try:
            listed = await client.list_ids(labels)
        except Exception as exc:
            logger.warning("could not list %s sandboxes of run %s: %s", self.kind, self.run_id, exc)
            listed = []
        for sandbox_id, their_labels in listed:
            found.append(sandbox_id)
            # Belt and braces: never delete what is not this run's, whatever the filter did.
            if any(their_labels.get(k) != v for k, v in labels.items()):
                skipped.append(sandbox_id)
                continue
            try:
                with anyio.fail_after(self.config.delete_timeout):
                    await client.delete_id(sandbox_id)
            except Exception as exc:
                failed.append(sandbox_id)
                logger.warning(
                    "could not delete leftover %s sandbox %s: %r", self.kind, sandbox_id, exc
                )
            else:
                deleted.append(sandbox_id)
                self.live.discard(sandbox_id)
        report = _ReapReport(tuple(found), tuple(deleted), tuple(failed), tuple(skipped))
        self.reaps.append(report)
        if deleted:
            logger.info(
                "reaped %d leftover %s sandbox(es) of run %s (%s)",
                len(deleted),
                self.kind,
                self.run_id,
                reason,
            )
        return report

    async def reap(self, *, reason: str = "asked") -> _ReapReport:
        """Delete every sandbox carrying this run's labels (never another run's).

        **Cancellation**: shielded, bounded by ``reap_timeout``; what was not deleted is left to
        the next sweep.
        """
        client = self._client_for()
        report = _ReapReport()
        with cleanup_scope(
            f"reap {self.kind} sandboxes of run {self.run_id}",
            self.config.reap_timeout,
            reason=reason,
            log=logger,
        ):
            report = await self._sweep(client, self.labels(), reason)
        return report

    async def aclose(self) -> None:
        """Sweep this run's leftovers, then close the client. Idempotent.

        **Cancellation**: both steps are shielded and bounded.
        """
        if self._client is None:
            return
        client = self._client
        await self.reap(reason="the factory closed")
        self._client = None
        self._started = False
        await bounded_cleanup(
            f"close the {self.kind} client",
            client.aclose,
            timeout=self.config.call_timeout,
            log=logger,
        )
