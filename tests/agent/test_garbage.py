"""A rollout leaves no reference cycles behind (issue #23: memory and collector time at scale).

Whatever a rollout leaves in a reference cycle is not freed when the rollout ends but waits for
the cyclic collector, which at thousands of concurrent rollouts is tuned to run rarely
(:mod:`hermes_async.gc_tuning`); meanwhile it holds memory and lengthens every collection that
walks it. Standalone runs used to leave ~79 objects each (a private sandbox manager's cancelled
janitor task, the local factory's batchers holding their owners' bound methods).
"""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import Iterator

import anyio
import pytest

from hermes_async.agent._prompt_ids import PROMPT_IDS
from hermes_async.agent_loop import HermesAgentLoop
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.inference.rendering import ChatRenderer
from hermes_async.inference.trajectory import Trajectory
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits, NamedLimiter
from hermes_async.testing import PolicyRequest, ScriptedModelServer, open_app_endpoint
from hermes_async.testing.scripted_server import ServedRequest
from hermes_async.tools.registry import Tool, ToolRegistry, ToolRuntime
from tests.support import TOKENIZER

pytestmark = pytest.mark.anyio


SCHEMA: JSONObject = {"type": "object", "properties": {"n": {"type": "integer"}}}


def policy(request: PolicyRequest) -> str:
    done = sum(1 for m in request.messages if m.get("role") == "assistant")
    if done >= 2:
        return "All steps are complete."
    call = {"name": "step", "arguments": {"n": done}}
    return f"Step {done + 1}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


async def step(arguments: JSONObject, runtime: ToolRuntime) -> str:
    await anyio.sleep(0)
    return '{"ok": true}'


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """Collect first; then keep what the collector finds instead of freeing it."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


async def test_standalone_rollouts_leave_no_reference_cycles(
    saved_garbage: list[object],
) -> None:
    registry = ToolRegistry([Tool("step", "One step.", SCHEMA, step, "terminal")])
    defs = registry.definitions(["terminal"])
    server = ScriptedModelServer(policy, tokenizer=TOKENIZER)

    async def rollouts(client: VLLMGenerateClient, n: int, label: str) -> int:
        """Run ``n`` standalone rollouts at once; the cyclic garbage they left."""
        gc.collect()
        saved_garbage.clear()

        async def one(i: int) -> None:
            loop = HermesAgentLoop(
                client,
                defs.schemas,
                defs.valid_names,
                task_id=f"{label}-{i}",
                tokenizer=TOKENIZER,
                registry=registry,
                max_tokens=64,
            )
            result = await loop.run([{"role": "user", "content": f"Task {i}."}])
            assert result.finished_naturally and not result.tool_errors, result.error

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        gc.collect()
        return len(saved_garbage)

    async with (
        open_app_endpoint(server, loopback=True) as (base_url, _),
        VLLMGenerateClient(base_url) as client,
    ):
        await rollouts(client, 5, "warm")  # connections, first-use caches
        few = await rollouts(client, 10, "few")
        many = await rollouts(client, 40, "many")
    # Per rollout, what 30 more rollouts added: well under one object each (the in-process
    # server and the client's connection pool may leave a few of their own either way).
    assert (many - few) / 30 < 1.0, (few, many)


async def test_rollouts_waiting_for_a_model_slot_hold_their_prompts_compactly() -> None:
    # Thousands of rollouts wait for a model-request slot at once (64 by default); what each
    # holds per prompt token while it waits decides the memory of a large run, and the
    # fragmentation that start burst leaves behind. Held as Python lists of ints (three per
    # request) it was ~38 bytes a token here; as the trajectory's array and the encoded body,
    # ~9 (on 6a0458f this fails).
    limiter = NamedLimiter("model_requests", 1)
    server = ScriptedModelServer(policy, tokenizer=TOKENIZER)
    n = 16

    async def held_per_rollout(client: VLLMGenerateClient, content: str) -> tuple[float, int]:
        """Traced bytes per rollout while ``n`` wait for the slot; the prompt's length."""
        tokens = len(TOKENIZER.encode(content))
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            # The only slot, held here: every rollout waits for it.
            async with anyio.create_task_group() as tg, limiter:
                for i in range(n):
                    loop = HermesAgentLoop(
                        client, [], set(), task_id=f"w{i}", tokenizer=TOKENIZER, max_tokens=8
                    )
                    tg.start_soon(loop.run, [{"role": "user", "content": content}])
                with anyio.fail_after(30):
                    while limiter.statistics().waiting < n:
                        await anyio.sleep(0.01)
                gc.collect()
                held = (tracemalloc.get_traced_memory()[0] - before) / n
                tg.cancel_scope.cancel("test: measured")
        finally:
            tracemalloc.stop()
        return held, tokens

    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport, limiter=limiter) as client,
    ):
        short, short_tokens = await held_per_rollout(client, "Say hi.")
        text = " ".join(f"item{i} = value{i * 7}" for i in range(1500))
        long, long_tokens = await held_per_rollout(client, text)
    per_token = (long - short) / (long_tokens - short_tokens)
    assert long_tokens > 10_000
    assert per_token < 20, (per_token, short, long)


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
async def test_a_group_parked_in_its_tools_holds_its_shared_prompt_once(
    cache: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rollouts of a group render the same prompt (system prompt, tool schemas): its ids and
    # its text are held once between them (the prompt cache's), not once per rollout (~4 bytes
    # of ids and ~4 of text a token each: 65 KB per rollout for an 8,900-token prompt). With the
    # cache off each holds its own array, and never the tokenizer's list of ints (~40 bytes a
    # token).
    if not cache:
        monkeypatch.setattr(PROMPT_IDS, "max_entries", 0)
    size = 16
    arrived = 0
    everyone_in = anyio.Event()
    release = anyio.Event()
    held: dict[str, set[int]] = {}

    async def park(arguments: JSONObject, runtime: ToolRuntime) -> str:
        nonlocal arrived
        arrived += 1
        if arrived == size:
            everyone_in.set()
        await release.wait()
        return '{"ok": true}'

    registry = ToolRegistry([Tool("step", "One step.", SCHEMA, park, "terminal")])
    defs = registry.definitions(["terminal"])
    server = ScriptedModelServer(policy, tokenizer=TOKENIZER)
    system = "You are careful. " + " ".join(f"rule {i}: check item {i}." for i in range(900))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Go."}]
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
        anyio.create_task_group() as tg,
    ):
        for i in range(size):
            loop = HermesAgentLoop(
                client,
                defs.schemas,
                defs.valid_names,
                task_id=f"g{i}",
                tokenizer=TOKENIZER,
                registry=registry,
                max_tokens=64,
            )
            tg.start_soon(loop.run, [dict(m) for m in messages])
        with anyio.fail_after(30):
            await everyone_in.wait()
        gc.collect()
        live = gc.get_objects()
        prompt_tokens = len(TOKENIZER.encode(system))
        trajectories = [o for o in live if isinstance(o, Trajectory)]
        renderers = [o for o in live if isinstance(o, ChatRenderer)]
        held["ids"] = {id(t.segments[0].token_ids) for t in trajectories}
        held["text"] = {id(r._text) for r in renderers}
        counts = (len(trajectories), len(renderers))
        # The in-process server's records of requests it is still finishing are its own.
        served = {
            id(ids)
            for o in live
            if isinstance(o, ServedRequest)
            for ids in (o.body.get("token_ids"), o.prompt_ids)
        }
        # Lists of ints only: linecache holds other tests' source files as lists of lines.
        lists = [
            o
            for o in live
            if type(o) is list
            and len(o) >= prompt_tokens
            and type(o[0]) is int
            and id(o) not in served
        ]
        release.set()
    assert counts == (size, size)
    assert len(held["ids"]) == len(held["text"]) == (1 if cache else size), held
    assert not lists, [len(o) for o in lists]


