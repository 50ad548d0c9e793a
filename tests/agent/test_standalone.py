"""Reference-style code outside an environment: a standalone ToolContext, loop and its tools.

Issue #14: ``ToolContext(task_id)`` outside a running environment raised "no SandboxManager",
and a reference-style loop's tools answered "no sandbox configured" (the rollout scored 0
silently). Now each gets a private owner on the configured backend, released on exit.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import warnings
from collections.abc import Iterator

import anyio
import pytest

from hermes_async.agent_loop import HermesAgentLoop
from hermes_async.errors import ConfigError
from hermes_async.inference.chat import ChatClient
from hermes_async.testing import PolicyRequest, ScriptedModelServer, open_app_endpoint
from hermes_async.tool_context import ToolContext
from hermes_async.tools.registry import get_tool_definitions
from hermes_async.tools.sandbox import local as local_module
from hermes_async.tools.sandbox.local import ISOLATION_ENV, LocalSandbox, find_sandbox_processes
from hermes_async.tools.sandbox.manager import open_sandbox_manager
from tests.support import TOKENIZER

pytestmark = pytest.mark.anyio

#: Loaded (and its chat template read) at import: reading files would block a running loop.


@pytest.fixture
def sandbox_root(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """Local sandboxes of standalone contexts land here (they use the system temp dir)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setenv("TMPDIR", str(root))
    monkeypatch.delenv("TERMINAL_ENV", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    yield root
    monkeypatch.setattr(tempfile, "tempdir", None)


def sandboxes(root: pathlib.Path) -> list[str]:
    return [p.name for p in root.iterdir() if p.name.startswith("hermes-sbx-")]


async def test_async_with_standalone_context(sandbox_root: pathlib.Path) -> None:
    async with ToolContext("solo-1") as ctx:
        assert ctx.standalone
        await ctx.write_file("notes/answer.txt", "42\n")
        out = await ctx.terminal("cat notes/answer.txt")
        assert out["exit_code"] == 0 and out["output"] == "42\n"
        assert len(sandboxes(sandbox_root)) == 1
    assert sandboxes(sandbox_root) == []
    after = await ctx.terminal("true")  # tools report it to the model; nothing is created
    assert "this ToolContext was cleaned up" in str(after["error"])
    assert sandboxes(sandbox_root) == []


async def test_reference_style_cleanup_without_await_releases_now(
    sandbox_root: pathlib.Path,
) -> None:
    # Process mode, chosen explicitly: the one kind of sandbox a sync cleanup can remove.
    ctx = ToolContext("solo-2", sandbox_options={"isolation": "process"})
    try:
        await ctx.write_file("solution.py", "print(6 * 7)\n")
        out = await ctx.terminal("python3 solution.py")
        assert out["exit_code"] == 0 and out["output"] == "42\n"
        started = json.loads(
            await ctx.call_tool("terminal", {"command": "sleep 1000", "background": True})
        )
        assert started["session_id"].startswith("proc_")
        sandbox = await ctx._sandbox()
        marker = sandbox.sandbox_id  # type: ignore[attr-defined]
        assert find_sandbox_processes(marker)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a local sandbox needs no await: no warning
            ctx.cleanup()
    # Released synchronously, before anything else ran: no process, no directory left.
    assert sandboxes(sandbox_root) == []
    with anyio.fail_after(5):
        while find_sandbox_processes(marker):
            await anyio.sleep(0.05)


@pytest.mark.namespaces
async def test_a_standalone_context_is_namespaced_by_default(
    sandbox_root: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    ctx = ToolContext("solo-ns")
    out = await ctx.terminal("cat /proc/1/cmdline | tr '\\0' ' '")
    assert out["exit_code"] == 0 and "bwrap" in out["output"]  # PID 1 is the world's own
    sandbox = await ctx._sandbox()
    assert isinstance(sandbox, LocalSandbox) and sandbox.isolation == "namespaces"
    # A world's teardown must be awaited: an unawaited cleanup leaves it and says so.
    with pytest.warns(RuntimeWarning, match=r"cleanup\(\) was not awaited"):
        ctx.cleanup()
        gc.collect()
    assert len(sandboxes(sandbox_root)) == 1
    await ctx.cleanup()
    assert sandboxes(sandbox_root) == []


async def test_standalone_context_and_loop_refuse_to_run_unisolated(
    sandbox_root: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    monkeypatch.setattr(local_module, "namespace_support", lambda: "bwrap not found on PATH")
    ctx = ToolContext("solo-unisolated")
    with pytest.raises(ConfigError, match=r"cannot be isolated.*isolation='process'"):
        await ctx.terminal("true")
    await ctx.cleanup()
    tools, valid_names = get_tool_definitions(["terminal"], None, quiet_mode=True)
    server = ScriptedModelServer(policy, tokenizer=TOKENIZER)
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        ChatClient(base_url, transport=transport) as client,
    ):
        agent = HermesAgentLoop(
            server=client, tool_schemas=tools, valid_tool_names=valid_names, max_turns=4
        )
        with pytest.raises(ConfigError, match=r"cannot be isolated.*install\.sh"):
            await agent.run([{"role": "user", "content": "go"}])
    assert sandboxes(sandbox_root) == []
    # The explicit opt-out runs.
    async with ToolContext("solo-opted-out", sandbox_options={"isolation": "process"}) as ctx:
        assert (await ctx.terminal("echo ok"))["output"] == "ok\n"


async def test_standalone_context_inside_a_manager_uses_it(tmp_path: pathlib.Path) -> None:
    async with open_sandbox_manager() as manager:
        ctx = ToolContext("inside")
        assert not ctx.standalone
        await ctx.terminal("true")
        assert "inside" in manager.task_ids()


async def test_standalone_backend_comes_from_terminal_env(
    sandbox_root: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERMINAL_ENV", "vagrant")
    ctx = ToolContext("solo-3")
    with pytest.raises(
        ConfigError, match=r"TERMINAL_ENV='vagrant'.*available: local, docker, modal"
    ):
        await ctx.terminal("true")
    ctx.cleanup()
    explicit = ToolContext("solo-4", backend="local")
    async with explicit:
        assert (await explicit.terminal("echo ok"))["output"] == "ok\n"
    assert sandboxes(sandbox_root) == []


def test_unawaited_cleanup_of_a_container_sandbox_warns() -> None:
    from hermes_async.agent.context import _CleanupHandle

    ctx = ToolContext("remote")
    with pytest.warns(RuntimeWarning, match=r"cleanup\(\) was not awaited.*await ctx.cleanup\(\)"):
        _CleanupHandle(ctx, ["remote"])
        gc.collect()


def policy(request: PolicyRequest) -> str:
    tools = [m for m in request.messages if m.get("role") == "tool"]
    if not tools:
        call = {"name": "terminal", "arguments": {"command": "echo from-the-model > f && cat f"}}
        return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
    return "done: " + json.loads(str(tools[-1]["content"]))["output"].strip()


async def test_reference_style_loop_outside_an_environment(sandbox_root: pathlib.Path) -> None:
    tools, valid_names = get_tool_definitions(["terminal"], None, quiet_mode=True)
    server = ScriptedModelServer(policy, tokenizer=TOKENIZER)
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        ChatClient(base_url, transport=transport) as client,
    ):
        agent = HermesAgentLoop(
            server=client, tool_schemas=tools, valid_tool_names=valid_names, max_turns=4
        )
        result = await agent.run([{"role": "user", "content": "go"}])
    assert result.tool_errors == []
    assert result.messages[-1]["content"] == "done: from-the-model"
    # The run owned the sandbox: released when run() returned.
    assert sandboxes(sandbox_root) == []
    assert os.environ.get("TERMINAL_ENV") is None
