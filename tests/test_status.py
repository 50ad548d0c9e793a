"""The live view: rollouts in flight by phase, limiter saturation, servers up (issue #21).

``run_status`` is read while a group is held in its tools and then in its rewards; the same
status comes back from the Prometheus text (what ``hermes-async status`` reads), and the CLI
prints the line from a real endpoint on loopback.
"""

from __future__ import annotations

import io
import json

import anyio
import pytest

from hermes_async import cli
from hermes_async.agent import AgentOptions, AgentResult, RolloutSetup, ToolContext, run_group
from hermes_async.envs.display import ProgressBar
from hermes_async.inference import SamplingParams
from hermes_async.limits import Limits
from hermes_async.telemetry import (
    LimiterStatus,
    RunStatus,
    format_status,
    prometheus_text,
    run_status,
    serve_metrics,
    status_from_prometheus,
)
from hermes_async.testing import (
    FakeSandboxFactory,
    PolicyRequest,
    ScriptedModelServer,
    open_app_endpoint,
)
from hermes_async.tools.registry import get_tool_definitions
from hermes_async.tools.sandbox.base import ExecResult
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import TOKENIZER, wait_until

pytestmark = pytest.mark.anyio

GROUP = 4


def one_command(request: PolicyRequest) -> str:
    if any(m.get("role") == "tool" for m in request.messages):
        return "Done."
    body = {"name": "terminal", "arguments": {"command": "echo hi"}}
    return "<tool_call>\n" + json.dumps(body) + "\n</tool_call>"


@pytest.mark.virtual_clock
async def test_status_follows_a_group_through_tools_and_rewards() -> None:
    from hermes_async.inference import VLLMGenerateClient

    tools_open = anyio.Event()
    rewards_open = anyio.Event()

    async def held_command(command: str) -> ExecResult:
        await tools_open.wait()
        return ExecResult("hi\n", "", 0)

    async def held_reward(result: AgentResult, ctx: ToolContext) -> float:
        await rewards_open.wait()
        return 1.0

    limits = Limits(tool_calls=2 * GROUP)
    server = ScriptedModelServer(one_command, tokenizer=TOKENIZER)
    seen: dict[str, RunStatus] = {}
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
        SandboxManager(FakeSandboxFactory(exec_script=held_command), limits=limits) as manager,
        anyio.create_task_group() as tg,
    ):
        before = run_status()

        async def group() -> None:
            await run_group(
                client,
                [{"role": "user", "content": "say hi"}],
                get_tool_definitions(["terminal"]),
                size=GROUP,
                options=AgentOptions(max_turns=3, sampling=SamplingParams(max_tokens=64)),
                setup=RolloutSetup(
                    reward=held_reward, tokenizer=TOKENIZER, sandboxes=manager, limits=limits
                ),
            )

        tg.start_soon(group)
        await wait_until(lambda: run_status().tools - before.tools == GROUP)
        seen["tools"] = run_status()
        # What `hermes-async status` reads is what the process sees.
        assert status_from_prometheus(prometheus_text()) == seen["tools"]
        tools_open.set()
        await wait_until(lambda: run_status().reward - before.reward == GROUP)
        seen["reward"] = run_status()
        rewards_open.set()
    after = run_status()
    assert seen["tools"].rollouts - before.rollouts == GROUP
    assert seen["tools"].reward == before.reward
    assert seen["reward"].rollouts - before.rollouts == GROUP
    assert seen["reward"].tools == before.tools
    assert (after.rollouts, after.reward) == (before.rollouts, before.reward)
    line = format_status(seen["tools"])
    assert line.startswith(f"rollouts {seen['tools'].rollouts} (model ")
    assert f"tools {seen['tools'].tools}," in line and "tool_calls " in line


def test_the_status_line_shows_saturation_waits_and_servers() -> None:
    status = RunStatus(
        rollouts=812,
        model=64,
        tools=401,
        reward=12,
        limiters=(
            LimiterStatus("browser_sessions", 0, 16.0, 0),
            LimiterStatus("model_requests", 64, 64.0, 210),
            LimiterStatus("sandbox_create", 3, 16.0, 0),
            LimiterStatus("tool_calls", 401, 512.0, 0),
            LimiterStatus("web_pages", 8, 8.0, 0),
        ),
        servers_up=3,
        servers=4,
    )
    assert format_status(status) == (
        "rollouts 812 (model 64, tools 401, reward 12) | model_requests 64/64 +210 waiting, "
        "sandbox_create 3/16, tool_calls 401/512, web_pages 8/8 | servers 3/4 up"
    )
    assert format_status(RunStatus()) == "rollouts 0 (model 0, tools 0, reward 0)"


def test_a_page_that_is_not_ours_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="hermes_async endpoint"):
        status_from_prometheus('# TYPE up gauge\nup{job="x"} 1\n')


def test_the_progress_bar_carries_the_status_line() -> None:
    out = io.StringIO()
    bar = ProgressBar(2, "  rollouts", stream=out, status=lambda: "rollouts 1 (...)")
    bar.advance("train:a")
    assert (
        out.getvalue()
        == "  rollouts [###############...............] 1/2 train:a | rollouts 1 (...)\n"
    )


async def test_hermes_async_status_prints_the_line_of_a_running_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    limits = Limits(tool_calls=3)
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_metrics, 0)
        async with limits.tool_calls:
            code = await cli._status(f"http://127.0.0.1:{port}", None)
        tg.cancel_scope.cancel("the test is done")
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("rollouts ") and "tool_calls " in out, out
    assert out.count("\n") == 1


async def test_hermes_async_status_says_why_it_cannot_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()  # nothing listens there now
    code = await cli._status(f"http://127.0.0.1:{port}/metrics", None)
    assert code == 1
    assert f"127.0.0.1:{port}/metrics" in capsys.readouterr().err


def test_status_flags_are_checked() -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["status", "--watch", "0"])
    assert exited.value.code == 2
