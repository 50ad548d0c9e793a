"""The Daytona sandbox backend: one Daytona sandbox per rollout (extra ``[daytona]``).

The SDK driver for :mod:`hermes_async.tools.sandbox._remote`, on the ``daytona`` async client
only (asyncio-only: under trio creation raises ``AsyncBackendError``). API keys stay with the
SDK. The SDK calls used and a manual check with real credentials:
docs/decisions/037-e2b-daytona-apptainer.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hermes_async.tools.sandbox._remote import (
    RemoteBackend,
    RemoteClient,
    RemoteDriver,
    RemoteSandboxConfig,
    SdkErrors,
    remote_config_for,
)
from hermes_async.tools.sandbox._sdk import import_sdk
from hermes_async.tools.sandbox.docker import DEFAULT_DOCKER_IMAGE
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "DEFAULT_DAYTONA_IMAGE",
    "DaytonaBackend",
    "DaytonaSandboxConfig",
    "daytona_credentials",
)

#: Where the SDK (and the preflight) look for the API key.
_DAYTONA_API_KEY_ENV = "DAYTONA_API_KEY"

#: The reference's default image (``TERMINAL_DAYTONA_IMAGE``).
DEFAULT_DAYTONA_IMAGE = DEFAULT_DOCKER_IMAGE

_HINT = (
    "check DAYTONA_API_KEY (and DAYTONA_API_URL for a self-hosted Daytona) and network "
    "access, or use terminal_backend='local' or 'docker'"
)


@dataclass(frozen=True, slots=True)
class DaytonaSandboxConfig(RemoteSandboxConfig):
    """How Daytona sandboxes are created (the shared fields: :class:`RemoteSandboxConfig`).

    Attributes:
        auto_stop_minutes: Daytona stops a sandbox idle this long (0: never).
        target: Daytona region (``None``: the account's default).
    """

    workdir: str = "/root"
    home: str = "/root"
    image_field: ClassVar[str] = "image"

    image: str = DEFAULT_DAYTONA_IMAGE
    auto_stop_minutes: int = 60
    target: str | None = None


def _import_daytona() -> Any:
    return import_sdk("daytona", backend="daytona", what="the daytona SDK")


_ERRORS = SdkErrors(
    kind="Daytona",
    gone=("DaytonaNotFoundError",),
    gone_words="not found",
    auth="DaytonaAuthenticationError",
    rate_limit="DaytonaRateLimitError",
    file_missing="DaytonaFileNotFoundError",
    timeout="DaytonaTimeoutError",
    hint=_HINT,
)


def _whole(value: float) -> int:
    """``value`` rounded up to the whole number the SDK takes (at least 1)."""
    return max(1, math.ceil(value))


class _Driver:
    """One Daytona sandbox (:class:`~hermes_async.tools.sandbox._remote.RemoteDriver`)."""

    def __init__(self, client: Any, sandbox: Any, config: DaytonaSandboxConfig) -> None:
        self._client = client
        self._sb = sandbox
        self._config = config

    @property
    def sandbox_id(self) -> str:
        return str(self._sb.id)

    async def run(self, command: str, *, env: Mapping[str, str] | None, timeout: float) -> str:
        response = await _ERRORS.call(
            "a command",
            self._sb.process.exec(
                command,
                env=dict(env) if env else None,
                timeout=_whole(timeout) if timeout else None,
            ),
            self.sandbox_id,
        )
        return str(response.result or "")

    async def read(self, path: str) -> bytes:
        timeout = _whole(self._config.call_timeout)
        return await _ERRORS.read(path, self._sb.fs.download_file(path, timeout), self.sandbox_id)

    async def write(self, path: str, data: bytes) -> None:
        timeout = _whole(self._config.call_timeout)
        await _ERRORS.call(
            f"a write of {path}", self._sb.fs.upload_file(data, path, timeout), self.sandbox_id
        )

    async def delete(self) -> None:
        await _ERRORS.delete(
            f"the delete of {self.sandbox_id}",
            self._client.delete(self._sb, timeout=self._config.delete_timeout),
        )


class _Client:
    """Daytona's API (:class:`~hermes_async.tools.sandbox._remote.RemoteClient`)."""

    def __init__(self, daytona: Any, config: DaytonaSandboxConfig) -> None:
        self._daytona = daytona
        self._config = config
        self._client: Any = None

    def _api(self) -> Any:
        if self._client is None:
            sdk_config = self._daytona.DaytonaConfig(target=self._config.target)
            self._client = self._daytona.AsyncDaytona(sdk_config)
        return self._client

    async def create(self, labels: Mapping[str, str]) -> RemoteDriver:
        cfg = self._config
        d = self._daytona
        params = d.CreateSandboxFromImageParams(
            image=cfg.image,
            labels=dict(labels),
            env_vars=dict(cfg.env),
            resources=d.Resources(cpu=_whole(cfg.cpus), memory=_whole(cfg.memory_mb / 1024)),
            network_block_all=cfg.block_network,
            auto_stop_interval=cfg.auto_stop_minutes,
            ttl_minutes=_whole(cfg.sandbox_lifetime_seconds / 60),
        )
        client = self._api()
        sandbox = await _ERRORS.create(
            f"creating a sandbox from {cfg.image!r}",
            client.create(params, timeout=cfg.create_timeout),
        )
        return _Driver(client, sandbox, cfg)

    async def list_ids(self, labels: Mapping[str, str]) -> list[tuple[str, dict[str, str]]]:
        async def listing() -> list[tuple[str, dict[str, str]]]:
            query = self._daytona.ListSandboxesQuery(labels=dict(labels))
            timeout = self._config.call_timeout
            return [
                (str(sandbox.id), dict(sandbox.labels or {}))
                async for sandbox in self._api().list(query, request_timeout=timeout)
            ]

        return await _ERRORS.call("listing sandboxes", listing(), None)

    async def delete_id(self, sandbox_id: str) -> None:
        client = self._api()

        async def get_and_delete() -> None:
            timeout = self._config.call_timeout
            sandbox = await client.get(sandbox_id, request_timeout=timeout)
            await client.delete(sandbox, timeout=self._config.delete_timeout)

        await _ERRORS.delete(f"the delete of {sandbox_id}", get_and_delete())

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()


def _daytona_config_for(
    config: DaytonaSandboxConfig, spec: SandboxSpec | None
) -> DaytonaSandboxConfig:
    """``config`` with a per-item spec applied.

    Raises:
        ConfigError: The spec asks for a local build.
    """
    return remote_config_for(config, spec, name="daytona")


class DaytonaBackend(RemoteBackend[DaytonaSandboxConfig]):
    """Creates Daytona sandboxes: a ``SandboxManager`` factory over :class:`RemoteBackend`.

    Args:
        daytona: The ``daytona`` module, or a double
            (:class:`hermes_async.testing.daytona_double.FakeDaytona`).
        run_id: This run's id (default: random); its sandboxes carry it as a label.
    """

    kind = "Daytona"
    name = "daytona"
    sdk_library = "the daytona SDK (aiohttp)"
    credentials_hint = _HINT

    def __init__(
        self,
        config: DaytonaSandboxConfig | None = None,
        *,
        daytona: object | None = None,
        run_id: str | None = None,
    ) -> None:
        super().__init__(config or DaytonaSandboxConfig(), sdk=daytona, run_id=run_id)

    def _import_sdk(self) -> Any:
        return _import_daytona()

    def _make_client(self, sdk: Any, config: DaytonaSandboxConfig) -> RemoteClient:
        return _Client(sdk, config)


def daytona_credentials() -> str | None:
    """Where Daytona credentials come from, or ``None`` when there are none."""
    if os.environ.get(_DAYTONA_API_KEY_ENV):
        return _DAYTONA_API_KEY_ENV
    if os.environ.get("DAYTONA_JWT_TOKEN") and os.environ.get("DAYTONA_ORGANIZATION_ID"):
        return "DAYTONA_JWT_TOKEN/DAYTONA_ORGANIZATION_ID"
    return None
