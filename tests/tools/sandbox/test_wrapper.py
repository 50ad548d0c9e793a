"""SandboxWrapper: every operation of the interface reaches the inner sandbox, around a hook."""

from __future__ import annotations

import inspect
import pathlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from hermes_async.agent._watch import WatchedSandboxes
from hermes_async.agent.failures import RolloutFailure
from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox.base import MAX_READ_BYTES, Sandbox
from hermes_async.tools.sandbox.local import LocalSandbox
from hermes_async.tools.sandbox.manager import ManagedSandbox
from hermes_async.tools.sandbox.wrapper import SandboxWrapper

pytestmark = pytest.mark.anyio

#: Sandbox methods a wrapper must not forward: ``exec`` builds the request and calls the
#: forwarded ``exec_request``; the manager runs the lifecycle hook ``watch`` on the backend's
#: own sandbox.
NOT_FORWARDED = {"exec", "watch"}


def _operations() -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(Sandbox)
        if not name.startswith("_") and callable(member) and name not in NOT_FORWARDED
    }


def test_every_operation_of_the_interface_is_forwarded() -> None:
    missing = _operations() - set(vars(SandboxWrapper))
    assert not missing, f"SandboxWrapper falls back to Sandbox's defaults for {sorted(missing)}"
    assert "gone" in vars(SandboxWrapper)
    for cls in (ManagedSandbox,):  # the manager's view forwards through the same class
        assert issubclass(cls, SandboxWrapper)


class Counting(SandboxWrapper):
    def __init__(self, inner: Sandbox) -> None:
        super().__init__(inner)
        self.entered = 0

    @asynccontextmanager
    async def around(self) -> AsyncIterator[Sandbox]:
        self.entered += 1
        yield self.inner


async def test_a_wrapper_streams_through_the_backend_not_a_whole_read(
    tmp_path: pathlib.Path,
) -> None:
    inner = await LocalSandbox.create("w", root_dir=str(tmp_path), isolation="process")
    async with inner:
        wrapped = Counting(inner)
        size = MAX_READ_BYTES + (1 << 20)  # a whole-file read refuses this much
        r = await wrapped.exec(f"truncate -s {size} big.bin && echo ok")
        assert r.stdout == "ok\n" and wrapped.entered == 1
        got = 0

        async def sink(chunk: bytes) -> None:
            nonlocal got
            got += len(chunk)

        assert await wrapped.stream_file("big.bin", sink) == size == got
        assert wrapped.entered == 2
        assert wrapped.can_snapshot() == inner.can_snapshot()
        assert await wrapped.alive()
        process = await wrapped.start_background("sleep 30")
        assert [p.session_id for p in wrapped.background_processes()] == [process.session_id]
        assert wrapped.get_background(process.session_id) is not None
        assert await wrapped.kill_background(process.session_id)
        assert wrapped.entered == 4
        assert wrapped.gone is None


async def test_the_rollout_view_streams_and_reports_a_lost_sandbox_from_any_operation(
    tmp_path: pathlib.Path,
) -> None:
    class Provider:
        def __init__(self, sandbox: Sandbox) -> None:
            self.sandbox = sandbox

        async def get(self, task_id: str) -> Sandbox:
            return self.sandbox

        async def release(self, task_id: str, *, interrupted: bool = False) -> None:
            await self.sandbox.aclose(interrupted=interrupted)

    inner = await LocalSandbox.create("w", root_dir=str(tmp_path), isolation="process")
    failures: list[RolloutFailure] = []
    watched = WatchedSandboxes(Provider(inner), failures.append)
    sandbox = await watched.get("w")
    size = MAX_READ_BYTES + 1
    await sandbox.exec(f"truncate -s {size} big.bin")

    async def sink(chunk: bytes) -> None:
        pass

    # Streamed by the backend (a whole-file read would refuse this size), nothing reported.
    assert await sandbox.stream_file("big.bin", sink) == size and failures == []
    await inner.aclose()

    with pytest.raises(SandboxError):
        await sandbox.stream_archive(".", sink)  # the sandbox is gone: an infra failure
    assert [f.category for f in failures] == ["infra"]
