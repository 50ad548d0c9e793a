"""run_group(sandbox_setup=...): the setup once in a snapshotted template, or in every sandbox."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from hermes_async.agent import (
    DEFAULT_FAILURE_POLICY,
    AgentOptions,
    AgentResult,
    FailurePolicy,
    RolloutSetup,
    ToolContext,
    run_group,
)
from hermes_async.errors import SandboxError
from hermes_async.testing import PolicyRequest
from hermes_async.testing.fake_sandbox import FakeSandbox
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.sandbox.spec import SandboxSnapshot, SandboxSpec
from tests.agent.test_rollout import TOKENIZER, token_client

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

TOOLS = ([], set[str]())  # the rollouts answer at once: the setup is what is tested
SETUP_FILE = "/w/task.txt"


def answer(request: PolicyRequest) -> str:
    return "done"


class SnapshotBackend:
    """Fake sandboxes that can snapshot (files copied into an 'image' registry)."""

    def __init__(self, *, snapshots: bool = True) -> None:
        self.snapshots = snapshots
        self.images: dict[str, dict[str, bytes]] = {}
        self.deleted: list[str] = []
        self.specs: list[SandboxSpec | None] = []
        self.created: list[FakeSandbox] = []

    async def __call__(self, task_id: str, spec: SandboxSpec | None = None) -> Sandbox:
        self.specs.append(spec)
        image = spec.image if spec is not None else None
        files = dict(self.images[image]) if image in self.images else {}
        backend = self
        base = FakeSandbox

        class Snapshotting(base):  # type: ignore[misc, valid-type]
            async def snapshot(self) -> SandboxSnapshot:
                ref = f"snap-{len(backend.images)}"
                backend.images[ref] = dict(self.files)

                async def delete() -> None:
                    backend.deleted.append(ref)
                    del backend.images[ref]

                return SandboxSnapshot(SandboxSpec(image=ref, workdir="/w"), ref, delete)

        cls = Snapshotting if self.snapshots else base
        sandbox = cls(task_id, files=files, workdir="/w")
        self.created.append(sandbox)
        return sandbox


async def reads_setup(result: AgentResult, ctx: ToolContext) -> float:
    sandbox = await ctx.manager.get(ctx.task_id)
    return 1.0 if (await sandbox.read_bytes(SETUP_FILE)) == b"prepared" else 0.0


class Setup:
    def __init__(self, fail_times: int = 0) -> None:
        self.calls = 0
        self.fail_times = fail_times

    async def __call__(self, sandbox: Sandbox) -> None:
        self.calls += 1
        if self.calls <= self.fail_times:
            raise SandboxError("setup step failed: apt-get exited 100")
        await sandbox.write_bytes(SETUP_FILE, b"prepared")


async def group_with(
    backend: SnapshotBackend, setup: Setup, *, cancel_after: float | None = None, **kw: Any
) -> Any:
    """A group of 4 on ``backend`` with ``setup``; ``cancel_after``: the model is slow and the
    group is cancelled then (``None`` is returned)."""
    delay = 30.0 if cancel_after is not None else 0.0
    group = None
    async with (
        token_client(answer, response_delay_seconds=delay) as client,
        SandboxManager(backend) as manager,
    ):
        with anyio.move_on_after(cancel_after if cancel_after is not None else math.inf):
            rollout_setup = RolloutSetup(
                reward=reads_setup,
                tokenizer=TOKENIZER,
                sandboxes=manager,
                sandbox_setup=setup,
                sandbox_spec=kw.pop("sandbox_spec", None),
                failure_policy=kw.pop("failure_policy", DEFAULT_FAILURE_POLICY),
            )
            group = await run_group(
                client,
                [{"role": "user", "content": "go"}],
                TOOLS,
                size=4,
                setup=rollout_setup,
                options=AgentOptions(max_tokens=32),
                task_ids=[f"r{i}" for i in range(4)],
                **kw,
            )
        assert manager.task_ids() == []  # released by the group itself, not the manager's exit
    return group


async def test_setup_runs_once_and_every_rollout_starts_from_the_snapshot() -> None:
    backend, setup = SnapshotBackend(), Setup()
    group = await group_with(backend, setup, sandbox_spec=SandboxSpec(cpus=2))
    assert group.rewards == [1.0] * 4
    assert setup.calls == 1
    # The first rollout's sandbox was the template (set up, snapshotted, kept for it); the
    # three others were created from the snapshot, with the group's spec otherwise.
    assert backend.created[0].task_id == "r0"
    assert sorted(s.task_id for s in backend.created[1:]) == ["r1", "r2", "r3"]
    assert all(s.closed for s in backend.created)
    assert backend.specs[0] == SandboxSpec(cpus=2)
    assert [(s.image, s.cpus) for s in backend.specs[1:] if s] == [("snap-0", 2)] * 3
    assert backend.deleted == ["snap-0"] and backend.images == {}


async def test_without_snapshots_the_setup_runs_in_every_sandbox() -> None:
    for backend, kw in (
        (SnapshotBackend(snapshots=False), {}),
        (SnapshotBackend(), {"snapshot": False}),
    ):
        setup = Setup()
        group = await group_with(backend, setup, **kw)
        assert group.rewards == [1.0] * 4
        assert setup.calls == 4
        assert all(s.closed for s in backend.created) and backend.images == {}


async def test_a_setup_that_fails_in_the_template_falls_back_and_is_retried_per_rollout() -> None:
    # The template's setup fails; each rollout then runs it itself; the first rollout attempt
    # to run it fails too and is retried on a fresh sandbox (infra), the rest pass.
    backend, setup = SnapshotBackend(), Setup(fail_times=2)
    group = await group_with(
        backend, setup, failure_policy=FailurePolicy(max_attempts=2, backoff_seconds=0.0)
    )
    assert group.rewards == [1.0] * 4 and group.outcome == "retried"
    assert setup.calls == 2 + 4
    (failed,) = group.retried
    assert failed.failure is not None and failed.failure.category == "infra"
    assert failed.failure.detail["source"] == "sandbox"
    assert "apt-get exited 100" in failed.failure.message
    assert backend.images == {} and all(s.closed for s in backend.created)


async def test_a_group_cancelled_mid_way_deletes_its_snapshot() -> None:
    backend, setup = SnapshotBackend(), Setup()
    assert await group_with(backend, setup, cancel_after=1) is None
    assert setup.calls == 1
    assert backend.deleted == ["snap-0"] and backend.images == {}
    assert all(s.closed for s in backend.created)
