"""Per-group snapshots: set up one sandbox, snapshot it, start the group's rollouts from it.

Every rollout of a group starts from the same prepared state (task files written, setup
commands run). Built from scratch, that setup runs ``group_size`` times at once; with a
snapshot it runs once::

    setup = RolloutSetup(sandboxes=manager, sandbox_setup=prepare)  # async (sandbox) -> None
    group = await run_group(client, messages, tools, size=8, setup=setup)

:func:`prepare_group` creates the first rollout's sandbox (from the group's spec), runs the
setup in it and asks it for a :class:`SandboxSnapshot` (:meth:`Sandbox.snapshot`); that
sandbox is the first rollout's, and the group's other rollouts are created from the
snapshot's spec, each its own isolated sandbox. The snapshot is deleted when the group ends
(shielded, bounded).

Backends: Docker commits the container (an image labelled as ours, removed after the group);
a backend without snapshots (``Sandbox.snapshot`` returns ``None``: local, Modal, E2B,
Daytona, ssh, Apptainer here) gets the setup run in each rollout's sandbox instead, the same
state by another road. A setup that fails in the template falls back the same way, so each
rollout meets (and is retried for) its own failure.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from hermes_async.tools.sandbox.spec import SandboxSnapshot, SandboxSpec

if TYPE_CHECKING:
    from hermes_async.tools.sandbox.base import Sandbox
    from hermes_async.tools.sandbox.manager import SandboxManager

__all__ = ("SandboxSetup", "prepare_group")

logger = logging.getLogger(__name__)

#: ``async (sandbox) -> None``: what makes a fresh sandbox the state a rollout starts from.
SandboxSetup = Callable[["Sandbox"], Awaitable[None]]


async def prepare_group(
    manager: SandboxManager,
    spec: SandboxSpec | None,
    setup: SandboxSetup,
    *,
    task_id: str,
) -> SandboxSnapshot | None:
    """Set up the sandbox of ``task_id`` (the group's first rollout) and snapshot it.

    That sandbox stays created for its rollout: it is in the prepared state already, so the
    group needs one creation fewer; the other rollouts start from the snapshot. ``None`` when
    the backend cannot snapshot (the sandbox stays too, not set up: its rollout runs the setup
    like the others) or when the setup or the snapshot failed (the sandbox is released: the
    rollouts run the setup themselves, each meeting its own failure).

    **Cancellation**: the sandbox is released (shielded, bounded by the manager); a snapshot
    taken before the cancellation is deleted (shielded, bounded).
    """
    if spec is not None:
        manager.assign_spec(task_id, spec)
    snapshot: SandboxSnapshot | None = None
    try:
        template = await manager.get(task_id)
        if not template.can_snapshot():
            return None
        try:
            await setup(template)
            snapshot = await template.snapshot()
        except Exception as exc:  # the rollouts run the setup themselves and meet it there
            logger.warning(
                "group template %s: %s: %s; each rollout runs the setup itself",
                task_id,
                type(exc).__name__,
                exc,
            )
            await manager.release(task_id)
            return None
    except BaseException:
        await manager.release(task_id, interrupted=True)
        if snapshot is not None:
            await snapshot.aclose()
        raise
    # The group's spec, started from the snapshot: its image and workdir win, nothing is built.
    base = spec or SandboxSpec()
    merged = dataclasses.replace(
        base,
        image=snapshot.spec.image,
        build_context=None,
        workdir=snapshot.spec.workdir or base.workdir,
    )
    return dataclasses.replace(snapshot, spec=merged)
