"""Cancel Phase 2 rollouts at random points: nothing may leak.

In process (ASGI transport) 200 rollouts, 1,000 with ``--run-slow``; over loopback TCP (the
lean HTTP client, a real socket per request) 100 more, 300 with ``--run-slow``, which must also
leave no socket open.
"""

from __future__ import annotations

import json
import math
import pathlib
import random
from typing import Any

import anyio
import pytest

from hermes_async.agent import HermesAgentLoop
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.limits import Limits
from hermes_async.testing.http import open_app_endpoint
from hermes_async.testing.scripted_server import PolicyRequest, ScriptedModelServer
from hermes_async.tools.registry import get_tool_definitions
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import TOKENIZER, RecordingFactory, open_fds

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


@pytest.fixture(
    params=[pytest.param(("asyncio", {}), id="asyncio"), pytest.param(("trio", {}), id="trio")]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    # A stress test: asyncio's debug mode (on for every other test) makes it ~4x slower and
    # adds nothing here.
    return request.param  # type: ignore[no-any-return]


FAST = ["echo hi; sleep 0.02; echo there", "yes | head -c 100000 | wc -c", "true"]
SLOW = ["sleep 1000 & sleep 1000", "trap '' TERM; sleep 1000", "setsid sleep 1000 & wait"]


def policy(request: PolicyRequest) -> str:
    """Two turns of tool calls, then an answer; the command depends on the conversation."""
    turns = sum(1 for m in request.messages if m.get("role") == "assistant")
    if turns >= 2:
        return "done"
    i = int(request.last_user_text.split()[-1])
    if i % 4 >= 2:  # half the rollouts use a tool without a sandbox
        todo = {"todos": [{"id": str(turns), "content": "step", "status": "completed"}]}
        return "<tool_call>\n" + json.dumps({"name": "todo", "arguments": todo}) + "\n</tool_call>"
    pool = SLOW if i % 4 == 0 else FAST
    command = pool[(i // 4 + turns) % len(pool)]
    args = {"command": command, "timeout": 30}
    if i % 9 == 0:
        return (
            '<tool_call>\n{"name": "terminal", "arguments": '
            + json.dumps({"command": "sleep 1000", "background": True})
            + "}\n</tool_call>"
        )
    return (
        "Working on it.\n<tool_call>\n"
        + json.dumps({"name": "terminal", "arguments": args})
        + "\n</tool_call>"
    )


@pytest.mark.parametrize(
    ("loopback", "batches"),
    [
        pytest.param(False, 4, id="inproc"),
        pytest.param(True, 2, id="tcp"),
        pytest.param(False, 20, id="inproc-1000", marks=pytest.mark.slow),
        pytest.param(True, 6, id="tcp-300", marks=pytest.mark.slow),
    ],
)
async def test_cancelling_rollouts_leaks_nothing(
    tmp_path: pathlib.Path, loopback: bool, batches: int
) -> None:
    rng = random.Random(1129)
    fds_before = open_fds()
    root = tmp_path / "sandboxes"
    # Process isolation: namespaced worlds (~40 ms of CPU each to build) have their own
    # cancellation and leak tests in tests/tools/sandbox/test_namespaces.py.
    factory = RecordingFactory(root, terminate_grace=0.2)
    server = ScriptedModelServer(
        policy, tokenizer=TOKENIZER, max_chunk_tokens=4, chunk_delay_seconds=0.002, seed=3
    )
    defs = get_tool_definitions(["terminal", "todo"])
    limits = Limits()
    tasks_before = len(anyio.get_running_tasks())
    cancelled = finished = 0
    lives: list[float] = []  # each finished rollout's own time
    async with (
        open_app_endpoint(server, loopback=loopback) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport, limiter=limits.model_requests) as client,
        SandboxManager(factory, limits=limits) as manager,
    ):

        async def one(i: int, delay: float) -> None:
            nonlocal cancelled, finished
            loop = HermesAgentLoop(
                client,
                defs.schemas,
                defs.valid_names,
                task_id=f"r{i}",
                tokenizer=TOKENIZER,
                limits=limits,
                sandboxes=manager,
                max_tokens=200,
            )
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {i}"}]
            began = anyio.current_time()
            with anyio.move_on_after(delay) as scope:
                await loop.run(messages)
                await manager.release(loop.task_id)
            if scope.cancelled_caught:
                cancelled += 1
            else:
                finished += 1
                lives.append(anyio.current_time() - began)
            partial = loop.partial
            assert partial is not None
            if partial.managed_state is not None:
                node = partial.managed_state["nodes"][0]
                assert len(node["tokens"]) == len(node["masked_tokens"])
                assert len(node["tokens"]) == len(node["logprobs"])
            # Each assistant turn with calls is followed by all of its results.
            for k, m in enumerate(messages):
                for j, call in enumerate(m.get("tool_calls") or []):
                    assert messages[k + 1 + j]["tool_call_id"] == call["id"]

        # A warm-up batch runs to completion and measures how long a rollout lives on
        # this machine; then the rollouts, in batches of 50, are cancelled at random
        # points over 1.3x that life (most are cut somewhere). Three quick ones per batch
        # (the warm-up's kind) have no deadline, so some finish even when a loaded machine
        # stretches a batch past that life. The mean rollout, not the batch: a batch lives
        # as long as its slowest rollout, and over 1.3x of that only ~30% were cut.
        start = anyio.current_time()
        fast = [i for i in range(10_000, 10_200) if i % 4 and i % 9][:50]
        async with anyio.create_task_group() as tg:
            for i in fast:
                tg.start_soon(one, i, math.inf)
        life = sum(lives) / len(lives)
        print(f"warm-up batch: {anyio.current_time() - start:.2f} s, mean rollout {life:.2f} s")
        assert finished == 50
        finished = 0
        for batch in range(batches):
            async with anyio.create_task_group() as tg:
                ids = range(batch * 50, batch * 50 + 50)
                sure = [i for i in ids if i % 4 and i % 9][:3]
                for i in ids:
                    tg.start_soon(one, i, math.inf if i in sure else rng.uniform(0.0, 1.3 * life))
            print(f"batch {batch}: {anyio.current_time() - start:.2f} s")
        assert manager.task_ids() == []
    assert cancelled + finished == 50 * batches
    assert cancelled > 15 * batches and finished > 0, (cancelled, finished)
    assert factory.leftover_processes() == []
    assert list(root.iterdir()) == []
    assert len(anyio.get_running_tasks()) == tasks_before
    for stats in limits.statistics().values():
        assert stats.in_use == 0 and stats.waiting == 0, stats
    # Every connection (client and, over loopback, server side) is closed.
    assert open_fds() - fds_before == set()
