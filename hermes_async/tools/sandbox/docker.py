"""The Docker sandbox backend: one long-lived, hardened container per rollout (extra ``[docker]``).

Commands run through ``docker exec`` in their own process group; files move through the
archive API. asyncio only (aiodocker). Defaults and reasons:
docs/decisions/020-docker-sandbox-defaults.md.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import posixpath
import re
import secrets
import socket
import tarfile
import tempfile
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel

from hermes_async._asynclib import require_asyncio
from hermes_async._checks import (
    ABSOLUTE_PATH,
    AT_LEAST_ONE,
    NON_EMPTY_STRING,
    POSITIVE,
    check_fields,
)
from hermes_async._cleanup import acquisition_scope, bounded_cleanup, cleanup_scope
from hermes_async._resource import AsyncResource
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.tools.sandbox._container import (
    TRANSFER_TIMEOUT_SECONDS,
    ContainerExec,
    ContainerSandbox,
    read_until_exit,
)
from hermes_async.tools.sandbox._sdk import import_sdk
from hermes_async.tools.sandbox.archive import check_tar_members, checked_members, single_file_tar
from hermes_async.tools.sandbox.docker_images import ImageBuilder
from hermes_async.tools.sandbox.errors import UnavailableReason
from hermes_async.tools.sandbox.spec import SandboxSnapshot, SandboxSpec
from hermes_async.tools.sandbox.transfer import pack_host_tree

if TYPE_CHECKING:
    import aiodocker
    import aiodocker.containers

__all__ = (
    "DEFAULT_DOCKER_IMAGE",
    "LABEL",
    "DockerBackend",
    "DockerSandbox",
    "DockerSandboxConfig",
    "reap_orphan_containers",
    "resolve_docker_host",
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: The reference's default image (Python 3.11 + Node 20).
DEFAULT_DOCKER_IMAGE = "nikolaik/python-nodejs:python3.11-nodejs20"

#: Capabilities kept after dropping ALL: enough for root to own, chmod and kill its own files
#: and processes and for package managers to switch users; nothing that reaches the host
#: (no NET_ADMIN, SYS_ADMIN, SYS_PTRACE, MKNOD, NET_RAW).
_DEFAULT_CAPABILITIES: tuple[str, ...] = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
)

#: Label every container of ours carries (value ``"1"``); more labels are ``LABEL + ".…"``.
LABEL = "hermes-async"
_TASK_LABEL = f"{LABEL}.task-id"
_OWNER_LABEL = f"{LABEL}.owner"
#: Label of the images :meth:`DockerSandbox.snapshot` commits, and their repository.
SNAPSHOT_LABEL = f"{LABEL}.snapshot"
SNAPSHOT_REPOSITORY = "hermes-async-snapshot"

_DEFAULT_SOCKET = "unix:///var/run/docker.sock"

#: Deadline of closing the aiohttp client (its connections; nothing remote to wait for).
_CLIENT_CLOSE_SECONDS = 5.0

_ASYNCIO_ONLY = ("the docker sandbox backend", "aiodocker (aiohttp)")
_REMEDY = "use terminal_backend='local'"

#: After a creation failed or was cancelled with no container id, how often (and how far
#: apart) to look for a container the engine created anyway.
_LATE_CREATE_CHECKS = 3
_LATE_CREATE_DELAY_SECONDS = 0.3

#: Uploads up to this size go straight to their directory (see ``_put_tar_into``).
_TRY_FIRST_BYTES = 64 * 1024
_HOW_TO_SET = (
    "start a Docker engine, or point DOCKER_HOST at a running one "
    "(e.g. DOCKER_HOST=unix:///path/to/docker.sock; `scripts/docker/engine.sh up` starts a "
    "private engine), or pass docker_host=..., or use terminal_backend='local'"
)


@dataclass(frozen=True, slots=True)
class DockerSandboxConfig:
    """How Docker sandboxes are created (docs/decisions/020-docker-sandbox-defaults.md).

    Attributes:
        network_mode: ``"none"`` (default), ``"bridge"`` or a network name.
        capabilities: Capabilities added back after dropping ALL.
        env: Container environment (an allowlist: nothing of the host's leaks in).
        docker_host: Engine URL; default ``$DOCKER_HOST``, else ``unix:///var/run/docker.sock``.
        api_timeout: Deadline of each engine call.
        default_exec_timeout: Command timeout when ``exec`` gets none (``TERMINAL_TIMEOUT``).
        remove_timeout: Deadline of removing a container; bounds an ``async with`` release.
        reap_orphans: Remove dead owners' containers on the backend's first creation.
        user: The container's user (``None``: the image's).
        disk_limit_mb: Cap of the writable layer (``None``: none).
        build_network_mode: Network of image builds' ``RUN`` steps (``"host"``: e.g. a mirror).
    """

    image: str = DEFAULT_DOCKER_IMAGE
    workdir: str = "/root"
    network_mode: str = "none"
    cpus: float = 1.0
    memory_mb: int = 5120
    pids_limit: int = 512
    capabilities: tuple[str, ...] = _DEFAULT_CAPABILITIES
    env: Mapping[str, str] = field(
        default_factory=lambda: {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
        }
    )
    labels: Mapping[str, str] = field(default_factory=dict)
    docker_host: str | None = None
    api_timeout: float = 60.0
    create_timeout: float = 120.0
    pull_missing: bool = True
    pull_timeout: float = 900.0
    default_exec_timeout: float = 180.0
    remove_timeout: float = 30.0
    kill_timeout: float = 10.0
    reap_orphans: bool = True
    user: str | None = None
    disk_limit_mb: int | None = 2048
    disk_check_interval_seconds: float = 10.0
    build_network_mode: str | None = None

    def __post_init__(self) -> None:
        check_fields(self, ("image",), NON_EMPTY_STRING)
        check_fields(self, ("workdir",), ABSOLUTE_PATH)
        check_fields(
            self,
            (
                "cpus",
                "api_timeout",
                "create_timeout",
                "pull_timeout",
                "default_exec_timeout",
                "remove_timeout",
                "kill_timeout",
                "disk_check_interval_seconds",
            ),
            POSITIVE,
        )
        check_fields(self, ("disk_limit_mb",), AT_LEAST_ONE.or_none())
        if self.pids_limit < 1 or self.memory_mb < 0:
            raise ConfigError(
                "DockerSandboxConfig: pids_limit must be >= 1 and memory_mb >= 0; got "
                f"{self.pids_limit!r} and {self.memory_mb!r}"
            )


# --------------------------------------------------------------------------- pure decisions


def resolve_docker_host(explicit: str | None = None) -> str:
    """The engine URL: ``explicit``, else ``$DOCKER_HOST``, else the default socket.

    Raises:
        SandboxError: The URL names a unix socket that does not exist.
    """
    source = "docker_host" if explicit else "DOCKER_HOST" if os.environ.get("DOCKER_HOST") else None
    url = explicit or os.environ.get("DOCKER_HOST") or _DEFAULT_SOCKET
    if url.startswith("unix://"):
        path = url[len("unix://") :]
        if not os.path.exists(path):
            where = f"(from {source})" if source else "(the default; DOCKER_HOST is not set)"
            raise SandboxError(f"no Docker socket at {path} {where}: {_HOW_TO_SET}")
    return url


@cache
def owner_id() -> str:
    """This process's owner id: ``host/pid/start-ticks`` (start time tells reused pids apart)."""
    pid = os.getpid()
    return f"{socket.gethostname()}/{pid}/{_start_ticks(pid) or 'na'}"


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _owner_is_alive(owner: str) -> bool:
    """Whether the process named by an owner id still runs (True when it cannot be known)."""
    parts = owner.split("/")
    if len(parts) != 3 or parts[0] != socket.gethostname():
        return True  # another host's (or a malformed) owner: not ours to judge
    try:
        pid = int(parts[1])
    except ValueError:
        return True
    ticks = _start_ticks(pid)
    if ticks is not None:
        return parts[2] in (ticks, "na")
    if os.path.isdir("/proc/self"):
        return False  # /proc works but has no such pid: gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _container_name(task_id: str) -> str:
    """A valid, unique container name mentioning the task id."""
    slug = re.sub(r"[^a-zA-Z0-9_.-]+", "-", task_id).strip("-.")[:40] or "task"
    return f"hermes-async-{slug}-{secrets.token_hex(4)}"


