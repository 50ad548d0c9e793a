"""Per-item sandboxes: a :class:`SandboxSpec` says how ONE rollout's sandbox is made.

An environment whose items need different machines (a Terminal-Bench task brings its own
image, CPU and memory limits, working directory and timeouts) returns a spec per item from
``HermesAgentBaseEnv.sandbox_spec(item)``; the rollout core registers it with the
:class:`~hermes_async.tools.sandbox.manager.SandboxManager` under the rollout's task id
(:meth:`~hermes_async.tools.sandbox.manager.SandboxManager.assign_spec`), and the manager
passes it to the backend factory when it creates that sandbox::

    spec = SandboxSpec(build_context=Path("task/environment"), cpus=1, memory_mb=2048)
    manager.assign_spec("task-1", spec)
    sandbox = await manager.get("task-1")      # factory("task-1", spec=spec)

What each built-in backend applies (a field it cannot apply is ignored, and says so here):

======================  =========  ========================================  ===============
field                   local      docker                                    modal
======================  =========  ========================================  ===============
image / build_context   ignored    image if the engine has it, else built    image (registry)
                                   once per content digest (else pulled)
image_map               ignored    applied to image and the FROM lines       ignored
cpus, memory_mb         ignored    ``NanoCpus``, ``Memory`` (= swap limit)   ``cpu``, ``memory``
storage_mb              ignored    ignored (overlay2 needs xfs quotas)       ignored
network_mode            ignored    ``NetworkMode``                           ``block_network``
workdir                 a folder   ``WorkingDir`` (default: image's WORKDIR)  ``workdir``
                        in the
                        sandbox
env                     added      added to the container's                  ignored
user                    ignored    ``User``                                  ignored
create / exec timeouts  exec only  both                                      both
======================  =========  ========================================  ===============

A factory takes a spec when its ``__call__`` accepts a ``spec`` keyword (the built-in ones
do); giving a spec to a factory that does not is a :class:`~hermes_async.errors.ConfigError`
naming it, never a silently ignored spec.
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
        image: The image to run (pulled when missing, if the backend may pull). With a
            ``build_context`` too, the image is used when the engine has it (Harbor's rule)
            and the context is built otherwise.
        build_context: A folder with a ``Dockerfile`` to build the image from; built once per
            content digest, behind the backend's build limiter.
        image_map: Image names replaced before use: ``image`` and the Dockerfile's ``FROM``
            lines (a mirror or a local stand-in for a registry image).
        build_timeout: Deadline of that build, in seconds.
        cpus: CPU limit (fractions allowed).
        memory_mb: Memory limit in MiB.
        storage_mb: Disk size in MiB (recorded; no built-in backend enforces it).
        network_mode: ``"none"``, ``"bridge"`` or a network name (Docker's vocabulary;
            Modal blocks the network for ``"none"``).
        workdir: The working directory of every command (absolute).
        env: Variables added to the sandbox's environment.
        user: The user commands run as (Docker).
        create_timeout: Deadline of creating this sandbox (the manager's, when None).
        exec_timeout: Default command timeout in this sandbox.
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
        spec: The spec of a sandbox started from the snapshot (for Docker: the committed image
            and the template's workdir, with the template spec's other fields).
        ref: What the backend calls it (a Docker image tag), for logs.
        delete: Removes it (the backend's; bounded by the caller).
        delete_timeout: That bound.
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
