"""Sandbox backends by name: a small registry (what ``terminal_backend`` in the config selects).

::

    factory = make_backend_factory("docker", image="python:3.11-slim", network_mode="bridge")
    async with SandboxManager(factory, limits=limits) as manager:
        ...

A backend is registered as ``name -> builder``: the builder takes the backend's options as
keyword arguments and returns the ``factory(task_id) -> Sandbox`` a ``SandboxManager`` calls.
Everything else a backend does happens through the :class:`~hermes_async.tools.sandbox.base.
Sandbox` lifecycle: the factory creates (under the manager's ``sandbox_create`` limiter and
deadline), ``exec_request`` runs commands, ``aclose(interrupted=...)`` releases. So adding a
backend is ``register_backend("mine", build_mine)``; nothing here branches on names.

Built in: ``"local"`` needs nothing extra and runs on asyncio and trio; ``"docker"`` needs the
``[docker]`` extra and ``"modal"`` the ``[modal]`` extra, and both run only under asyncio (the
check happens when the first sandbox is created, so building the factory never fails for that
reason). Their builders import the backend module lazily, so a missing extra costs nothing
until it is used. Options are the fields of the backend's config class; an unknown option is a
:class:`~hermes_async.errors.ConfigError` naming the valid ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from hermes_async.errors import ConfigError
from hermes_async.tools.sandbox.manager import SandboxFactory

__all__ = (
    "BACKEND_KINDS",
    "BackendBuilder",
    "BackendKind",
    "available_backends",
    "make_backend_factory",
    "register_backend",
)

#: ``(**options) -> factory``: how a registered backend turns its options into a factory.
BackendBuilder = Callable[..., SandboxFactory]

#: The built-in names ``terminal_backend`` accepts.
BackendKind = Literal["local", "docker", "modal"]

#: The built-in backend names (registration order).
BACKEND_KINDS: tuple[str, ...] = ("local", "docker", "modal")

_REGISTRY: dict[str, BackendBuilder] = {}

_C = TypeVar("_C")


def register_backend(name: str, builder: BackendBuilder, *, replace: bool = False) -> None:
    """Make backend ``name`` available to :func:`make_backend_factory`.

    Args:
        name: What ``terminal_backend`` names it (non-empty).
        builder: ``(**options) -> factory``; raise ``TypeError`` or
            :class:`~hermes_async.errors.ConfigError` for bad options.
        replace: Allow replacing an existing registration (e.g. a test double).

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


def available_backends() -> tuple[str, ...]:
    """The registered backend names, in registration order."""
    return tuple(_REGISTRY)


def make_backend_factory(kind: str, **options: object) -> SandboxFactory:
    """Return the ``factory(task_id) -> Sandbox`` for backend ``kind``.

    Args:
        kind: A registered name: ``"local"``, ``"docker"``, ``"modal"`` or one of yours.
        **options: For ``local``, the keyword arguments of
            :func:`~hermes_async.tools.sandbox.local.local_factory`; for ``docker``, fields of
            :class:`~hermes_async.tools.sandbox.docker.DockerSandboxConfig`; for ``modal``,
            fields of :class:`~hermes_async.tools.sandbox.modal.ModalSandboxConfig` plus
            ``modal=`` (a double for tests).

    Raises:
        ConfigError: Unknown ``kind`` (the message lists the available ones) or option.
    """
    builder = _REGISTRY.get(kind)
    if builder is None:
        raise ConfigError(
            f"unknown terminal_backend {kind!r}; available: {', '.join(available_backends())}"
        )
    try:
        return builder(**options)
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


def _local(**options: Any) -> SandboxFactory:
    from hermes_async.tools.sandbox.local import local_factory

    return local_factory(**options)


def _docker(**options: Any) -> SandboxFactory:
    from hermes_async.tools.sandbox.docker import DockerBackend, DockerSandboxConfig

    return DockerBackend(_config(DockerSandboxConfig, "docker", options))


def _modal(*, modal: object | None = None, **options: Any) -> SandboxFactory:
    from hermes_async.tools.sandbox.modal import ModalBackend, ModalSandboxConfig

    return ModalBackend(_config(ModalSandboxConfig, "modal", options), modal=modal)


for _name, _builder in zip(BACKEND_KINDS, (_local, _docker, _modal), strict=True):
    register_backend(_name, _builder)
