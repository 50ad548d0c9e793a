"""The terminal's default timeout and session directory, on local, Docker and the Modal double.

Issue #14: ``terminal_timeout`` had no effect (every call got 180 s, Docker and Modal never saw
the value) and ``cd`` did not carry over to the next command. Each case runs on every backend.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import AsyncIterator

import anyio
import pytest

from hermes_async.agent.context import ToolContext
from hermes_async.testing.modal_double import FakeModal
from hermes_async.tools.registry import ToolRuntime, dispatch, use_tool_defaults
from hermes_async.tools.sandbox.backends import make_backend_factory
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.terminal import session_cwd
from tests.tools.sandbox.test_docker import docker_engine, make_config

pytestmark = pytest.mark.anyio

__all__ = ("docker_engine",)  # the fixture, imported for the docker case

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
    pytest.param("modal", id="modal-double"),
]


@pytest.fixture(params=BACKENDS)
async def manager(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path, anyio_backend_name: str
) -> AsyncIterator[SandboxManager]:
    kind = request.param
    if kind != "local" and anyio_backend_name != "asyncio":
        pytest.skip(f"the {kind} backend is asyncio-only (its trio error is tested elsewhere)")
    if kind == "local":
        factory = make_backend_factory("local", root_dir=str(tmp_path))
    elif kind == "docker":
        request.getfixturevalue("docker_engine")
        config = make_config()
        factory = make_backend_factory(
            "docker",
            image=config.image,
            memory_mb=config.memory_mb,
            pids_limit=config.pids_limit,
            pull_missing=False,
        )
    else:
        workdir = tmp_path / "modal-root"
        workdir.mkdir()
        factory = make_backend_factory("modal", modal=FakeModal(), workdir=str(workdir))
    async with SandboxManager(factory) as m:
        yield m


async def terminal(manager: SandboxManager, runtime_timeout: float | None, **args: object) -> dict:
    runtime = ToolRuntime(
        task_id="t1", limits=manager.limits, sandboxes=manager, terminal_timeout=runtime_timeout
    )
    outcome = await dispatch("terminal", args, runtime)
    result = json.loads(outcome.content)
    assert isinstance(result, dict)
    return result


async def test_terminal_timeout_is_the_default_on_every_backend(manager: SandboxManager) -> None:
    # Killed at the default timeout: 124 and no "finished" (timing bounds would be flaky under
    # load; a command that ran its full 4 s would have printed it).
    result = await terminal(manager, 1.0, command="sleep 4; echo finished")
    assert result["exit_code"] == 124, result
    assert result["error"] == "Command timed out after 1 seconds"
    assert "finished" not in result["output"]
    # An explicit timeout wins over the default.
    result = await terminal(manager, 1.0, command="sleep 2; echo finished", timeout=10)
    assert result["exit_code"] == 0 and "finished" in result["output"]


async def test_run_defaults_reach_runtimes_and_contexts(manager: SandboxManager) -> None:
    with use_tool_defaults(terminal_timeout=1.0):
        result = await terminal(manager, None, command="sleep 4; echo finished")
        assert result["exit_code"] == 124 and "finished" not in result["output"]
        ctx = ToolContext("t1", manager=manager)
        out = await ctx.terminal("sleep 4; echo finished")
        assert out["exit_code"] == 124 and "finished" not in out["output"]
    # The context's own setting wins over the run's.
    ctx = ToolContext("t1", manager=manager, terminal_timeout=1.0)
    assert (await ctx.terminal("sleep 4"))["exit_code"] == 124
    assert (await ctx.terminal("sleep 2; echo ok", timeout=10))["output"].strip() == "ok"


async def test_cwd_carries_over_between_commands(manager: SandboxManager) -> None:
    first = await terminal(manager, 30, command="mkdir -p proj/src && cd proj/src && echo in")
    assert first == {"output": "in\n", "exit_code": 0, "error": None}
    here = await terminal(manager, 30, command="pwd")
    assert str(here["output"]).rstrip().endswith("/proj/src")
    # Output without a trailing newline is returned exactly.
    assert (await terminal(manager, 30, command="printf abc"))["output"] == "abc"
    # The exit status is the command's, and a failing command still records its directory.
    result = await terminal(manager, 30, command="cd .. && false")
    assert result["exit_code"] == 1
    assert str((await terminal(manager, 30, command="pwd"))["output"]).rstrip().endswith("/proj")
    # `workdir` runs one command elsewhere and leaves the session's directory alone.
    other = await terminal(manager, 30, command="pwd", workdir="/")
    assert other["output"] == "/\n"
    assert str((await terminal(manager, 30, command="pwd"))["output"]).rstrip().endswith("/proj")
    # A command that exits before the trailer (exit, timeout) leaves the directory as it was.
    assert (await terminal(manager, 30, command="cd src; exit 3"))["exit_code"] == 3
    assert str((await terminal(manager, 30, command="pwd"))["output"]).rstrip().endswith("/proj")
    # The reward's ToolContext continues where the model's commands ended.
    ctx = ToolContext("t1", manager=manager)
    assert str((await ctx.terminal("pwd"))["output"]).rstrip().endswith("/proj")
    # Environment variables do not persist (documented): a fresh shell per command.
    await terminal(manager, 30, command="export HERMES_X=1")
    assert (await terminal(manager, 30, command='echo "[$HERMES_X]"'))["output"] == "[]\n"


async def test_vanished_cwd_falls_back_with_a_note(manager: SandboxManager) -> None:
    await terminal(manager, 30, command="mkdir -p gone && cd gone")
    await terminal(manager, 30, command="rm -rf ../gone")
    result = await terminal(manager, 30, command="echo still-here")
    assert result["exit_code"] == 0
    assert "still-here" in result["output"] and "previous working directory is gone" in str(
        result["output"]
    )
    sandbox = await manager.get("t1")
    assert session_cwd(sandbox) == sandbox.workdir


async def test_background_processes_start_in_the_session_cwd(manager: SandboxManager) -> None:
    await terminal(manager, 30, command="mkdir -p bg && cd bg")
    started = await terminal(manager, 30, command="pwd > where.txt; sleep 60", background=True)
    session = started["session_id"]
    sandbox = await manager.get("t1")
    with anyio.fail_after(20):
        while True:
            listing = await terminal(manager, 30, command="cat where.txt 2>/dev/null || true")
            if listing["output"]:
                break
            await anyio.sleep(0.1)
    assert str(listing["output"]).rstrip().endswith("/bg")
    assert any(p.session_id == session for p in sandbox.background_processes())
    runtime = ToolRuntime(task_id="t1", limits=manager.limits, sandboxes=manager)
    killed = await dispatch("process", {"action": "kill", "session_id": session}, runtime)
    assert json.loads(killed.content)["status"] in ("killed", "already_exited")
