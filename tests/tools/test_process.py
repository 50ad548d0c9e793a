from __future__ import annotations

import json
import pathlib
from collections.abc import AsyncIterator

import anyio
import pytest

from hermes_async.testing.fake_sandbox import FakeSandbox, FakeSandboxFactory
from hermes_async.tools.process import PROCESS_TOOL
from hermes_async.tools.registry import ToolRegistry, ToolRuntime, builtin_registry, dispatch
from hermes_async.tools.sandbox.local import local_factory
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.terminal import TERMINAL_TOOL

pytestmark = pytest.mark.anyio

REGISTRY = ToolRegistry([TERMINAL_TOOL, PROCESS_TOOL])


@pytest.fixture
async def manager(tmp_path: pathlib.Path) -> AsyncIterator[SandboxManager]:
    async with SandboxManager(local_factory(str(tmp_path), terminate_grace=0.5)) as m:
        yield m
    assert list(tmp_path.iterdir()) == []


async def call(runtime: ToolRuntime, name: str, **args: object) -> dict[str, object]:
    outcome = await dispatch(name, args, runtime, registry=REGISTRY)
    result = json.loads(outcome.content)
    assert isinstance(result, dict)
    return result


async def start(runtime: ToolRuntime, command: str) -> str:
    result = await call(runtime, "terminal", command=command, background=True)
    return str(result["session_id"])


def test_schema() -> None:
    params = PROCESS_TOOL.parameters
    assert params["required"] == ["action"]
    assert params["properties"]["action"]["enum"] == [
        "list",
        "poll",
        "log",
        "wait",
        "kill",
        "write",
        "submit",
        "close",
    ]
    assert set(params["properties"]) == {
        "action",
        "session_id",
        "data",
        "timeout",
        "offset",
        "limit",
    }
    assert PROCESS_TOOL.toolset == "terminal"
    assert "process" in builtin_registry()


async def test_full_lifecycle(manager: SandboxManager) -> None:
    rt = ToolRuntime(task_id="a", sandboxes=manager)
    sid = await start(rt, "echo one; echo two; sleep 0.2; echo three; exit 5")

    listed = await call(rt, "process", action="list")
    procs = listed["processes"]
    assert isinstance(procs, list) and len(procs) == 1
    row = procs[0]
    assert row["session_id"] == sid and row["command"].startswith("echo one")
    assert {"cwd", "pid", "started_at", "uptime_seconds", "status", "output_preview"} <= set(row)

    waited = await call(rt, "process", action="wait", session_id=sid, timeout=20)
    assert waited == {"status": "exited", "exit_code": 5, "output": "one\ntwo\nthree\n"}

    polled = await call(rt, "process", action="poll", session_id=sid)
    assert polled["status"] == "exited" and polled["exit_code"] == 5
    assert polled["output_preview"] == "one\ntwo\nthree\n"
    assert set(polled) == {
        "session_id",
        "command",
        "status",
        "pid",
        "uptime_seconds",
        "output_preview",
        "exit_code",
    }

    log = await call(rt, "process", action="log", session_id=sid, limit=2)
    assert log == {
        "session_id": sid,
        "status": "exited",
        "output": "two\nthree",
        "total_lines": 3,
        "showing": "2 lines from line 1",
    }
    log = await call(rt, "process", action="log", session_id=sid, offset=0, limit=1)
    assert log["output"] == "one"

    killed = await call(rt, "process", action="kill", session_id=sid)
    assert killed == {"status": "already_exited", "session_id": sid, "exit_code": 5}


async def test_background_workdir_is_relative_to_workdir(manager: SandboxManager) -> None:
    rt = ToolRuntime(task_id="a", sandboxes=manager)
    await call(rt, "terminal", command="mkdir -p 'sub dir'")
    result = await call(rt, "terminal", command="pwd", background=True, workdir="sub dir")
    waited = await call(rt, "process", action="wait", session_id=result["session_id"], timeout=20)
    assert str(waited["output"]).rstrip().endswith("/work/sub dir")
    result = await call(rt, "terminal", command="pwd", background=True, workdir="missing")
    waited = await call(rt, "process", action="wait", session_id=result["session_id"], timeout=20)
    assert waited["exit_code"] == 1 and "No such file or directory" in str(waited["output"])


