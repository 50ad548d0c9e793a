from __future__ import annotations

import gc
import io
import json
import os
import pathlib
import random
import tarfile
from collections.abc import AsyncIterator

import anyio
import pytest

from hermes_async.agent import ToolContext
from hermes_async.errors import SandboxError
from hermes_async.testing.fake_sandbox import FakeSandbox, FakeSandboxFactory
from hermes_async.testing.sandbox_conformance import make_tar
from hermes_async.tools.registry import ToolRuntime, dispatch
from hermes_async.tools.sandbox.local import LocalSandbox, local_factory
from hermes_async.tools.sandbox.manager import SandboxManager, use_sandbox_manager
from tests.support import RecordingFactory

pytestmark = pytest.mark.anyio


@pytest.fixture
async def manager(tmp_path: pathlib.Path) -> AsyncIterator[SandboxManager]:
    root = tmp_path / "sandboxes"
    root.mkdir()
    async with SandboxManager(local_factory(str(root), terminate_grace=0.5)) as m:
        with use_sandbox_manager(m):
            yield m
    assert list(root.iterdir()) == []


async def test_terminal_on_the_rollout_sandbox(manager: SandboxManager) -> None:
    # The model's tool call and the reward's ToolContext share the sandbox of the task id.
    runtime = ToolRuntime(task_id="r1", sandboxes=manager)
    await dispatch("terminal", {"command": "echo model-was-here > out.txt"}, runtime)
    ctx = ToolContext("r1")
    result = await ctx.terminal("cat out.txt", timeout=30)
    assert result == {"output": "model-was-here\n", "exit_code": 0, "error": None}
    other = await ToolContext("r2").terminal("cat out.txt")
    assert other["exit_code"] == 1


async def test_result_used_without_await_raises_type_error(manager: SandboxManager) -> None:
    ctx = ToolContext("r1")
    with pytest.raises(TypeError, match=r"write `await ctx\.terminal\(\.\.\.\)`"):
        ctx.terminal("ls")["exit_code"]  # type: ignore[index]
    with pytest.raises(TypeError, match=r"await ctx\.read_file"):
        ctx.read_file("x").get("content")  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"await ctx\.call_tool"):
        "error" in ctx.call_tool("terminal", {"command": "ls"})  # type: ignore[operator]  # noqa: B015
    with pytest.raises(TypeError, match="coroutine"):
        bool(ctx.download_dir("a", "b"))


async def test_unawaited_call_warns(manager: SandboxManager) -> None:
    ctx = ToolContext("r1")
    with pytest.warns(RuntimeWarning, match=r"ctx\.write_file\(\.\.\.\) was never awaited"):
        ctx.write_file("x.txt", "data")
        gc.collect()
    pending = ctx.terminal("true")
    await pending
    with pytest.raises(RuntimeError, match="already awaited"):
        await pending


async def test_cleanup_without_await_still_releases(manager: SandboxManager) -> None:
    ctx = ToolContext("r1")
    await ctx.terminal("sleep 1000 > /dev/null 2>&1 &", timeout=5)
    await ctx.call_tool("terminal", {"command": "sleep 1000", "background": True})
    sandbox = await manager.get("r1")
    inner = sandbox.inner
    assert isinstance(inner, LocalSandbox)
    try:
        ctx.cleanup()  # reference style: called in `finally` without await
    finally:
        pass
    with anyio.fail_after(10):
        while manager.statistics().released < 1:
            await anyio.sleep(0.01)
    assert "r1" not in manager
    assert inner.closed and not os.path.exists(inner.root)
    assert inner.live_processes() == []


async def test_cleanup_awaited_and_context_manager(manager: SandboxManager) -> None:
    async with ToolContext("r1") as ctx:
        await ctx.terminal("true")
        sandbox = (await manager.get("r1")).inner
    assert "r1" not in manager and isinstance(sandbox, LocalSandbox) and sandbox.closed
    ctx2 = ToolContext("r2")
    await ctx2.terminal("true")
    await ctx2.cleanup()
    assert "r2" not in manager
    await ctx2.cleanup()  # idempotent
    assert "cleanup()" in repr(ctx2.cleanup())