def _container_config(
    config: DockerSandboxConfig, task_id: str, *, storage_opt: bool = False
) -> dict[str, Any]:
    """The engine's create body; ``storage_opt`` asks the driver to cap the layer."""
    host: dict[str, Any] = {
        "CapDrop": ["ALL"],
        "CapAdd": list(config.capabilities),
        "SecurityOpt": ["no-new-privileges"],
        "PidsLimit": config.pids_limit,
        "NanoCpus": int(config.cpus * 1e9),
        "NetworkMode": config.network_mode,
        "Init": True,
    }
    if config.memory_mb:
        host["Memory"] = config.memory_mb * 1024 * 1024
    extra: dict[str, Any] = {"User": config.user} if config.user else {}
    if config.disk_limit_mb is not None:
        if storage_opt:
            host["StorageOpt"] = {"size": f"{config.disk_limit_mb}M"}
        else:
            cap = config.disk_limit_mb << 20
            host["Ulimits"] = [{"Name": "fsize", "Soft": cap, "Hard": cap}]
    return {
        **extra,
        "Image": config.image,
        "Cmd": ["sleep", "infinity"],
        "WorkingDir": config.workdir,
        "Env": [f"{k}={v}" for k, v in config.env.items()],
        "Labels": {**config.labels, LABEL: "1", _TASK_LABEL: task_id, _OWNER_LABEL: owner_id()},
        "Tty": False,
        "OpenStdin": False,
        "AttachStdin": False,
        "HostConfig": host,
    }


