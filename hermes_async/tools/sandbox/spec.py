"""Per-item sandboxes: a :class:`SandboxSpec` says how ONE rollout's sandbox is made.

``HermesAgentBaseEnv.sandbox_spec(item)`` returns one; the manager passes it to the factory
(``factory(task_id, spec=spec)``). A spec given to a factory without a ``spec`` keyword is a
``ConfigError``, never silently ignored. What each backend applies: docs/architecture.md,
"What each backend applies of a SandboxSpec".
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hermes_async._checks import ABSOLUTE_PATH, POSITIVE, check_fields
from hermes_async._cleanup import bounded_cleanup
from hermes_async.errors import ConfigError

__all__ = ("DEFAULT_SNAPSHOT_DELETE_SECONDS", "SandboxSnapshot", "SandboxSpec", "accepts_spec")

logger = logging.getLogger("hermes_async.tools.sandbox.snapshot")


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """How one rollout's sandbox is created (``None`` fields: the backend's configuration).

    Attributes:
        image: The image to run. With a ``build_context`` too, it is used when the engine has
            it (Harbor's rule) and the context is built otherwise.
        build_context: A folder with a ``Dockerfile``; built once per content digest.
        image_map: Image names replaced in ``image`` and the Dockerfile's ``FROM`` lines.
        storage_mb: Disk size in MiB (recorded; no built-in backend enforces it).
        network_mode: ``"none"``, ``"bridge"`` or a network name (Docker's vocabulary).
        workdir: The working directory of every command (absolute).
        user: The user commands run as (Docker).
        create_timeout: Deadline of creating this sandbox (the manager's, when None).
        labels: Extra container labels (Docker).
    """

    image: str | None = None
    build_context: Path | None = None
    image_map: Mapping[str, str] = field(default_factory=dict)
    build_timeout: float = 600.0
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    network_mode: str | None = None
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    create_timeout: float | None = None
    exec_timeout: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self, ("workdir",), ABSOLUTE_PATH.unless_none())
        if self.build_context is not None and not (self.build_context / "Dockerfile").is_file():
            raise ConfigError(
                f"SandboxSpec.build_context {str(self.build_context)!r} has no Dockerfile; "
                "point it at the folder holding the Dockerfile"
            )
        check_fields(
            self,
            ("cpus", "build_timeout", "create_timeout", "exec_timeout"),
            POSITIVE.unless_none(),
        )
        for name in ("memory_mb", "storage_mb"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"SandboxSpec.{name} must be >= 1 MiB, got {value!r}")


def accepts_spec(factory: object) -> bool:
    """Whether ``factory(task_id, spec=...)`` is a valid call (its signature says so)."""
    try:
        params = inspect.signature(factory).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return "spec" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


#: Bound of deleting one snapshot (a Docker image removal).
DEFAULT_SNAPSHOT_DELETE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class SandboxSnapshot:
    """A sandbox's state, frozen: ``spec`` creates new sandboxes from it.

    Attributes:
        ref: What the backend calls it (a Docker image tag), for logs.
        delete: Removes it (bounded by ``delete_timeout``).
    """

    spec: SandboxSpec
    ref: str
    delete: Callable[[], Awaitable[None]]
    delete_timeout: float = DEFAULT_SNAPSHOT_DELETE_SECONDS

    async def aclose(self) -> None:
        """Delete the snapshot; never raises (logged).

        **Cancellation**: shielded, bounded by ``delete_timeout``.
        """
        await bounded_cleanup(
            f"delete the snapshot {self.ref}",
            self.delete,
            timeout=self.delete_timeout,
            reason="its group ended",
            log=logger,
        )