async def test_upload_download_roundtrip(manager: SandboxManager, tmp_path: pathlib.Path) -> None:
    rng = random.Random(1234)
    blob = rng.randbytes(5 * 1024 * 1024)
    src = tmp_path / "src"
    (src / "nested dir").mkdir(parents=True)
    (src / "blob.bin").write_bytes(blob)
    (src / "empty").write_bytes(b"")
    (src / "nested dir" / "ü.txt").write_text("unicode ✓")
    ctx = ToolContext("r1")

    up = await ctx.upload_file(str(src / "blob.bin"), "in/deep/blob copy.bin")
    assert up == {"exit_code": 0, "output": "", "bytes": len(blob)}
    assert (await ctx.upload_file(str(src / "empty"), "in/empty")) == {
        "exit_code": 0,
        "output": "",
        "bytes": 0,
    }
    sha = await ctx.terminal("sha256sum 'in/deep/blob copy.bin' | cut -c1-64; wc -c < in/empty")
    import hashlib

    assert str(sha["output"]).split() == [hashlib.sha256(blob).hexdigest(), "0"]

    down = await ctx.download_file("in/deep/blob copy.bin", str(tmp_path / "out" / "blob.bin"))
    assert down == {"success": True, "bytes": len(blob)}
    assert (tmp_path / "out" / "blob.bin").read_bytes() == blob
    down = await ctx.download_file("in/empty", str(tmp_path / "out" / "empty"))
    assert down == {"success": True, "bytes": 0}
    assert (tmp_path / "out" / "empty").read_bytes() == b""

    uploaded = await ctx.upload_dir(str(src), "tree")
    assert sorted(str(u["path"]) for u in uploaded) == [
        "tree/blob.bin",
        "tree/empty",
        "tree/nested dir/ü.txt",
    ]
    assert all(u["exit_code"] == 0 for u in uploaded)
    downloaded = await ctx.download_dir("tree", str(tmp_path / "back"))
    assert {str(d["path"]) for d in downloaded} == {
        str(tmp_path / "back" / "blob.bin"),
        str(tmp_path / "back" / "empty"),
        str(tmp_path / "back" / "nested dir" / "ü.txt"),
    }
    assert (tmp_path / "back" / "blob.bin").read_bytes() == blob
    assert (tmp_path / "back" / "empty").read_bytes() == b""
    assert (tmp_path / "back" / "nested dir" / "ü.txt").read_text() == "unicode ✓"


async def test_transfer_error_results(manager: SandboxManager, tmp_path: pathlib.Path) -> None:
    ctx = ToolContext("r1")
    missing = str(tmp_path / "nope")
    assert await ctx.upload_file(missing, "x") == {
        "exit_code": -1,
        "output": f"Local file not found: {missing}",
    }
    assert await ctx.upload_dir(missing, "x") == [
        {"exit_code": -1, "output": f"Local directory not found: {missing}"}
    ]
    assert await ctx.download_file("nope.txt", str(tmp_path / "a")) == {
        "success": False,
        "error": "Remote file not found: nope.txt",
    }
    await ctx.terminal("mkdir -p d && touch d/f")
    result = await ctx.download_file("d", str(tmp_path / "a"))
    assert result["success"] is False and "Not a regular file" in str(result["error"])
    assert await ctx.download_dir("nope", str(tmp_path / "b")) == [
        {"success": False, "error": "Remote directory not found: nope"}
    ]


async def test_hostile_archives_are_rejected(tmp_path: pathlib.Path) -> None:
    # A backend that returns a crafted archive must not write outside the destination.
    hostile = make_tar({"../escaped.txt": b"pwned", "ok.txt": b"fine"})

    class Evil(FakeSandbox):
        async def get_archive(self, path: str) -> bytes:
            return hostile

    async with SandboxManager(FakeSandboxFactory(sandbox=Evil())) as m:
        ctx = ToolContext("r1", manager=m)
        dest = tmp_path / "dest"
        result = await ctx.download_dir("x", str(dest))
        assert result[0]["success"] is False and "escapes" in str(result[0]["error"])
        assert not (tmp_path / "escaped.txt").exists() and not dest.exists()
        sandbox = await m.get("r1")
        with pytest.raises(ValueError, match="escapes the destination"):
            await sandbox.put_archive("d", hostile)
        with pytest.raises(ValueError, match="absolute path"):
            await sandbox.put_archive("d", make_tar({"/etc/evil": b"x"}))


