"""Sandbox roots owned by a process, and the sweep that reaps a dead owner's sandboxes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from hermes_async.errors import ConfigError
from hermes_async.tools.sandbox.leftovers import (
    OWNER_FILE,
    claim_root,
    count_sandboxes,
    release_root,
    sweep_dead_roots,
)
from hermes_async.tools.sandbox.local import LocalSandbox, local_factory
from hermes_async.tools.sandbox.processes import (
    SANDBOX_MARKER_ENV,
    find_sandbox_processes,
    process_tag,
    tag_alive,
)

pytestmark = pytest.mark.anyio

#: A tag no process can have (pid 2^22 + 1 is past Linux's pid_max).
DEAD_TAG = "4194305-1"


def test_a_process_tag_names_a_live_process_only() -> None:
    assert tag_alive(process_tag())
    assert not tag_alive(DEAD_TAG)
    assert not tag_alive(f"{os.getpid()}-1")  # this pid, another start time: a reused pid
    assert not tag_alive("garbage")


async def test_a_root_is_refused_to_a_second_live_owner(tmp_path: Path) -> None:
    root = await claim_root(str(tmp_path), "w0")
    assert (Path(root) / OWNER_FILE).read_text() == process_tag()
    with pytest.raises(ConfigError, match="belongs to a running process"):
        await claim_root(str(tmp_path), "w0")  # a second owner in this very process
    await release_root(root)
    assert not Path(root).exists()
    root = await claim_root(str(tmp_path), "w0")
    release_root_later = root
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (Path(root) / OWNER_FILE).write_text(process_tag(other.pid))
        with pytest.raises(ConfigError, match=r"belongs to a running process .*another name"):
            await claim_root(str(tmp_path), "w0")
    finally:
        other.kill()
        other.wait()
    await release_root(release_root_later)
    with pytest.raises(ConfigError, match="plain directory name"):
        await claim_root(str(tmp_path), "../x")


async def test_a_dead_owners_sandboxes_and_their_processes_are_reaped(tmp_path: Path) -> None:
    # A crashed worker's root: its owner is gone, a sandbox directory is left, and a process
    # that left the sandbox's sessions (setsid) still carries the sandbox's marker.
    dead = tmp_path / "dead-worker"
    dead.mkdir()
    (dead / OWNER_FILE).write_text(DEAD_TAG)
    factory = local_factory(str(dead), isolation="process")
    sandbox = await factory("t1")
    assert isinstance(sandbox, LocalSandbox)
    escaped = subprocess.Popen(
        ["setsid", "sleep", "300"], env={**os.environ, SANDBOX_MARKER_ENV: sandbox.sandbox_id}
    )
    # Until it has exec'd, the child's environ is ours (no marker): the sweep would miss it.
    # Until setsid() has run, it is in our session and group: the sweep kills it alone then.
    marker = f"{SANDBOX_MARKER_ENV}={sandbox.sandbox_id}".encode()
    with anyio.fail_after(10):
        while marker not in Path(f"/proc/{escaped.pid}/environ").read_bytes() or (
            os.getsid(escaped.pid) != escaped.pid
        ):
            await anyio.sleep(0.01)
    live = Path(await claim_root(str(tmp_path), "live-worker"))
    (live / "hermes-sbx-keep-1").mkdir()
    try:
        assert count_sandboxes(str(tmp_path)) == 2
        report = await sweep_dead_roots(str(tmp_path))
        with anyio.fail_after(10):
            while escaped.poll() is None:
                await anyio.sleep(0.05)
    finally:
        escaped.kill()
        escaped.wait()
    assert (report.roots, report.sandboxes) == (1, 1)
    assert report.processes >= 1
    assert not dead.exists()
    assert find_sandbox_processes(sandbox.sandbox_id) == []
    assert (live / "hermes-sbx-keep-1").is_dir()  # a live owner's root is never touched
    assert count_sandboxes(str(tmp_path)) == 1
    await release_root(str(live))


async def test_claiming_a_dead_owners_root_reaps_it_first(tmp_path: Path) -> None:
    root = tmp_path / "w0"
    root.mkdir()
    (root / OWNER_FILE).write_text(DEAD_TAG)
    (root / "hermes-sbx-old-1" / "work").mkdir(parents=True)
    assert await claim_root(str(tmp_path), "w0") == str(root)
    assert count_sandboxes(str(tmp_path)) == 0
    assert (root / OWNER_FILE).read_text() == process_tag()
    await release_root(str(root))