# --------------------------------------------------------------------------- I/O shell


def _import_aiodocker() -> Any:
    return import_sdk("aiodocker", backend="docker", what="aiodocker")


class _Engine(AsyncResource):
    """One aiodocker client plus the deadline/error translation every call goes through."""

    def __init__(self, client: aiodocker.Docker, url: str, api_timeout: float) -> None:
        self.client = client
        self.url = url
        self.api_timeout = api_timeout
        self._aiodocker = _import_aiodocker()

    @classmethod
    def open(cls, config: DockerSandboxConfig) -> _Engine:
        aiodocker_mod = _import_aiodocker()
        url = resolve_docker_host(config.docker_host)
        return cls(aiodocker_mod.Docker(url=url), url, config.api_timeout)

    async def call(self, what: str, awaitable: Awaitable[_T], timeout: float | None = None) -> _T:
        """Await an engine call with a deadline; translate transport failures."""
        import aiohttp

        limit = self.api_timeout if timeout is None else timeout
        try:
            with anyio.fail_after(limit):
                return await awaitable
        except TimeoutError as exc:
            raise SandboxError(
                f"the Docker engine at {self.url} did not answer {what} within {limit:g} s; "
                "check that it is healthy (`docker info`)"
            ) from exc
        except (aiohttp.ClientConnectionError, ConnectionError, FileNotFoundError) as exc:
            raise SandboxError(
                f"cannot reach the Docker engine at {self.url} ({what}: {exc}): {_HOW_TO_SET}"
            ) from exc
        except Exception as exc:
            # aiodocker reports connection failures as DockerError with the pseudo-status 900.
            if self.is_docker_error(exc, 900):
                raise SandboxError(
                    f"cannot reach the Docker engine at {self.url} ({what}): {_HOW_TO_SET}"
                ) from exc
            raise

    def is_docker_error(self, exc: BaseException, *statuses: int) -> bool:
        return isinstance(exc, self._aiodocker.DockerError) and (
            not statuses or exc.status in statuses
        )

    async def ping(self) -> None:
        await self.call(
            "a ping (GET /version)", self.client.version(), timeout=min(10.0, self.api_timeout)
        )

    async def aclose(self) -> None:
        """Close the client: shielded, bounded, never raising.

        It shields even inside a release's scope: an unclosed aiohttp session leaks its sockets.

        **Cancellation**: completes (bounded by ``_CLIENT_CLOSE_SECONDS``) before returning.
        """

        async def close() -> None:
            await self.client.close()
            # Closing a transport completes in a loop callback; give it its turn so the socket
            # is really closed (not "closing") if the loop ends right after us.
            for _ in range(3):
                await anyio.lowlevel.checkpoint()

        await bounded_cleanup(
            f"close the Docker client of {self.url}", close, timeout=_CLIENT_CLOSE_SECONDS
        )


async def reap_orphan_containers(docker_host: str | None = None, *, timeout: float = 60.0) -> int:
    """Remove this host's labelled containers and snapshot images whose owner process is gone.

    Returns how many were removed.

    **Cancellation**: containers already removed stay removed; the client is closed.
    """
    require_asyncio(*_ASYNCIO_ONLY, remedy=_REMEDY)
    engine = _Engine.open(DockerSandboxConfig(docker_host=docker_host, reap_orphans=False))
    try:
        return await _reap(engine, timeout)
    finally:
        await engine.aclose()