async def test_call_tool_returns_raw_string(manager: SandboxManager) -> None:
    ctx = ToolContext("r1")
    raw = await ctx.call_tool("terminal", {"command": "echo hi"})
    assert isinstance(raw, str) and json.loads(raw)["output"] == "hi\n"
    raw = await ctx.call_tool("no_such_tool", {})
    assert "Unknown tool 'no_such_tool'" in json.loads(raw)["error"]
    raw = await ctx.call_tool("terminal", '{"command": "echo json-text"}')
    assert json.loads(raw)["output"] == "json-text\n"


async def test_file_and_web_methods_dispatch_by_name() -> None:
    fake = FakeSandbox(files={"a.txt": "alpha\n"})
    async with SandboxManager(FakeSandboxFactory(sandbox=fake)) as m:
        ctx = ToolContext("r1", manager=m)
        for result in (
            await ctx.read_file("a.txt"),
            await ctx.write_file("b.txt", "beta"),
            await ctx.search("alpha"),
            await ctx.web_search("anyio"),
            await ctx.web_extract(["https://example.com"]),
        ):
            assert isinstance(result, dict)


async def test_standalone_context_has_no_manager_and_cleanup_never_raises() -> None:
    ctx = ToolContext("r1")
    with pytest.raises(SandboxError, match=r"this ToolContext is standalone.*use_sandbox_manager"):
        _ = ctx.manager
    await ctx.cleanup()  # never raises, also before any use
    ctx.cleanup()


async def test_non_json_terminal_result_is_wrapped() -> None:
    async def script(command: str) -> str:
        return "x"

    async with SandboxManager(FakeSandboxFactory(exec_script=script)) as m:
        ctx = ToolContext("r1", manager=m)
        assert (await ctx.terminal("anything"))["output"] == "x"


@pytest.mark.parametrize("batches", [3, pytest.param(10, marks=pytest.mark.slow)])
async def test_cancelling_tool_calls_leaks_nothing(tmp_path: pathlib.Path, batches: int) -> None:
    """Cancel tool calls (300; 1,000 with --run-slow) at random points: no process and no
    directory may survive."""
    rng = random.Random(20261129)
    root = tmp_path / "sandboxes"
    factory = RecordingFactory(root, terminate_grace=0.2, isolation="auto")

    commands = [
        {"command": "sleep 1000 & sleep 1000"},
        {"command": "yes | head -c 2000000 | wc -c"},
        {"command": "echo hi; sleep 0.05; echo there"},
        {"command": "setsid sleep 1000 > /dev/null 2>&1 < /dev/null & sleep 1000"},
        {"command": "sleep 1000", "background": True},
        {"command": "trap '' TERM; sleep 1000"},
    ]
    completed = cancelled = 0
    start = anyio.current_time()
    async with SandboxManager(factory, limits=None) as manager:
        with use_sandbox_manager(manager):

            async def one(i: int, delay: float, args: dict[str, object]) -> None:
                nonlocal completed, cancelled
                ctx = ToolContext(f"task-{i % 40}")
                with anyio.move_on_after(delay) as scope:
                    if i % 7 == 0:
                        await ctx.call_tool("process", {"action": "list"})
                    else:
                        await ctx.call_tool("terminal", args)
                if scope.cancelled_caught:
                    cancelled += 1
                else:
                    completed += 1
                if i % 50 == 0:
                    await ctx.cleanup()  # release some sandboxes mid-run, too

            for batch in range(batches):
                async with anyio.create_task_group() as tg:
                    for j in range(100):
                        i = batch * 100 + j
                        tg.start_soon(one, i, rng.uniform(0.0, 0.15), rng.choice(commands))
    elapsed = anyio.current_time() - start
    print(
        f"{batches * 100} calls: {cancelled} cancelled, {completed} completed, "
        f"{len(factory.created)} sandboxes, {elapsed:.1f}s"
    )
    assert cancelled + completed == batches * 100 and cancelled > batches * 50
    assert factory.leftover_processes() == []
    assert list(root.iterdir()) == []


def test_tar_helper_builds_valid_archive() -> None:
    data = make_tar({"a": b"1"})
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert tf.getnames() == ["a"]
