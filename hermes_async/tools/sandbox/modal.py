"""The Modal sandbox backend: one Modal Sandbox per rollout (extra ``[modal]``).

Modal's async API only; asyncio only. Every call has a deadline and creation is rate
limited. Reasons and the manual check with real credentials:
docs/decisions/023-modal-sandbox.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from hermes_async._asynclib import require_asyncio
from hermes_async._checks import (
    ABSOLUTE_PATH,
    AT_LEAST_ONE,
    NON_EMPTY_STRING,
    POSITIVE_FINITE,
    check_fields,
)
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.tools.sandbox._container import ContainerExec, pump_output, read_until_exit
from hermes_async.tools.sandbox._sdk import error_named, import_sdk
from hermes_async.tools.sandbox._staged import StagedTransferSandbox
from hermes_async.tools.sandbox.docker import DEFAULT_DOCKER_IMAGE
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "DEFAULT_MODAL_IMAGE",
    "CreationRateLimiter",
    "ModalBackend",
    "ModalSandbox",
    "ModalSandboxConfig",
    "modal_config_for",
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: The reference's default image (``TERMINAL_MODAL_IMAGE``).
DEFAULT_MODAL_IMAGE = DEFAULT_DOCKER_IMAGE

_CREDENTIALS_HINT = (
    "check network access and credentials (`modal token info`; set MODAL_TOKEN_ID and "
    "MODAL_TOKEN_SECRET or run `modal token new`), or use terminal_backend='local' or 'docker'"
)


@dataclass(frozen=True, slots=True)
class ModalSandboxConfig:
    """How Modal sandboxes are created.

    Attributes:
        image: Registry image (``Image.from_registry``).
        app_name: Modal app of the sandboxes (created if missing).
        block_network: Cut the sandbox off the network (Modal's default is on).
        sandbox_lifetime_seconds: Modal's hard lifetime of a sandbox (a bound on leaks).
        create_timeout: Deadline of one creation (app lookup + create).
        call_timeout: Deadline of every other Modal call.
        terminate_timeout: Deadline of ``terminate``; bounds an ``async with`` release.
    """

    image: str = DEFAULT_MODAL_IMAGE
    app_name: str = "hermes-async"
    workdir: str = "/root"
    cpus: float = 1.0
    memory_mb: int = 5120
    block_network: bool = False
    sandbox_lifetime_seconds: int = 3600
    create_timeout: float = 180.0
    call_timeout: float = 60.0
    terminate_timeout: float = 30.0
    default_exec_timeout: float = 180.0
    max_creates_per_second: float = 4.0
    max_concurrent_creates: int = 16

    def __post_init__(self) -> None:
        check_fields(self, ("workdir",), ABSOLUTE_PATH)
        check_fields(self, ("image",), NON_EMPTY_STRING)
        _check_cloud_fields(self, "terminate_timeout")


def _check_cloud_fields(config: object, *timeouts: str) -> None:
    """Check the fields every cloud sandbox config has (deadlines, rate, lifetime).

    Raises:
        ConfigError: Naming the config class, the field and the bad value.
    """
    check_fields(
        config,
        (
            "cpus",
            "create_timeout",
            "call_timeout",
            *timeouts,
            "default_exec_timeout",
            "max_creates_per_second",
        ),
        POSITIVE_FINITE,
    )
    check_fields(config, ("max_concurrent_creates", "sandbox_lifetime_seconds"), AT_LEAST_ONE)


class CreationRateLimiter:
    """At most ``rate`` starts per second, ``concurrency`` in flight; starts spaced ``1 / rate``.

    A caller cancelled while sleeping gives up its turn.
    """

    def __init__(self, rate: float, concurrency: int) -> None:
        if not rate > 0 or concurrency < 1:
            raise ValueError(
                f"rate must be > 0 and concurrency >= 1, got {rate!r}, {concurrency!r}"
            )
        self.interval = 1.0 / rate
        self.concurrency = concurrency
        self._next_start = -math.inf
        self._limiter: anyio.CapacityLimiter | None = None
        self.in_flight = 0
        self.max_in_flight = 0

    async def __aenter__(self) -> None:
        """Wait for a start slot and a concurrency slot.

        **Cancellation**: no slot is held if cancelled while waiting.
        """
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.concurrency)
        await self._limiter.acquire()
        try:
            now = anyio.current_time()
            start = max(now, self._next_start)
            self._next_start = start + self.interval
            await anyio.sleep(start - now)
        except BaseException:
            self._limiter.release()
            raise
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    async def __aexit__(self, *exc_info: object) -> None:
        self.in_flight -= 1
        assert self._limiter is not None
        self._limiter.release()


def _import_modal() -> Any:
    return import_sdk("modal", backend="modal", what="the modal client")


async def _call(
    what: str, awaitable: Awaitable[_T], timeout: float, task_id: str | None = None
) -> _T:
    """Await a Modal call with a deadline; turn Modal's failures into ``SandboxError``."""
    try:
        with anyio.fail_after(timeout):
            return await awaitable
    except TimeoutError as exc:
        raise SandboxError(
            f"Modal did not answer {what} within {timeout:g} s (offline or with bad credentials "
            f"a Modal call hangs ~57 s before failing); {_CREDENTIALS_HINT}",
            task_id=task_id,
        ) from exc
    except Exception as exc:
        if error_named(exc, "SandboxFilesystemError") or isinstance(exc, SandboxError):
            raise
        if error_named(exc, "AuthError"):
            raise SandboxError(
                f"Modal refused {what}: not authenticated ({exc}); {_CREDENTIALS_HINT}",
                task_id=task_id,
            ) from exc
        if error_named(exc, "Error", "GRPCError", "ConnectionError", "OSError"):
            raise SandboxError(
                f"Modal failed {what}: {type(exc).__name__}: {exc}", task_id=task_id
            ) from exc
        raise


def modal_config_for(config: ModalSandboxConfig, spec: SandboxSpec | None) -> ModalSandboxConfig:
    """``config`` with a per-item spec applied.

    Raises:
        ConfigError: The spec asks for a local build.
    """
    return _cloud_config_for(
        config,
        spec,
        image_field="image",
        name="modal",
        publish="push the image to a registry",
    )


_Config = TypeVar("_Config")


def _cloud_config_for(
    config: _Config, spec: SandboxSpec | None, *, image_field: str, name: str, publish: str
) -> _Config:
    """A cloud config with a spec applied (``image`` to ``image_field``).

    Raises:
        ConfigError: A ``build_context`` without an image (clouds build from a registry).
    """
    if spec is None:
        return config
    if spec.build_context is not None and spec.image is None:
        raise ConfigError(
            f"the {name} backend cannot build {str(spec.build_context)!r} locally; {publish} "
            "and give SandboxSpec.image, or use terminal_backend='docker'"
        )
    changes: dict[str, Any] = {}
    for field_name, value in (
        (image_field, spec.image),
        ("cpus", None if spec.cpus is None else float(spec.cpus)),
        ("memory_mb", spec.memory_mb),
        ("block_network", None if spec.network_mode is None else spec.network_mode == "none"),
        ("workdir", spec.workdir),
        ("create_timeout", spec.create_timeout),
        ("default_exec_timeout", spec.exec_timeout),
    ):
        if value is not None:
            changes[field_name] = value
    return dataclasses.replace(config, **changes)  # type: ignore[type-var]


class ModalBackend:
    """The ``factory(task_id)`` a ``SandboxManager`` takes: creates :class:`ModalSandbox` es.

    Args:
        config: How sandboxes are created.
        modal: The ``modal`` module or a double (``FakeModal``); default ``import modal``.
    """

    def __init__(
        self, config: ModalSandboxConfig | None = None, *, modal: object | None = None
    ) -> None:
        self.config = config or ModalSandboxConfig()
        self._modal = modal
        self.rate_limiter = CreationRateLimiter(
            self.config.max_creates_per_second, self.config.max_concurrent_creates
        )
        self._app: object | None = None

    async def __call__(self, task_id: str, spec: SandboxSpec | None = None) -> ModalSandbox:
        """Create the Modal sandbox for ``task_id`` (rate limited, bounded) from ``spec``.

        Raises:
            ConfigError: Not under asyncio, or modal is not installed.
            SandboxError: Modal is unreachable, refuses, or creation passed ``create_timeout``.

        **Cancellation**: a sandbox cancelled mid-create ends with its Modal lifetime.
        """
        require_asyncio(
            "the modal sandbox backend",
            "modal (synchronicity, asyncio)",
            remedy="use terminal_backend='local' or 'docker'",
        )
        modal: Any = self._modal if self._modal is not None else _import_modal()
        cfg = modal_config_for(self.config, spec)
        async with self.rate_limiter:
            try:
                with anyio.fail_after(cfg.create_timeout):
                    if self._app is None:
                        self._app = await modal.App.lookup.aio(cfg.app_name, create_if_missing=True)
                    image = modal.Image.from_registry(cfg.image)
                    handle = await modal.Sandbox.create.aio(
                        "sleep",
                        "infinity",
                        app=self._app,
                        image=image,
                        workdir=cfg.workdir,
                        timeout=cfg.sandbox_lifetime_seconds,
                        cpu=cfg.cpus,
                        memory=cfg.memory_mb,
                        block_network=cfg.block_network,
                    )
            except TimeoutError as exc:
                raise SandboxError(
                    f"creating a Modal sandbox from {cfg.image!r} did not finish within "
                    f"{cfg.create_timeout:g} s (offline or with bad credentials a Modal "
                    f"call hangs ~57 s before failing); {_CREDENTIALS_HINT}",
                    task_id=task_id,
                ) from exc
            except Exception as exc:
                if error_named(exc, "AuthError"):
                    raise SandboxError(
                        f"Modal refused to create a sandbox: not authenticated ({exc}); "
                        f"{_CREDENTIALS_HINT}",
                        task_id=task_id,
                    ) from exc
                if error_named(exc, "Error", "GRPCError", "OSError"):
                    raise SandboxError(
                        f"Modal failed to create a sandbox from {cfg.image!r}: "
                        f"{type(exc).__name__}: {exc}",
                        task_id=task_id,
                    ) from exc
                raise
        return ModalSandbox(task_id, handle, cfg)


class ModalSandbox(StagedTransferSandbox):
    """One task's Modal sandbox, made by :class:`ModalBackend`."""

    kind = "Modal"

    def __init__(self, task_id: str, handle: Any, config: ModalSandboxConfig) -> None:
        super().__init__(
            task_id,
            config.workdir,
            default_exec_timeout=config.default_exec_timeout,
            kill_timeout=config.call_timeout,
            close_timeout=config.terminate_timeout,
        )
        self.config = config
        self._sb = handle

    @property
    def object_id(self) -> str:
        """Modal's id of the sandbox (``sb-...``)."""
        return str(getattr(self._sb, "object_id", "?"))

    @property
    def label(self) -> str:
        """Modal's id of the sandbox."""
        return self.object_id

    async def _call(self, what: str, awaitable: Awaitable[_T]) -> _T:
        try:
            return await _call(what, awaitable, self.config.call_timeout, self.task_id)
        except Exception as exc:
            cause = exc.__cause__
            if error_named(exc, "SandboxTerminatedError") or (
                cause is not None and error_named(cause, "SandboxTerminatedError")
            ):
                raise self._mark_gone(
                    f"Modal reports sandbox {self.object_id} terminated during {what}",
                    reason="exited",
                ) from exc
            raise

    # ----------------------------------------------------------------- exec hooks

    async def _run_argv(self, run: ContainerExec) -> int:
        argv, env, err, limit = run.argv, run.env, run.err, run.limit
        # Modal's own exec timeout is a backstop a little past ours (integer seconds).
        process = await self._call(
            "an exec",
            self._sb.exec.aio(
                *argv,
                env=dict(env) if env else None,
                text=False,
                timeout=math.ceil(limit) + 30 if math.isfinite(limit) else None,
            ),
        )

        def read_failed(exc: Exception) -> SandboxError:
            return SandboxError(
                f"reading a command's output from Modal failed: {exc!r}", task_id=self.task_id
            )

        async def read_streams() -> None:
            await pump_output(
                process.stdout, process.stderr, run.write_out, err, read_failed=read_failed
            )

        async def poll_exit() -> int | None:
            code = await self._call("an exec poll", process.poll.aio())
            return None if code is None else int(code)

        code = await read_until_exit(read_streams, poll_exit)
        if code is None:
            code = int(await self._call("an exec wait", process.wait.aio()))
        return code

    async def _stage_file(self, path: str, data: bytes) -> None:
        await self._write(path, data)

    async def _sh(self, script: str, *args: str) -> tuple[int, str, str]:
        code, out, err = await self._helper_output(
            ["/bin/sh", "-c", script, "sh", *args], self.config.call_timeout
        )
        return code, out.strip(), err.strip()

    # ----------------------------------------------------------------- files

    async def _write(self, path: str, data: bytes) -> None:
        try:
            await self._call(f"a write of {path}", self._sb.filesystem.write_bytes.aio(data, path))
        except Exception as exc:
            if error_named(exc, "SandboxFilesystemError"):
                raise OSError(f"cannot write {path} in the sandbox: {exc}") from exc
            raise

    async def _read(self, path: str) -> bytes:
        try:
            data = await self._call(f"a read of {path}", self._sb.filesystem.read_bytes.aio(path))
        except Exception as exc:
            if error_named(
                exc,
                "SandboxFilesystemNotFoundError",
                "SandboxFilesystemIsADirectoryError",
                "SandboxFilesystemNotADirectoryError",
            ):
                raise FileNotFoundError(f"not a regular file in the sandbox: {path}") from exc
            if error_named(exc, "SandboxFilesystemError"):
                raise OSError(f"cannot read {path} in the sandbox: {exc}") from exc
            raise
        return bytes(data)

    async def read_bytes(self, path: str) -> bytes:
        """Return the contents of ``path``.

        Raises:
            FileNotFoundError: ``path`` does not exist or is not a regular file.

        **Cancellation**: nothing to clean up.
        """
        self._check_open()
        return await self._read(self._resolve(path))

    # ----------------------------------------------------------------- close

    async def aclose(self, interrupted: bool = False) -> None:
        """Terminate the sandbox. Idempotent; ``interrupted`` changes nothing.

        **Cancellation**: one call bounded by ``terminate_timeout``, under the release's scope. A
        failure is logged; the sandbox ends with its Modal lifetime.
        """
        if self._closed:
            return
        self._closed = True
        try:
            await _call(
                f"terminate of {self.object_id}",
                self._sb.terminate.aio(),
                self.config.terminate_timeout,
                self.task_id,
            )
        except Exception as exc:
            logger.warning(
                "could not terminate Modal sandbox %s (it ends with its lifetime): %s",
                self.object_id,
                exc,
            )