async def _reap(engine: _Engine, timeout: float) -> int:
    listing = await engine.call(
        "a container listing",
        engine.client.containers.list(all=True, filters={"label": [_OWNER_LABEL]}),
    )
    removed = 0
    with anyio.move_on_after(timeout):
        for container in listing:
            try:
                labels = container["Labels"] or {}
            except KeyError:
                labels = {}
            owner = labels.get(_OWNER_LABEL, "")
            if _owner_is_alive(owner):
                continue
            logger.info("removing orphan container %s (owner %s is gone)", container.id[:12], owner)
            try:
                await engine.call("an orphan removal", container.delete(force=True))
                removed += 1
            except Exception as exc:
                if not engine.is_docker_error(exc, 404, 409):
                    raise
        # Group snapshots whose process died before it deleted them (their containers are
        # gone now, so nothing uses them).
        images = await engine.call(
            "an image listing", engine.client.images.list(filters={"label": [SNAPSHOT_LABEL]})
        )
        for image in images:
            labels = image.get("Labels") or {}
            owner = labels.get(_OWNER_LABEL, "")
            if _owner_is_alive(owner):
                continue
            for ref in image.get("RepoTags") or [image["Id"]]:
                logger.info("removing orphan snapshot image %s (owner %s is gone)", ref, owner)
                try:
                    await engine.call("an orphan image removal", engine.client.images.delete(ref))
                    removed += 1
                except Exception as exc:
                    if not engine.is_docker_error(exc, 404, 409):
                        raise
    return removed


def _docker_config_for(
    config: DockerSandboxConfig,
    spec: SandboxSpec | None,
    *,
    image: str | None = None,
    image_workdir: str | None = None,
) -> DockerSandboxConfig:
    """``config`` with a spec applied (pure).

    ``image`` (a built tag) wins over ``spec.image``. The workdir is the spec's, else the image's
    ``WORKDIR``, else the config's. A spec's image keeps its own ``PATH`` and ``HOME``.
    """
    if spec is None:
        return config
    changes: dict[str, Any] = {}
    chosen = image or spec.image
    if chosen is not None:
        changes["image"] = chosen
    workdir = spec.workdir or (image_workdir if chosen is not None else None)
    if workdir:
        changes["workdir"] = workdir
    if spec.cpus is not None:
        changes["cpus"] = float(spec.cpus)
    if spec.memory_mb is not None:
        changes["memory_mb"] = spec.memory_mb
    if spec.network_mode is not None:
        changes["network_mode"] = spec.network_mode
    env = dict(config.env)
    if chosen is not None:
        # An image of the item's own brings its PATH (its ENV) and HOME (its user's home).
        env = {k: v for k, v in env.items() if k not in ("PATH", "HOME")}
    if spec.env or env != config.env:
        changes["env"] = {**env, **spec.env}
    if spec.user is not None:
        changes["user"] = spec.user
    if spec.labels:
        changes["labels"] = {**config.labels, **spec.labels}
    if spec.create_timeout is not None:
        changes["create_timeout"] = spec.create_timeout
    if spec.exec_timeout is not None:
        changes["default_exec_timeout"] = spec.exec_timeout
    return dataclasses.replace(config, **changes)


