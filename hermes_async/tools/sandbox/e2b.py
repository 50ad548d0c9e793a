"""The E2B sandbox backend: one E2B sandbox per rollout (extra ``[e2b]``).

The SDK driver for :mod:`hermes_async.tools.sandbox._remote`, on the ``e2b`` async API only
(asyncio-only: under trio creation raises ``AsyncBackendError``). ``E2B_API_KEY`` stays with
the SDK. The SDK calls used and a manual check with real credentials:
docs/decisions/037-e2b-daytona-apptainer.md.
"""

from __future__ import annotations

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
from hermes_async.tools.sandbox._sdk import error_named, import_sdk
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = ("E2BBackend", "E2BSandboxConfig", "e2b_credentials")

#: Where the SDK (and the preflight) look for the API key.
_E2B_API_KEY_ENV = "E2B_API_KEY"

_HINT = (
    "check E2B_API_KEY (and E2B_DOMAIN for a self-hosted E2B-compatible service) and network "
    "access, or use terminal_backend='local' or 'docker'"
)


@dataclass(frozen=True, slots=True)
class E2BSandboxConfig(RemoteSandboxConfig):
    """How E2B sandboxes are created (the shared fields: :class:`RemoteSandboxConfig`).

    Attributes:
        template: E2B template name or id (``base``: E2B's default Debian image).
    """

    template: str = "base"

    image_field: ClassVar[str] = "template"


def _import_e2b() -> Any:
    return import_sdk("e2b", backend="e2b", what="the e2b SDK")


_GONE = ("SandboxNotRunningException", "SandboxNotFoundException")


_ERRORS = SdkErrors(
    kind="E2B",
    gone=_GONE,
    gone_words="not running",
    auth="AuthenticationException",
    rate_limit="RateLimitException",
    file_missing="FileNotFoundException",
    timeout="TimeoutException",
    hint=_HINT,
)


class _Driver:
    """One E2B sandbox (:class:`~hermes_async.tools.sandbox._remote.RemoteDriver`)."""

    def __init__(self, sandbox: Any, config: E2BSandboxConfig) -> None:
        self._sb = sandbox
        self._config = config

    @property
    def sandbox_id(self) -> str:
        return str(self._sb.sandbox_id)

    async def run(self, command: str, *, env: Mapping[str, str] | None, timeout: float) -> str:
        try:
            result = await self._sb.commands.run(
                command,
                envs=dict(env) if env else None,
                timeout=timeout,
                request_timeout=self._config.call_timeout,
            )
        except Exception as exc:
            if error_named(exc, "CommandExitException"):
                return str(getattr(exc, "stdout", "") or "")
            raise _ERRORS.translate("a command", exc, self.sandbox_id) from exc
        return str(result.stdout or "")

    async def read(self, path: str) -> bytes:
        timeout = self._config.call_timeout
        return await _ERRORS.read(
            path,
            self._sb.files.read(path, format="bytes", request_timeout=timeout),
            self.sandbox_id,
        )

    async def write(self, path: str, data: bytes) -> None:
        timeout = self._config.call_timeout
        await _ERRORS.call(
            f"a write of {path}",
            self._sb.files.write(path, data, request_timeout=timeout),
            self.sandbox_id,
        )

    async def delete(self) -> None:
        await _ERRORS.delete(
            f"the kill of {self.sandbox_id}",
            self._sb.kill(request_timeout=self._config.delete_timeout),
        )


class _Client:
    """E2B's control plane (:class:`~hermes_async.tools.sandbox._remote.RemoteClient`)."""

    def __init__(self, e2b: Any, config: E2BSandboxConfig) -> None:
        self._e2b = e2b
        self._config = config

    async def create(self, labels: Mapping[str, str]) -> RemoteDriver:
        cfg = self._config
        sandbox = await _ERRORS.create(
            f"creating a sandbox from {cfg.template!r}",
            self._e2b.AsyncSandbox.create(
                template=cfg.template,
                timeout=cfg.sandbox_lifetime_seconds,
                metadata=dict(labels),
                envs=dict(cfg.env) or None,
                allow_internet_access=not cfg.block_network,
                request_timeout=cfg.create_timeout,
            ),
        )
        return _Driver(sandbox, cfg)

    async def list_ids(self, labels: Mapping[str, str]) -> list[tuple[str, dict[str, str]]]:
        async def listing() -> list[tuple[str, dict[str, str]]]:
            paginator = self._e2b.AsyncSandbox.list(
                query=self._e2b.SandboxQuery(metadata=dict(labels)),
                request_timeout=self._config.call_timeout,
            )
            found: list[tuple[str, dict[str, str]]] = []
            while paginator.has_next:
                for info in await paginator.next_items():
                    found.append((str(info.sandbox_id), dict(info.metadata or {})))
            return found

        return await _ERRORS.call("listing sandboxes", listing(), None)

    async def delete_id(self, sandbox_id: str) -> None:
        await _ERRORS.delete(
            f"the kill of {sandbox_id}",
            self._e2b.AsyncSandbox.kill(sandbox_id, request_timeout=self._config.delete_timeout),
        )

    async def aclose(self) -> None:
        """Nothing to close: the SDK's control-plane calls are per request."""


def _e2b_config_for(config: E2BSandboxConfig, spec: SandboxSpec | None) -> E2BSandboxConfig:
    """``config`` with a per-item spec applied; ``image`` names the template.

    E2B takes CPUs and memory from the template: its create call has no parameter for them.

    Raises:
        ConfigError: The spec asks for a local build.
    """
    return remote_config_for(config, spec, name="e2b")


class E2BBackend(RemoteBackend[E2BSandboxConfig]):
    """Creates E2B sandboxes: a ``SandboxManager`` factory over :class:`RemoteBackend`.

    Args:
        e2b: The ``e2b`` module, or a double (:class:`hermes_async.testing.e2b_double.FakeE2B`).
        run_id: This run's id (default: random); its sandboxes carry it as a label.
    """

    kind = "E2B"
    name = "e2b"
    sdk_library = "the e2b SDK (asyncio tasks and queues in its command handles)"
    credentials_hint = _HINT

    def __init__(
        self,
        config: E2BSandboxConfig | None = None,
        *,
        e2b: object | None = None,
        run_id: str | None = None,
    ) -> None:
        super().__init__(config or E2BSandboxConfig(), sdk=e2b, run_id=run_id)

    def _import_sdk(self) -> Any:
        return _import_e2b()

    def _make_client(self, sdk: Any, config: E2BSandboxConfig) -> RemoteClient:
        return _Client(sdk, config)


def e2b_credentials() -> str | None:
    """Where E2B credentials come from, or ``None`` when there are none."""
    return _E2B_API_KEY_ENV if os.environ.get(_E2B_API_KEY_ENV) else None
