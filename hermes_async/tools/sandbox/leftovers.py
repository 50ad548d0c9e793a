"""Local sandboxes a crashed owner left behind: owned roots, and the sweep that finds them.

A worker claims its own root (:func:`claim_root`), tagged with its process; a sweep
removes only roots whose owner is gone. Workers sweep at start, reaping a predecessor's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from dataclasses import dataclass

import anyio

from hermes_async.errors import ConfigError
from hermes_async.tools.sandbox.host import DirectoryRemover
from hermes_async.tools.sandbox.local import MARKER_FILE, SANDBOX_DIR_PREFIX
from hermes_async.tools.sandbox.processes import (
    ProcessSweeper,
    process_tag,
    tag_alive,
)

__all__ = (
    "OWNER_FILE",
    "SweepReport",
    "claim_root",
    "count_sandboxes",
    "release_root",
    "sweep_dead_roots",
)

logger = logging.getLogger(__name__)

#: The file in an owned root that names its owner (a process tag).
OWNER_FILE = ".owner"

#: Roots this process holds (two owners in one process would share a tag).
_CLAIMED: set[str] = set()


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What a sweep removed.

    Attributes:
        processes: Processes killed (process mode; a namespaced world dies with its owner).
    """

    roots: int = 0
    sandboxes: int = 0
    processes: int = 0

    def __add__(self, other: SweepReport) -> SweepReport:
        return SweepReport(
            self.roots + other.roots,
            self.sandboxes + other.sandboxes,
            self.processes + other.processes,
        )


def _owner(root: str) -> str | None:
    try:
        with open(os.path.join(root, OWNER_FILE), encoding="ascii", errors="replace") as f:
            return f.read(64).strip()
    except OSError:
        return None


def _write_owner(root: str, tag: str) -> None:
    with open(os.path.join(root, OWNER_FILE), "w", encoding="ascii") as f:
        f.write(tag)


def _sandbox_dirs(root: str) -> list[str]:
    with contextlib.suppress(OSError):
        return [
            os.path.join(root, name)
            for name in os.listdir(root)
            if name.startswith(SANDBOX_DIR_PREFIX)
        ]
    return []


def _marker(sandbox_dir: str) -> str | None:
    try:
        with open(os.path.join(sandbox_dir, MARKER_FILE), encoding="ascii") as f:
            return f.read(64).strip() or None
    except (OSError, UnicodeDecodeError):
        return None


async def claim_root(parent: str, name: str) -> str:
    """Make ``parent/name`` this process's own root, sweeping a dead owner's leftovers first.

    ``name`` is the owner's, stable across its restarts.

    Raises:
        ConfigError: A live process owns that root (two workers with one name), or the
            directory cannot be made.

    **Cancellation**: a sweep cut short leaves the rest to the next one.
    """
    if not name or "/" in name or name in (".", ".."):
        raise ConfigError(f"a sandbox root name must be a plain directory name, got {name!r}")
    root = os.path.join(parent, name)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the sandbox root {root!r}: {exc}") from exc
    owner = _owner(root)
    mine = process_tag()
    if root in _CLAIMED or (owner is not None and owner != mine and tag_alive(owner)):
        raise ConfigError(
            f"the sandbox root {root!r} belongs to a running process ({owner}); give this "
            "worker another name"
        )
    if owner != mine:
        report = await _sweep_root(root)
        if report.sandboxes:
            logger.info(
                "reaped %d sandbox(es) of the previous owner of %s (%d processes killed)",
                report.sandboxes,
                root,
                report.processes,
            )
    _write_owner(root, mine)
    _CLAIMED.add(root)
    return root


async def release_root(root: str) -> None:
    """Give up a root :func:`claim_root` returned: remove it (its sandboxes must be closed).

    **Cancellation**: the removal is the one bounded ``rm`` of ``DirectoryRemover``.
    """
    _CLAIMED.discard(root)
    await DirectoryRemover().remove(root)


async def sweep_dead_roots(parent: str) -> SweepReport:
    """Remove every root under ``parent`` whose owner is gone; other directories are left alone.

    **Cancellation**: a sweep cut short leaves the rest to the next one.
    """
    total = SweepReport()
    try:
        names = os.listdir(parent)
    except OSError:
        names = []
    for name in names:
        root = os.path.join(parent, name)
        owner = _owner(root)
        if owner is None or tag_alive(owner):
            continue
        report = await _sweep_root(root)
        await DirectoryRemover().remove(root)
        total += SweepReport(1, report.sandboxes, report.processes)
    if total.roots:
        logger.info(
            "swept %d root(s) of dead workers under %s: %d sandbox(es), %d process(es)",
            total.roots,
            parent,
            total.sandboxes,
            total.processes,
        )
    return total


async def _sweep_root(root: str) -> SweepReport:
    """Kill the marked processes of every sandbox directory in ``root``; remove the directories."""
    dirs = _sandbox_dirs(root)
    if not dirs:
        return SweepReport()
    sweeper = ProcessSweeper()
    killed = 0
    for marker in filter(None, map(_marker, dirs)):
        killed += len(await sweeper.kill_round(marker, (), signal.SIGKILL))
    remover = DirectoryRemover()
    async with anyio.create_task_group() as tg:  # removals that arrive together share one rm
        for path in dirs:
            tg.start_soon(remover.remove, path)
    return SweepReport(0, len(dirs), killed)


def count_sandboxes(parent: str) -> int:
    """Local sandbox directories under ``parent``'s roots (and directly in it): what is left."""
    count = len(_sandbox_dirs(parent))
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            count += len(_sandbox_dirs(os.path.join(parent, name)))
    return count