class DockerBackend:
    """The ``factory(task_id)`` a ``SandboxManager`` takes: creates :class:`DockerSandbox` es.

    The first creation reaps orphans. A ``spec=`` overrides image, limits, network, workdir, env
    and user; its ``build_context`` is built by ``images`` (default: one build at a time).
    """

    def __init__(
        self, config: DockerSandboxConfig | None = None, *, images: ImageBuilder | None = None
    ) -> None:
        self.config = config or DockerSandboxConfig()
        self.images = images or ImageBuilder(build_network=self.config.build_network_mode)
        self._reaped = not self.config.reap_orphans
        # Whether the storage driver enforces StorageOpt size: None until the first creation
        # tried it (overlay2 on ext4 refuses it; then the ulimit + watchdog take over).
        self._storage_opt: bool | None = None if self.config.disk_limit_mb is not None else False

    async def __call__(self, task_id: str, spec: SandboxSpec | None = None) -> DockerSandbox:
        """Create and start the container for ``task_id`` (from ``spec``, if given).

        Raises:
            ConfigError: Not under asyncio, or aiodocker is not installed.
            SandboxError: The engine is unreachable, the image cannot be pulled, or it timed out.

        **Cancellation**: a created container is removed (shielded, bounded by ``remove_timeout``).
        """
        require_asyncio(*_ASYNCIO_ONLY, remedy=_REMEDY)
        engine = _Engine.open(self.config)
        name = _container_name(task_id)
        container: aiodocker.containers.DockerContainer | None = None
        config = self.config
        try:
            await engine.ping()
            if spec is not None:
                config = await self._config_for(engine, spec)
        except BaseException:
            await engine.aclose()
            raise
        try:
            if not self._reaped:
                self._reaped = True
                await _reap(engine, self.config.api_timeout)
            try:
                with anyio.fail_after(config.create_timeout):
                    container = await self._create(engine, name, task_id, config)
                    await engine.call("a container start", container.start())
            except TimeoutError as exc:
                raise SandboxError(
                    f"creating container {name} from {config.image!r} did not finish within "
                    f"{config.create_timeout:g} s",
                    task_id=task_id,
                ) from exc
        except BaseException:
            # The engine may have created the container even if we never saw its id (a create
            # request cancelled in flight still completes on the engine): remove it by name,
            # shielded and bounded, looking again briefly when it is not there yet.
            with cleanup_scope(
                f"remove container {name} after a failed or cancelled creation",
                self.config.remove_timeout,
                reason="sandbox creation did not complete",
                log=logger,
            ):
                attempts = 1 if container is not None else _LATE_CREATE_CHECKS
                for attempt in range(attempts):
                    if await _remove_by_name(engine, name) or attempt == attempts - 1:
                        break
                    await anyio.sleep(_LATE_CREATE_DELAY_SECONDS)
            await engine.aclose()
            raise
        return DockerSandbox(
            task_id,
            engine,
            container,
            config,
            watchdog=config.disk_limit_mb is not None and not self._storage_opt,
        )

    async def image_labels(self, images: Sequence[str]) -> dict[str, dict[str, str] | None]:
        """Each image's labels, ``None`` for one the engine lacks.

        Raises:
            SandboxError: The engine is unreachable.

        **Cancellation**: the client is closed.
        """
        require_asyncio(*_ASYNCIO_ONLY, remedy=_REMEDY)
        engine = _Engine.open(self.config)
        try:
            await engine.ping()
            return {image: await self.images.labels_of(engine, image) for image in images}
        finally:
            await engine.aclose()

    async def _config_for(self, engine: _Engine, spec: SandboxSpec) -> DockerSandboxConfig:
        """The config of a spec's container: its image built (or found) and its WORKDIR."""
        image = spec.image_map.get(spec.image, spec.image) if spec.image else None
        if spec.build_context is not None:
            # An image the spec names and the engine has wins over building (Harbor's rule).
            present = image is not None and await self.images.has(engine, image)
            if not present:
                built = await self.images.ensure(
                    engine, spec.build_context, timeout=spec.build_timeout, image_map=spec.image_map
                )
                return _docker_config_for(
                    self.config, spec, image=built.tag, image_workdir=built.workdir
                )
        workdir = None
        if image is not None and spec.workdir is None:
            workdir = await self.images.workdir_of(engine, image)
        return _docker_config_for(self.config, spec, image=image, image_workdir=workdir)

    async def _create(
        self, engine: _Engine, name: str, task_id: str, config: DockerSandboxConfig
    ) -> aiodocker.containers.DockerContainer:
        if self._storage_opt is not False and config.disk_limit_mb is not None:
            body = _container_config(config, task_id, storage_opt=True)
            try:
                created = await engine.call(
                    "a container create", engine.client.containers.create(body, name=name)
                )
            except Exception as exc:
                if not engine.is_docker_error(exc):
                    raise
                if "storage" not in str(exc).lower():
                    # Not about the cap (a missing image, a bad option): the plain create
                    # below reports it, or pulls the image (the cap is decided next time).
                    return await self._create_plain(engine, name, task_id, config)
                logger.info(
                    "the Docker storage driver cannot cap a container's disk (%s); using an "
                    "fsize ulimit and the disk watchdog instead",
                    exc,
                )
                self._storage_opt = False
            else:
                self._storage_opt = True
                return created
        return await self._create_plain(engine, name, task_id, config)

    async def _create_plain(
        self, engine: _Engine, name: str, task_id: str, config: DockerSandboxConfig
    ) -> aiodocker.containers.DockerContainer:
        body = _container_config(config, task_id)
        try:
            return await engine.call(
                "a container create", engine.client.containers.create(body, name=name)
            )
        except SandboxError:
            raise
        except Exception as exc:
            if not engine.is_docker_error(exc, 404) or not config.pull_missing:
                raise self._create_error(exc, task_id, config) from exc
        logger.info("image %s not present; pulling it", config.image)
        try:
            await engine.call(
                f"a pull of {config.image}",
                engine.client.images.pull(config.image),
                timeout=config.pull_timeout,
            )
            return await engine.call(
                "a container create", engine.client.containers.create(body, name=name)
            )
        except Exception as exc:
            if engine.is_docker_error(exc):
                raise SandboxError(
                    f"image {config.image!r} is not on the Docker engine and pulling it failed "
                    f"({exc}); pull or build it first (`docker pull {config.image}`) or set "
                    "another image",
                    task_id=task_id,
                ) from exc
            raise

    def _create_error(
        self, exc: Exception, task_id: str, config: DockerSandboxConfig
    ) -> BaseException:
        if hasattr(exc, "status"):
            return SandboxError(
                f"the Docker engine refused to create a container from {config.image!r}: {exc}",
                task_id=task_id,
            )
        return exc


