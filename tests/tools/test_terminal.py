from __future__ import annotations

import contextlib
import json
import pathlib
from collections.abc import AsyncIterator

import anyio
import pytest

from hermes_async.errors import SandboxError
from hermes_async.testing.fake_sandbox import FakeSandbox, FakeSandboxFactory
from hermes_async.tools.registry import ToolRegistry, ToolRuntime, builtin_registry, dispatch
from hermes_async.tools.sandbox.local import find_sandbox_processes, local_factory
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.terminal import (
    TERMINAL_TOOL,
    exit_code_meaning,
    strip_ansi,
    truncate_output,
)

pytestmark = pytest.mark.anyio

REGISTRY = ToolRegistry([TERMINAL_TOOL])


@pytest.fixture
async def runtime(tmp_path: pathlib.Path) -> AsyncIterator[ToolRuntime]:
    async with SandboxManager(local_factory(str(tmp_path), terminate_grace=0.5)) as manager:
        yield ToolRuntime(task_id="t", limits=manager.limits, sandboxes=manager)
    assert list(tmp_path.iterdir()) == []


async def run(runtime: ToolRuntime, **args: object) -> dict[str, object]:
    outcome = await dispatch("terminal", args, runtime, registry=REGISTRY)
    result = json.loads(outcome.content)
    assert isinstance(result, dict)
    return result


def test_schema_matches_reference() -> None:
    schema = TERMINAL_TOOL.schema
    assert schema["function"]["name"] == "terminal"
    params = schema["function"]["parameters"]
    assert params["required"] == ["command"]
    assert set(params["properties"]) == {
        "command",
        "background",
        "timeout",
        "workdir",
        "pty",
        "notify_on_complete",
        "watch_patterns",
    }
    assert params["properties"]["timeout"] == {
        "type": "integer",
        "description": params["properties"]["timeout"]["description"],
        "minimum": 1,
    }
    assert params["properties"]["background"]["default"] is False
    assert TERMINAL_TOOL.toolset == "terminal"
    assert TERMINAL_TOOL.max_result_size_chars == 100_000
    assert "terminal" in builtin_registry()


async def test_foreground_result_shape(runtime: ToolRuntime) -> None:
    assert await run(runtime, command="echo hello") == {
        "output": "hello\n",
        "exit_code": 0,
        "error": None,
    }
    result = await run(runtime, command="echo out; echo err >&2; exit 2")
    assert result == {"output": "out\nerr\n", "exit_code": 2, "error": None}


async def test_exit_code_meaning(runtime: ToolRuntime) -> None:
    result = await run(runtime, command="echo abc | grep zzz")
    assert result["exit_code"] == 1
    assert result["exit_code_meaning"] == "No matches found (not an error)"
    result = await run(runtime, command="definitely-not-a-command-xyz")
    assert result["exit_code"] == 127 and result["exit_code_meaning"] == "Command not found"


def test_exit_code_meaning_table() -> None:
    assert exit_code_meaning("diff a b", 1) == "Files differ (expected, not an error)"
    assert exit_code_meaning("cd x && FOO=1 sudo test -f y", 1) is not None
    assert exit_code_meaning("curl -s http://x", 7) == "Failed to connect to host"
    assert exit_code_meaning("/usr/bin/git diff --quiet", 1) is not None
    assert exit_code_meaning("python x.py", 1) is None
    assert exit_code_meaning("grep x", 0) is None
    assert exit_code_meaning("echo 'unterminated", 1) is None


def test_truncation_marker_and_split() -> None:
    text = "H" * 30_000 + "M" * 40_000 + "T" * 30_000
    out = truncate_output(text)
    head, rest = out.split(
        "\n\n... [OUTPUT TRUNCATED - 50000 chars omitted out of 100000 total] ...\n\n"
    )
    assert head == "H" * 20_000
    assert rest == "M" * 0 + "T" * 30_000
    assert truncate_output("short") == "short"


def test_strip_ansi() -> None:
    assert strip_ansi("\x1b[31mred\x1b[0m \x1b]0;title\x07ok") == "red ok"


async def test_output_is_truncated_and_ansi_stripped(runtime: ToolRuntime) -> None:
    result = await run(
        runtime, command="printf '\\033[32mgreen\\033[0m\\n'; seq 1 30000; echo LAST"
    )
    output = result["output"]
    assert isinstance(output, str)
    assert output.startswith("green\n1\n2\n")
    assert "[OUTPUT TRUNCATED - " in output and output.endswith("30000\nLAST\n")
    assert len(output) < 50_200


async def test_timeout_reports_124(runtime: ToolRuntime) -> None:
    start = anyio.current_time()
    result = await run(runtime, command="echo begun; sleep 1000 & sleep 1000", timeout=1)
    assert result["exit_code"] == 124
    assert result["error"] == "Command timed out after 1 seconds"
    assert result["output"] == "begun\n"
    assert anyio.current_time() - start < 10