async def test_a_standalone_runs_private_sandbox_manager_is_small_until_used() -> None:
    """Each reference-style run outside an environment owns a manager and a local factory,
    held while the run is parked in its tools (20,000 of them in one process: #41). Beyond the
    manager's task group they held 3.7-4.3 KB per run before the table's hooks and the factory
    were slotted objects (the sweeper made with the first sandbox); 1.2-1.7 KB now."""
    from hermes_async.tools.sandbox.manager import SandboxManager, use_sandbox_manager
    from hermes_async.tools.standalone import standalone_factory

    n = 300
    parked = 0
    limits = Limits()  # a run passes its loop's

    async def with_manager(release: anyio.Event) -> None:
        nonlocal parked
        async with SandboxManager(
            standalone_factory()[1], limits=limits, idle_timeout=None
        ) as manager:
            with use_sandbox_manager(manager):
                parked += 1
                await release.wait()

    async def task_group_only(release: anyio.Event) -> None:
        nonlocal parked
        async with anyio.create_task_group():
            parked += 1
            await release.wait()

    async def held_per_task(holder: object) -> float:
        nonlocal parked
        parked = 0
        release = anyio.Event()
        gc.collect()
        tracemalloc.start()
        try:
            async with anyio.create_task_group() as tg:
                before = tracemalloc.get_traced_memory()[0]
                for _ in range(n):
                    tg.start_soon(holder, release)  # type: ignore[arg-type]
                while parked < n:
                    await anyio.sleep(0.01)
                held = (tracemalloc.get_traced_memory()[0] - before) / n
                release.set()
        finally:
            tracemalloc.stop()
        return held

    # Against a parked task group (the manager's own, which it needs): what the event loop's
    # tasks and scopes cost differs by backend and debug mode; the rest is the manager's.
    async with SandboxManager(standalone_factory()[1], limits=limits, idle_timeout=None):
        pass  # the backend's modules imported and its checks cached: not counted below
    task_group = await held_per_task(task_group_only)
    owned = await held_per_task(with_manager)
    assert owned - task_group < 2_500, (owned, task_group)
