"""Sandbox backends by name: the registry ``terminal_backend`` selects from.

``name -> builder(**options) -> factory(task_id)``, builders importing lazily, plus an
optional preflight run at start-up. The built-ins: docs/architecture.md, "Sandbox backends
by name".
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from hermes_async.errors import ConfigError, SandboxError
from hermes_async.tools.sandbox.base import SandboxFactory

__all__ = (
    "BACKEND_KINDS",
    "BackendBuilder",
    "BackendKind",
    "BackendPreflight",
    "available_backends",
    "check_backend_name",
    "make_backend_factory",
    "preflight_backend",
    "register_backend",
)

#: ``(**options) -> factory``: how a registered backend turns its options into a factory.
BackendBuilder = Callable[..., SandboxFactory]

#: ``async (**options) -> None``: proves a backend is usable before the first rollout.
BackendPreflight = Callable[..., Awaitable[None]]

#: The built-in names ``terminal_backend`` accepts.
BackendKind = Literal["local", "docker", "modal", "ssh", "singularity", "e2b", "daytona"]

#: The built-in backend names (registration order).
BACKEND_KINDS: tuple[str, ...] = (
    "local",
    "docker",
    "modal",
    "ssh",
    "singularity",
    "e2b",
    "daytona",
)

_REGISTRY: dict[str, BackendBuilder] = {}
_PREFLIGHTS: dict[str, BackendPreflight] = {}

_C = TypeVar("_C")

#: The reference's backends that this project does not implement: named in the error so a
#: ported config gets told what to do instead of only "unknown" (every one is built in now).
_REFERENCE_ONLY: tuple[str, ...] = ()


def _unknown_backend(kind: str) -> ConfigError:
    available = ", ".join(available_backends())
    if kind in _REFERENCE_ONLY:
        return ConfigError(
            f"terminal_backend {kind!r} (a hermes-agent backend) is not implemented in "
            f"hermes_async; available: {available} (docker or modal for isolated "
            "sandboxes), or register your own with "
            "hermes_async.tools.sandbox.backends.register_backend"
        )
    return ConfigError(
        f"unknown terminal_backend {kind!r}; available: {available} (or register your own "
        "with hermes_async.tools.sandbox.backends.register_backend)"
    )


def register_backend(
    name: str,
    builder: BackendBuilder,
    *,
    replace: bool = False,
    preflight: BackendPreflight | None = None,
) -> None:
    """Make backend ``name`` available to :func:`make_backend_factory`.

    ``builder`` is ``(**options) -> factory`` and raises ``TypeError`` or ``ConfigError`` for bad
    options; ``preflight`` is run by :func:`preflight_backend`.

    Raises:
        ValueError: ``name`` is empty, or already registered and ``replace`` is false.
    """
    if not name:
        raise ValueError("a sandbox backend needs a non-empty name")
    if name in _REGISTRY and not replace:
        raise ValueError(
            f"sandbox backend {name!r} is already registered; pass replace=True to replace it"
        )
    _REGISTRY[name] = builder
    if preflight is not None:
        _PREFLIGHTS[name] = preflight
    else:
        _PREFLIGHTS.pop(name, None)


def available_backends() -> tuple[str, ...]:
    """The registered backend names, in registration order."""
    return tuple(_REGISTRY)


def check_backend_name(kind: str) -> str:
    """Return ``kind`` if it is registered now.

    Raises:
        ConfigError: It is not (listing the registered ones, and for the reference's names we
            lack, what to do instead).
    """
    if kind not in _REGISTRY:
        raise _unknown_backend(kind)
    return kind


def make_backend_factory(kind: str, **options: object) -> SandboxFactory:
    """Return the ``factory(task_id) -> Sandbox`` for backend ``kind``.

    ``options`` are the fields of the backend's config class (``local_factory``'s keywords for
    ``local``), a test double (``modal=``, ``e2b=``, ``daytona=``), and for remote backends
    ``run_id=``: give a resumed run its previous id so the start-up sweep finds its leftovers.

    Raises:
        ConfigError: Unknown ``kind`` or option.
    """
    builder = _REGISTRY.get(kind)
    if builder is None:
        raise _unknown_backend(kind)
    try:
        return builder(**options)
    except TypeError as exc:
        raise ConfigError(f"invalid option for terminal_backend={kind!r}: {exc}") from exc


async def preflight_backend(kind: str, **options: object) -> None:
    """Check, before the first rollout, that backend ``kind`` can create sandboxes.

    Raises:
        ConfigError: Unknown ``kind`` or option, or a missing extra.
        SandboxError: The backend is unreachable or unauthenticated.

    **Cancellation**: whatever the check opened is closed.
    """
    if kind not in _REGISTRY:
        raise _unknown_backend(kind)
    hook = _PREFLIGHTS.get(kind)
    if hook is None:
        return
    try:
        await hook(**options)
    except TypeError as exc:
        raise ConfigError(f"invalid option for terminal_backend={kind!r}: {exc}") from exc


def _config(cls: type[_C], kind: str, options: dict[str, Any]) -> _C:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(options) - names)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)} for terminal_backend={kind!r}; "
            f"valid: {', '.join(sorted(names))}"
        )
    return cls(**options)


def _local_options(options: dict[str, Any]) -> dict[str, Any]:
    """``local_factory``'s arguments from a config's options (namespace fields given flat)."""
    from hermes_async.tools.sandbox.namespaces import NamespaceOptions

    flat = {f.name for f in dataclasses.fields(NamespaceOptions)} & set(options)
    if not flat:
        return options
    rest = {name: value for name, value in options.items() if name not in flat}
    return {**rest, "namespace": NamespaceOptions(**{name: options[name] for name in flat})}


def _local(**options: Any) -> SandboxFactory:
    from hermes_async.tools.sandbox.local import local_factory

    return local_factory(**_local_options(options))


async def _local_preflight(**options: Any) -> None:
    from hermes_async.tools.sandbox.local import local_preflight

    await local_preflight(**_local_options(options))


def _docker(**options: Any) -> SandboxFactory:
    from hermes_async.tools.sandbox.docker import DockerBackend, DockerSandboxConfig

    return DockerBackend(_config(DockerSandboxConfig, "docker", options))


def _ssh(**options: Any) -> SandboxFactory:
    from hermes_async.tools.sandbox.ssh import SshBackend, SshSandboxConfig

    return SshBackend(_config(SshSandboxConfig, "ssh", options))


async def _ssh_preflight(**options: Any) -> None:
    from hermes_async.tools.sandbox.ssh import ssh_preflight

    await ssh_preflight(**options)


def _singularity(**options: Any) -> SandboxFactory:
    from hermes_async.tools.sandbox.apptainer import ApptainerBackend, ApptainerSandboxConfig

    return ApptainerBackend(_config(ApptainerSandboxConfig, "singularity", options))


async def _singularity_preflight(**options: Any) -> None:
    from hermes_async.tools.sandbox.apptainer import ApptainerSandboxConfig, apptainer_preflight

    _config(ApptainerSandboxConfig, "singularity", options)
    await apptainer_preflight(**options)


def _modal(*, modal: object | None = None, **options: Any) -> SandboxFactory:
    from hermes_async.tools.sandbox.modal import ModalBackend, ModalSandboxConfig

    return ModalBackend(_config(ModalSandboxConfig, "modal", options), modal=modal)


async def _docker_preflight(**options: Any) -> None:
    from hermes_async.tools.sandbox.docker import DockerSandboxConfig, _Engine

    config = _config(DockerSandboxConfig, "docker", options)
    try:
        engine = _Engine.open(config)
    except SandboxError as exc:
        raise SandboxError(f"terminal_backend='docker': {exc.message}") from exc
    try:
        await engine.ping()
    except SandboxError as exc:
        raise SandboxError(
            f"terminal_backend='docker': {exc.message}; or run with --env.terminal_backend local"
        ) from exc
    finally:
        await engine.aclose()


def _modal_credentials() -> str | None:
    """Where Modal credentials come from, or ``None`` when there are none."""
    if os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET"):
        return "MODAL_TOKEN_ID/MODAL_TOKEN_SECRET"
    path = Path(os.environ.get("MODAL_CONFIG_PATH") or Path.home() / ".modal.toml")
    return str(path) if path.is_file() else None


def _cloud_preflight(
    name: str,
    kind: str,
    config_type: type[Any],
    options: dict[str, Any],
    injected: object | None,
    import_sdk: Callable[[], object],
    credentials: Callable[[], str | None],
    how: str,
) -> None:
    """A cloud backend's preflight: config, SDK and credentials (``how``: where to put them)."""
    _config(config_type, name, options)
    if injected is not None:
        return
    import_sdk()
    if credentials() is None:
        raise SandboxError(
            f"terminal_backend='{name}' but no {kind} credentials are configured: {how}, or "
            "run with --env.terminal_backend local or docker"
        )


