"""Choose a sandbox backend by name: what ``terminal_backend`` in the environment config selects.

::

    factory = make_backend_factory("docker", image="python:3.11-slim", network_mode="bridge")
    async with SandboxManager(factory, limits=limits) as manager:
        ...

``"local"`` needs nothing extra and runs on asyncio and trio; ``"docker"`` needs the
``[docker]`` extra and ``"modal"`` the ``[modal]`` extra, and both run only under asyncio (the
check happens when the first sandbox is created, so building the factory never fails for that
reason). Options are the fields of the backend's config class; an unknown option is a
:class:`~hermes_async.errors.ConfigError` naming the valid ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Literal, get_args

from hermes_async.errors import ConfigError
from hermes_async.tools.sandbox.base import Sandbox

__all__ = ["BACKEND_KINDS", "BackendKind", "make_backend_factory"]

BackendKind = Literal["local", "docker", "modal"]

#: The names ``terminal_backend`` accepts.
BACKEND_KINDS: tuple[str, ...] = get_args(BackendKind)


def make_backend_factory(kind: str, **options: object) -> Callable[[str], Awaitable[Sandbox]]:
    """Return the ``factory(task_id) -> Sandbox`` for backend ``kind``.

    Args:
        kind: ``"local"``, ``"docker"`` or ``"modal"`` (``terminal_backend``).
        **options: For ``local``, the keyword arguments of
            :func:`~hermes_async.tools.sandbox.local.local_factory`; for ``docker``, fields of
            :class:`~hermes_async.tools.sandbox.docker.DockerSandboxConfig`; for ``modal``,
            fields of :class:`~hermes_async.tools.sandbox.modal.ModalSandboxConfig` plus
            ``modal=`` (a double for tests).

    Raises:
        ConfigError: Unknown ``kind`` or option.
    """
    if kind == "local":
        from hermes_async.tools.sandbox.local import local_factory

        try:
            return local_factory(**options)  # type: ignore[arg-type]
        except TypeError as exc:
            raise ConfigError(f"invalid option for terminal_backend='local': {exc}") from exc
    if kind == "docker":
        from hermes_async.tools.sandbox.docker import DockerBackend, DockerSandboxConfig

        return DockerBackend(_build(DockerSandboxConfig, "docker", options))
    if kind == "modal":
        from hermes_async.tools.sandbox.modal import ModalBackend, ModalSandboxConfig

        modal = options.pop("modal", None)
        return ModalBackend(_build(ModalSandboxConfig, "modal", options), modal=modal)
    raise ConfigError(f"unknown terminal_backend {kind!r}; available: {', '.join(BACKEND_KINDS)}")


def _build(cls: Any, kind: str, options: dict[str, object]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)} for terminal_backend={kind!r}; "
            f"valid: {', '.join(sorted(names))}"
        )
    return cls(**options)