async def test_kill_and_wait_timeout(manager: SandboxManager) -> None:
    rt = ToolRuntime(task_id="a", sandboxes=manager)
    sid = await start(rt, "echo ready; sleep 1000")
    waited = await call(rt, "process", action="wait", session_id=sid, timeout=1)
    assert waited["status"] == "timeout" and "still running" in str(waited["timeout_note"])
    polled = await call(rt, "process", action="poll", session_id=sid)
    assert polled["status"] == "running" and "exit_code" not in polled
    assert await call(rt, "process", action="kill", session_id=sid) == {
        "status": "killed",
        "session_id": sid,
    }
    polled = await call(rt, "process", action="poll", session_id=sid)
    assert polled["status"] == "exited"


async def test_wait_is_clamped(manager: SandboxManager, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERMINAL_TIMEOUT", "1")
    rt = ToolRuntime(task_id="a", sandboxes=manager)
    sid = await start(rt, "sleep 1000")
    waited = await call(rt, "process", action="wait", session_id=sid, timeout=100)
    assert waited["status"] == "timeout"
    assert "clamped to the terminal timeout of 1s" in str(waited["timeout_note"])


async def test_write_submit_close(manager: SandboxManager) -> None:
    rt = ToolRuntime(task_id="a", sandboxes=manager)
    sid = await start(rt, 'while read -r line; do echo "got: $line"; done; echo bye')
    assert await call(rt, "process", action="write", session_id=sid, data="abc") == {
        "status": "ok",
        "bytes_written": 3,
    }
    assert await call(rt, "process", action="submit", session_id=sid, data="def") == {
        "status": "ok",
        "bytes_written": 4,
    }
    assert await call(rt, "process", action="close", session_id=sid) == {
        "status": "ok",
        "message": "stdin closed",
    }
    waited = await call(rt, "process", action="wait", session_id=sid, timeout=20)
    assert waited == {"status": "exited", "exit_code": 0, "output": "got: abcdef\nbye\n"}
    late = await call(rt, "process", action="write", session_id=sid, data="x")
    assert late["status"] == "already_exited"


async def test_processes_are_scoped_to_the_task(manager: SandboxManager) -> None:
    a = ToolRuntime(task_id="a", sandboxes=manager)
    b = ToolRuntime(task_id="b", sandboxes=manager)
    sid = await start(a, "sleep 1000")
    assert await call(b, "process", action="list") == {"processes": []}
    assert await call(b, "process", action="kill", session_id=sid) == {
        "status": "not_found",
        "error": f"No process with ID {sid}",
    }
    assert len((await call(a, "process", action="list"))["processes"]) == 1  # type: ignore[arg-type]


async def test_error_paths(manager: SandboxManager) -> None:
    rt = ToolRuntime(task_id="a", sandboxes=manager)
    for action in ("poll", "log", "wait", "kill", "write", "submit", "close"):
        assert await call(rt, "process", action=action) == {
            "error": f"session_id is required for {action}"
        }
    assert await call(rt, "process", action="poll", session_id="proc_nope") == {
        "status": "not_found",
        "error": "No process with ID proc_nope",
    }
    sid = await start(rt, "sleep 1000")
    assert await call(rt, "process", action="write", session_id=sid) == {
        "error": "data is required for write"
    }
    outcome = await dispatch("process", {"action": "explode"}, rt, registry=REGISTRY)
    assert outcome.error is not None and "explode" in outcome.content
    no_sandbox = await call(ToolRuntime(task_id="x"), "process", action="list")
    assert "no sandbox" in str(no_sandbox["error"])


async def test_with_fake_sandbox() -> None:
    fake = FakeSandbox()
    async with SandboxManager(FakeSandboxFactory(sandbox=fake)) as m:
        rt = ToolRuntime(task_id="f", sandboxes=m)
        sid = await start(rt, "server")
        fake.append_background_output(sid, "\x1b[1mlistening\x1b[0m\n")
        polled = await call(rt, "process", action="poll", session_id=sid)
        assert polled["status"] == "running" and polled["output_preview"] == "listening\n"

        async def finish() -> None:
            await anyio.sleep(0.2)
            fake.finish_background(sid, 3, "done\n")

        async with anyio.create_task_group() as tg:
            tg.start_soon(finish)
            waited = await call(rt, "process", action="wait", session_id=sid, timeout=30)
        assert waited == {"status": "exited", "exit_code": 3, "output": "listening\ndone\n"}
