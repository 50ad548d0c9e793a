"""Per-group snapshots: set up one sandbox, snapshot it, start the group's rollouts from it.

The setup then runs once instead of ``group_size`` times. Docker commits the container; a
backend without snapshots (``Sandbox.snapshot`` returns ``None``) runs the setup in each
rollout's sandbox instead, as does a setup that fails in the template, so each rollout meets
its own failure. The snapshot is deleted when the group ends (shielded, bounded).
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

    That sandbox stays for its rollout. ``None`` when the backend cannot snapshot, or when the
    setup or snapshot failed (the sandbox is then released).

    **Cancellation**: the sandbox is released and a snapshot already taken is deleted
    (shielded, bounded).
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