async def test_foreground_timeout_ceiling(
    runtime: ToolRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = await run(runtime, command="true", timeout=601)
    assert "exit_code" not in result
    assert "Foreground timeout 601s exceeds the maximum of 600s" in str(result["error"])
    monkeypatch.setenv("TERMINAL_MAX_FOREGROUND_TIMEOUT", "5")
    result = await run(runtime, command="true", timeout=6)
    assert "maximum of 5s" in str(result["error"])


async def test_default_timeout_from_env(
    runtime: ToolRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERMINAL_TIMEOUT", "1")
    result = await run(runtime, command="sleep 30")
    assert result["exit_code"] == 124
    assert result["error"] == "Command timed out after 1 seconds"


async def test_workdir(runtime: ToolRuntime) -> None:
    await run(runtime, command="mkdir -p 'dir with space/ü'")
    result = await run(runtime, command="pwd", workdir="dir with space/ü")
    assert str(result["output"]).rstrip().endswith("/dir with space/ü")
    result = await run(runtime, command="pwd", workdir="missing")
    assert result["exit_code"] == 1 and "No such file or directory" in str(result["output"])
    result = await run(runtime, command="pwd", workdir="x; rm -rf /")
    assert result["status"] == "blocked" and result["exit_code"] == -1


async def test_background_result_shape(runtime: ToolRuntime) -> None:
    result = await run(runtime, command="sleep 1000", background=True)
    assert result["output"] == "Background process started"
    assert str(result["session_id"]).startswith("proc_") and len(str(result["session_id"])) == 17
    assert isinstance(result["pid"], int)
    assert result["exit_code"] == 0 and result["error"] is None
    assert "process(" in str(result["hint"])


async def test_memory_stays_bounded_for_huge_output(runtime: ToolRuntime) -> None:
    def rss_kb(field: str) -> int:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(field)

    # Reset the peak-RSS counter when the kernel allows it (Linux >= 4.0), so VmHWM measures
    # this call only; otherwise sample VmRSS while the command runs.
    with contextlib.suppress(OSError):
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    before = rss_kb("VmRSS")
    peak_sampled = before

    async def sample() -> None:
        nonlocal peak_sampled
        while True:
            peak_sampled = max(peak_sampled, rss_kb("VmRSS"))
            await anyio.sleep(0.01)

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sample)
        result = await run(runtime, command="yes | head -c 500M", timeout=120)
        tg.cancel_scope.cancel()
    elapsed = anyio.current_time() - start
    growth_mb = (max(peak_sampled, rss_kb("VmHWM")) - before) / 1024
    print(f"yes | head -c 500M: {elapsed:.1f}s, RSS growth {growth_mb:.1f} MB")
    assert result["exit_code"] == 0
    assert len(str(result["output"])) < 51_000
    assert growth_mb < 64, f"RSS grew by {growth_mb:.1f} MB"


async def test_no_sandbox_configured() -> None:
    result = await run(ToolRuntime(task_id="t"), command="ls")
    assert result == {
        "output": "",
        "exit_code": -1,
        "error": "Terminal tool disabled: no sandbox is configured for this rollout",
        "status": "disabled",
    }


async def test_sandbox_creation_failure_is_model_visible() -> None:
    factory = FakeSandboxFactory(fail_create=RuntimeError("quota exceeded"))
    async with SandboxManager(factory) as manager:
        runtime = ToolRuntime(task_id="t", sandboxes=manager)
        result = await run(runtime, command="ls")
    assert result["status"] == "disabled" and result["exit_code"] == -1
    assert "environment creation failed" in str(result["error"])
    assert "quota exceeded" in str(result["error"])


async def test_exec_error_is_model_visible() -> None:
    fake = FakeSandbox(exec_error=SandboxError("connection reset"))
    async with SandboxManager(FakeSandboxFactory(sandbox=fake)) as manager:
        runtime = ToolRuntime(task_id="t", sandboxes=manager)
        result = await run(runtime, command="ls")
    assert result == {
        "output": "",
        "exit_code": -1,
        "error": "Command execution failed: SandboxError: connection reset",
    }


async def test_empty_command_rejected(runtime: ToolRuntime) -> None:
    result = await run(runtime, command="   ")
    assert result["exit_code"] == -1 and "non-empty" in str(result["error"])


async def test_cancelled_call_leaves_no_process(runtime: ToolRuntime) -> None:
    assert runtime.sandboxes is not None
    sandbox = await runtime.sandboxes.get("t")
    with anyio.move_on_after(0.3):
        await run(runtime, command="sleep 1000 & sleep 1000 & wait")
    inner = getattr(sandbox, "inner", sandbox)
    assert find_sandbox_processes(getattr(inner, "sandbox_id", None), ()) == []


async def test_nul_byte_in_command_is_a_clear_error(runtime: ToolRuntime) -> None:
    result = await run(runtime, command="echo a\0b")
    assert result["exit_code"] == -1 and "contains a NUL byte" in str(result["error"])