async def _modal_preflight(*, modal: object | None = None, **options: Any) -> None:
    from hermes_async.tools.sandbox.modal import ModalSandboxConfig, _import_modal

    _cloud_preflight(
        "modal",
        "Modal",
        ModalSandboxConfig,
        options,
        modal,
        _import_modal,
        _modal_credentials,
        "set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET, or run `modal token new` (writes "
        "~/.modal.toml)",
    )


def _e2b(*, e2b: object | None = None, run_id: str | None = None, **options: Any) -> SandboxFactory:
    from hermes_async.tools.sandbox.e2b import E2BBackend, E2BSandboxConfig

    return E2BBackend(_config(E2BSandboxConfig, "e2b", options), e2b=e2b, run_id=run_id)


async def _e2b_preflight(
    *, e2b: object | None = None, run_id: str | None = None, **options: Any
) -> None:
    from hermes_async.tools.sandbox.e2b import E2BSandboxConfig, _import_e2b, e2b_credentials

    _cloud_preflight(
        "e2b",
        "E2B",
        E2BSandboxConfig,
        options,
        e2b,
        _import_e2b,
        e2b_credentials,
        "set E2B_API_KEY (and E2B_DOMAIN for a self-hosted E2B-compatible service)",
    )


def _daytona(
    *, daytona: object | None = None, run_id: str | None = None, **options: Any
) -> SandboxFactory:
    from hermes_async.tools.sandbox.daytona import DaytonaBackend, DaytonaSandboxConfig

    config = _config(DaytonaSandboxConfig, "daytona", options)
    return DaytonaBackend(config, daytona=daytona, run_id=run_id)


async def _daytona_preflight(
    *, daytona: object | None = None, run_id: str | None = None, **options: Any
) -> None:
    from hermes_async.tools.sandbox.daytona import (
        DaytonaSandboxConfig,
        _import_daytona,
        daytona_credentials,
    )

    _cloud_preflight(
        "daytona",
        "Daytona",
        DaytonaSandboxConfig,
        options,
        daytona,
        _import_daytona,
        daytona_credentials,
        "set DAYTONA_API_KEY (and DAYTONA_API_URL for a self-hosted Daytona)",
    )


for _name, _builder, _check in zip(
    BACKEND_KINDS,
    (_local, _docker, _modal, _ssh, _singularity, _e2b, _daytona),
    (
        _local_preflight,
        _docker_preflight,
        _modal_preflight,
        _ssh_preflight,
        _singularity_preflight,
        _e2b_preflight,
        _daytona_preflight,
    ),
    strict=True,
):
    register_backend(_name, _builder, preflight=_check)