async def _remove_by_name(engine: _Engine, name: str) -> bool:
    """Remove container ``name``; return whether it existed (or is being removed)."""
    try:
        container = engine.client.containers.container(name)
        await engine.call(f"removal of {name}", container.delete(force=True))
    except Exception as exc:
        if engine.is_docker_error(exc, 404):
            return False
        if not engine.is_docker_error(exc, 409):
            logger.warning("could not remove container %s: %s", name, exc)
    return True


class DockerSandbox(ContainerSandbox):
    """One task's container, made by :class:`DockerBackend`."""

    kind = "Docker"

    def __init__(
        self,
        task_id: str,
        engine: _Engine,
        container: aiodocker.containers.DockerContainer,
        config: DockerSandboxConfig,
        *,
        watchdog: bool = False,
    ) -> None:
        super().__init__(
            task_id,
            config.workdir,
            home=config.env.get("HOME", "/root"),
            default_exec_timeout=config.default_exec_timeout,
            kill_timeout=config.kill_timeout,
            close_timeout=config.remove_timeout,
        )
        self.config = config
        self._engine = engine
        self._container = container
        #: Whether :meth:`watch` enforces the disk cap (the storage driver cannot).
        self.watchdog = watchdog

    @property
    def switches_users(self) -> bool:
        """True: ``docker exec --user``."""
        return True

    @property
    def container_id(self) -> str:
        """The engine's id of this sandbox's container."""
        return str(self._container.id)

    @property
    def label(self) -> str:
        """The container id's first 12 characters (as ``docker ps`` shows it)."""
        return self.container_id[:12]

    def _engine_error(self, what: str, exc: BaseException) -> SandboxError:
        return SandboxError(
            f"Docker engine error during {what} in container {self.label}: {exc}",
            task_id=self.task_id,
        )

    async def _gone_error(self, what: str, exc: BaseException) -> SandboxError:
        """The error for an engine failure: "gone" when the container no longer runs."""
        if not self._engine.is_docker_error(exc, 404, 409):
            return self._engine_error(what, exc)
        reason: UnavailableReason = "unreachable"
        detail = f"the engine answered {what} with: {exc}"
        try:
            info = await self._engine.call("a container inspect", self._container.show())
        except Exception:
            info = None
        if info is not None:
            state = info.get("State") or {}
            if state.get("Running"):
                return self._engine_error(what, exc)
            reason = "oom" if state.get("OOMKilled") else "exited"
            detail = (
                f"container {self.label} is {state.get('Status', 'stopped')} "
                f"(exit code {state.get('ExitCode')})"
            )
        return self._mark_gone(detail, reason=reason)

    async def snapshot(self) -> SandboxSnapshot:
        """Commit the container into an image ``hermes-async-snapshot:<hex>`` (paused meanwhile).

        **Cancellation**: the commit is shielded (its id is only in the reply), bounded by
        ``create_timeout``; an image made before a cancellation is removed.
        """
        self._check_open()
        tag = f"snap-{secrets.token_hex(6)}"
        ref = f"{SNAPSHOT_REPOSITORY}:{tag}"
        changes = [f"LABEL {SNAPSHOT_LABEL}=1", f"LABEL {_OWNER_LABEL}={owner_id()}"]
        try:
            with acquisition_scope(self.config.create_timeout):
                await self._engine.call(
                    "a container commit",
                    self._container.commit(
                        repository=SNAPSHOT_REPOSITORY, tag=tag, changes=changes
                    ),
                    timeout=self.config.create_timeout,
                )
        except TimeoutError as exc:
            raise SandboxError(
                f"committing container {self.label} did not finish within "
                f"{self.config.create_timeout:g} s",
                task_id=self.task_id,
            ) from exc
        except Exception as exc:
            if isinstance(exc, SandboxError):
                raise
            raise await self._gone_error("a container commit", exc) from exc
        config = self.config

        async def delete() -> None:
            engine = _Engine.open(config)
            try:
                await engine.call("an image removal", engine.client.images.delete(ref, force=True))
            except Exception as exc:
                if not engine.is_docker_error(exc, 404):
                    raise
            finally:
                await engine.aclose()

        spec = SandboxSpec(image=ref, workdir=self.workdir)
        return SandboxSnapshot(spec, ref, delete, delete_timeout=config.remove_timeout)

    async def alive(self) -> bool:
        """Open and its container running (one inspect, no ``exec``: a warm pool asks this
        before every hand-out, and an exec costs the engine three calls and a process)."""
        if self._closed or self._gone is not None:
            return False
        info = await self._engine.call("a container inspect", self._container.show())
        state = info.get("State") or {}
        return bool(state.get("Running")) and not state.get("OOMKilled")

    async def watch(self) -> None:
        """The disk-cap watchdog: past ``disk_limit_mb`` of ``SizeRw``, kill the container.

        **Cancellation**: cancelled at the release; nothing to clean up.
        """
        if not self.watchdog or self.config.disk_limit_mb is None:
            return
        cap = self.config.disk_limit_mb << 20
        while not self._closed and self._gone is None:
            await anyio.sleep(self.config.disk_check_interval_seconds)
            try:
                info = await self._engine.call(
                    "a container size inspect", self._container.show(size="1")
                )
            except Exception as exc:
                if self._engine.is_docker_error(exc, 404):
                    return
                logger.debug("disk watchdog of %s: %s", self.label, exc)
                continue
            size = int(info.get("SizeRw") or 0)
            if size <= cap:
                continue
            logger.warning(
                "container %s wrote %d bytes, over its disk cap of %d: killing it",
                self.label,
                size,
                cap,
            )
            self._mark_gone(
                f"its writable layer reached {size:,} bytes, over the "
                f"{self.config.disk_limit_mb} MiB disk cap",
                reason="disk",
            )
            try:
                await self._engine.call("a container kill", self._container.kill())
            except Exception as exc:
                logger.warning("the disk watchdog could not kill %s: %s", self.label, exc)
            return

    # ----------------------------------------------------------------- exec hooks

    async def _run_argv(self, run: ContainerExec) -> int:
        engine = self._engine
        argv, env, err = run.argv, run.env, run.err
        try:
            exe = await engine.call(
                "an exec create",
                self._container.exec(
                    cmd=argv,
                    stdout=True,
                    stderr=True,
                    environment=dict(env or {}),
                    workdir="/",
                    user=run.user or "",
                ),
            )
            stream = exe.start(detach=False)
            await engine.call("an exec start", stream.__aenter__())
            try:

                async def read_streams() -> None:
                    while (message := await stream.read_out()) is not None:
                        if message.stream == 1:
                            await run.write_out(bytes(message.data))
                        else:
                            err.feed(bytes(message.data))

                async def poll_exit() -> int | None:
                    info = await engine.call("an exec inspect", exe.inspect())
                    return None if info["Running"] else int(info["ExitCode"])

                code = await read_until_exit(read_streams, poll_exit)
            finally:
                await stream.close()
            if code is None:
                info = await engine.call("an exec inspect", exe.inspect())
                code = int(info["ExitCode"]) if info.get("ExitCode") is not None else -1
            return code
        except Exception as exc:
            if engine.is_docker_error(exc):
                raise await self._gone_error("an exec", exc) from exc
            raise

    async def _stage_file(self, path: str, data: bytes) -> None:
        await self._put_file(path, data, mode=0o600)

    # ----------------------------------------------------------------- files

    async def _get_tar(self, path: str) -> tarfile.TarFile:
        try:
            return await self._engine.call(
                f"an archive read of {path}", self._container.get_archive(path)
            )
        except Exception as exc:
            if self._engine.is_docker_error(exc, 404):
                raise FileNotFoundError(
                    f"no such file or directory in the sandbox: {path}"
                ) from exc
            if self._engine.is_docker_error(exc):
                raise OSError(f"cannot read {path} in the sandbox: {exc}") from exc
            raise

    async def _put_tar(self, dest_dir: str, data: bytes) -> None:
        try:
            await self._engine.call(
                f"an archive write to {dest_dir}",
                # A BytesIO body: aiohttp sends it in chunks, yielding to the loop between them.
                self._container.put_archive(dest_dir, io.BytesIO(data)),  # type: ignore[no-untyped-call]
            )
        except Exception as exc:
            if self._engine.is_docker_error(exc, 404):
                raise FileNotFoundError(f"no such directory in the sandbox: {dest_dir}") from exc
            if self._engine.is_docker_error(exc):
                raise OSError(f"cannot write into {dest_dir} in the sandbox: {exc}") from exc
            raise

    async def _mkdir(self, path: str) -> None:
        code, err = await self._helper(["mkdir", "-p", "--", path], self.config.api_timeout)
        if code != 0:
            raise OSError(f"cannot create directory {path} in the sandbox: {err.strip()}")

    async def _put_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        parent, name = posixpath.split(path)
        await self._put_tar_into(parent, single_file_tar(name, data, mode=mode))

    async def _put_tar_into(self, dest_dir: str, payload: bytes) -> None:
        """Upload ``payload`` into ``dest_dir``, creating it if needed.

        A large upload makes the folder first: the engine answers 404 before reading the body, and
        the unsent rest would leave the connection "closing" forever.
        """
        if len(payload) > _TRY_FIRST_BYTES:
            await self._mkdir(dest_dir)
            await self._put_tar(dest_dir, payload)
            return
        try:
            await self._put_tar(dest_dir, payload)
        except FileNotFoundError:
            await self._mkdir(dest_dir)
            await self._put_tar(dest_dir, payload)

    async def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path``, creating parent directories.

        **Cancellation**: the file may or may not have been written.
        """
        self._check_open()
        await self._put_file(self._resolve(path), data)

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        """Extract a tar archive into ``dest_dir``.

        **Cancellation**: the archive may be partly extracted.
        """
        self._check_open()
        check_tar_members(tar_data)
        await self._put_tar_into(self._resolve(dest_dir), tar_data)

    async def put_tree(self, dest_dir: str, source: Path) -> None:
        """Copy host folder ``source`` into ``dest_dir`` via a checked temporary tar.

        **Cancellation**: the ``tar`` is killed; the upload may be partial.
        """
        self._check_open()
        dest = self._resolve(dest_dir)
        with tempfile.TemporaryDirectory(prefix="hermes-put-tree-") as tmp:
            archive = os.path.join(tmp, "tree.tar")
            await pack_host_tree(str(source), archive)
            with tarfile.open(archive, mode="r:") as tf:
                checked_members(tf)
            await self._mkdir(dest)
            # A local file's descriptor; aiohttp reads it in chunks as it sends.
            with open(archive, "rb") as body:  # noqa: ASYNC230
                try:
                    await self._engine.call(
                        f"an archive write to {dest}",
                        self._container.put_archive(dest, body),  # type: ignore[no-untyped-call]
                        timeout=TRANSFER_TIMEOUT_SECONDS,
                    )
                except Exception as exc:
                    if self._engine.is_docker_error(exc):
                        raise OSError(f"cannot write into {dest} in the sandbox: {exc}") from exc
                    raise

    async def get_archive(self, path: str) -> bytes:
        """Return a tar of ``path`` (members ``.``, ``./x``; a file as its base name).

        **Cancellation**: nothing to clean up.
        """
        self._check_open()
        source = self._resolve(path)
        tar = await self._get_tar(source)
        return _relative_archive(tar)

    # ----------------------------------------------------------------- close

    async def aclose(self, interrupted: bool = False) -> None:
        """Remove the container and close the client. Idempotent; ``interrupted`` changes nothing.

        **Cancellation**: removal is one call bounded by ``remove_timeout``, under the release's
        scope. A container left behind is logged for the reaper; the client is closed either way.
        """
        if self._closed:
            return
        self._closed = True
        try:
            await self._engine.call(
                "a container removal",
                self._container.delete(force=True),
                timeout=self.config.remove_timeout,
            )
        except Exception as exc:
            if not self._engine.is_docker_error(exc, 404, 409):
                logger.warning(
                    "could not remove container %s (left to the orphan reaper): %s",
                    self.label,
                    exc,
                )
        finally:
            await self._engine.aclose()


def _relative_archive(tar: tarfile.TarFile) -> bytes:
    """Re-pack an engine archive (members ``top/...``) with names relative to ``top``."""
    members = tar.getmembers()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as out:
        if len(members) == 1 and not members[0].isdir():
            member = members[0]
            fileobj = tar.extractfile(member) if member.isfile() else None
            out.addfile(member, fileobj)
            return buf.getvalue()
        # Like `tar -C DIR -c .`: the directory itself is ".", its contents "./x/y".
        top = members[0].name.rstrip("/") if members else ""
        for member in members:
            name = member.name.rstrip("/")
            if name == top:
                member.name = "."
            elif top and name.startswith(top + "/"):
                member.name = "./" + name[len(top) + 1 :]
            fileobj = tar.extractfile(member) if member.isfile() else None
            out.addfile(member, fileobj)
    return buf.getvalue()
