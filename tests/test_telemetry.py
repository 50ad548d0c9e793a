"""OpenTelemetry: spans of a rollout (every one ended, cancelled ones too), limiter and pool
metrics, nothing recorded without a provider."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hermes_async import _otel
from hermes_async.agent import (
    AgentOptions,
    AgentResult,
    HermesAgentLoop,
    RolloutSetup,
    ToolContext,
    run_group,
)
from hermes_async.inference import SamplingParams, VLLMGenerateClient
from hermes_async.inference.pool import ServerPool
from hermes_async.limits import Limits
from hermes_async.telemetry import configure_telemetry, serve_metrics, tracing_enabled
from hermes_async.testing import (
    FakeSandboxFactory,
    PolicyRequest,
    ScriptedModelServer,
    open_app_endpoint,
    open_loopback_server,
)
from hermes_async.tools.registry import get_tool_definitions
from hermes_async.tools.sandbox.base import ExecResult
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import TOKENIZER

pytestmark = pytest.mark.anyio

TOOLS = get_tool_definitions(["terminal"])
OPTIONS = AgentOptions(max_turns=4, sampling=SamplingParams(max_tokens=64))


def call(command: str) -> str:
    body = {"name": "terminal", "arguments": {"command": command}}
    return "<tool_call>\n" + json.dumps(body) + "\n</tool_call>"


def two_commands(request: PolicyRequest) -> str:
    done = sum(1 for m in request.messages if m.get("role") == "tool")
    return call(f"echo {done}") if done < 2 else "Done."


class Tracked(SpanProcessor):
    """Remembers every span started and every span ended."""

    def __init__(self) -> None:
        self.started: dict[int, Any] = {}
        self.ended: dict[int, ReadableSpan] = {}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started[span.context.span_id] = span

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.ended[span.context.span_id] = span

    def open_spans(self) -> list[Any]:
        return [s for i, s in self.started.items() if i not in self.ended]


@pytest.fixture
def traced() -> Iterator[tuple[Tracked, InMemorySpanExporter, InMemoryMetricReader]]:
    tracked = Tracked()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(tracked)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    configure_telemetry(tracer_provider=provider, meter_provider=MeterProvider([reader]))
    try:
        yield tracked, exporter, reader
    finally:
        configure_telemetry()  # back to the global (unset) providers


@asynccontextmanager
async def token_client(policy: Any) -> AsyncIterator[VLLMGenerateClient]:
    server = ScriptedModelServer(policy, tokenizer=TOKENIZER)
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
    ):
        yield client


def by_name(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def check(result: AgentResult, ctx: ToolContext) -> float:
    return 1.0


async def test_a_group_traces_rollout_turn_generation_tool_sandbox_and_reward(
    traced: tuple[Tracked, InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    tracked, exporter, _ = traced
    factory = FakeSandboxFactory(exec_script={"echo 0": ExecResult("0\n", "", 0)})
    async with token_client(two_commands) as client, SandboxManager(factory) as manager:
        group = await run_group(
            client,
            [{"role": "user", "content": "go"}],
            TOOLS,
            size=2,
            options=OPTIONS,
            task_ids=["t0", "t1"],
            setup=RolloutSetup(reward=check, tokenizer=TOKENIZER, sandboxes=manager),
        )
    assert group.rewards == [1.0, 1.0]
    spans = list(exporter.get_finished_spans())
    assert not tracked.open_spans()
    rollouts = by_name(spans, "rollout")
    assert {s.attributes["hermes_async.task_id"] for s in rollouts} == {"t0", "t1"}
    assert all(s.attributes["hermes_async.outcome"] == "ok" for s in rollouts)
    # One invoke_agent span per rollout (the loop's), a child of the rollout's span.
    agents = by_name(spans, "invoke_agent")
    assert len(agents) == 2
    for agent in agents:
        assert agent.name == "invoke_agent hermes-agent"
        assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert agent.attributes["hermes_async.turns"] == 3
        assert agent.parent is not None
        parent = next(s for s in rollouts if s.context.span_id == agent.parent.span_id)
        assert parent.attributes["hermes_async.task_id"] == agent.attributes["hermes_async.task_id"]
    assert len(by_name(spans, "turn")) == 6
    generations = by_name(spans, "text_completion")
    assert len(generations) == 6
    for g in generations:
        assert g.attributes["gen_ai.operation.name"] == "text_completion"
        assert g.attributes["gen_ai.request.max_tokens"] == 64
        assert g.attributes["gen_ai.usage.output_tokens"] > 0
        assert g.attributes["gen_ai.usage.input_tokens"] > 0
        assert g.attributes["gen_ai.response.finish_reasons"] == ("stop",)
        assert g.attributes["hermes_async.time_to_first_token"] >= 0
    tools = by_name(spans, "execute_tool terminal")
    assert len(tools) == 4 and all(t.attributes["gen_ai.tool.name"] == "terminal" for t in tools)
    assert len(by_name(spans, "sandbox create")) == 2
    assert len(by_name(spans, "sandbox close")) == 2
    execs = by_name(spans, "sandbox exec")
    assert len(execs) >= 4 and {0, 127} >= {e.attributes["hermes_async.exit_code"] for e in execs}
    assert len(by_name(spans, "reward")) == 2
    # Parents: tool -> turn -> rollout; the generation is a child of its turn too.
    ids = {s.context.span_id: s for s in spans}
    for child in (*tools, *generations):
        assert child.parent is not None and ids[child.parent.span_id].name == "turn"
    for turn in by_name(spans, "turn"):
        assert turn.parent is not None and ids[turn.parent.span_id].name.startswith("invoke")
    assert len(by_name(spans, "reward")) == 2
    for reward in by_name(spans, "reward"):  # the reward is the rollout's, not the agent's
        assert reward.parent is not None and ids[reward.parent.span_id].name == "rollout"


async def test_cancelled_rollouts_end_every_span_and_a_hung_tool_is_an_open_span(
    traced: tuple[Tracked, InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    tracked, exporter, _ = traced
    factory = FakeSandboxFactory(exec_hangs=True)
    async with (
        token_client(two_commands) as client,
        SandboxManager(factory) as manager,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(
            lambda: run_group(
                client,
                [{"role": "user", "content": "go"}],
                TOOLS,
                size=3,
                options=OPTIONS,
                task_ids=["h0", "h1", "h2"],
                setup=RolloutSetup(tokenizer=TOKENIZER, sandboxes=manager),
            )
        )
        with anyio.fail_after(30):  # wait for the event: three hung tool calls
            while len([s for s in tracked.open_spans() if s.name == "sandbox exec"]) < 3:
                await anyio.sleep(0.01)
        hung = [s for s in tracked.open_spans() if s.name.startswith("execute_tool")]
        assert {s.attributes["hermes_async.task_id"] for s in hung} == {"h0", "h1", "h2"}
        tg.cancel_scope.cancel("the test stops the group")
    assert not tracked.open_spans()
    spans = list(exporter.get_finished_spans())
    cancelled = [s for s in spans if s.attributes.get("hermes_async.cancelled")]
    names = {s.name for s in cancelled}
    assert {
        "rollout",
        "invoke_agent hermes-agent",
        "turn",
        "execute_tool terminal",
        "sandbox exec",
    } <= names
    assert all(s.status.description == "cancelled" for s in cancelled)
    closes = by_name(spans, "sandbox close")
    assert len(closes) == 3 and all(c.attributes["hermes_async.interrupted"] for c in closes)


async def test_a_reference_style_loop_run_is_an_agent_invocation_cancelled_or_not(
    traced: tuple[Tracked, InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    tracked, exporter, _ = traced
    for hangs in (False, True):
        factory = FakeSandboxFactory(
            exec_script={"echo 0": ExecResult("0\n", "", 0), "echo 1": ExecResult("1\n", "", 0)},
            exec_hangs=hangs,
        )
        async with token_client(two_commands) as client, SandboxManager(factory) as manager:
            loop = HermesAgentLoop(  # the reference's signature
                server=client,
                tool_schemas=TOOLS[0],
                valid_tool_names=TOOLS[1],
                max_turns=4,
                task_id=f"loop-{hangs}",
                tokenizer=TOKENIZER,
                sandboxes=manager,
                options=AgentOptions(sampling=SamplingParams(max_tokens=64)),
            )
            if not hangs:
                result = await loop.run([{"role": "user", "content": "go"}])
                assert result.turns_used == 3
                continue
            async with anyio.create_task_group() as tg:
                tg.start_soon(loop.run, [{"role": "user", "content": "go"}])
                with anyio.fail_after(30):  # until its tool hangs
                    while not any(s.name == "sandbox exec" for s in tracked.open_spans()):
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel("the test stops the run")
    assert not tracked.open_spans()
    agents = by_name(list(exporter.get_finished_spans()), "invoke_agent")
    assert [a.attributes["hermes_async.task_id"] for a in agents] == ["loop-False", "loop-True"]
    done, cancelled = agents
    assert done.attributes["hermes_async.turns"] == 3 and done.parent is None
    assert done.attributes["hermes_async.finished_naturally"] is True
    assert cancelled.attributes["hermes_async.cancelled"] is True
    assert cancelled.status.description == "cancelled"


async def test_limiter_and_pool_metrics_are_read_when_collected(
    traced: tuple[Tracked, InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    _, _, reader = traced
    limits = Limits(model_requests=7)
    server = ScriptedModelServer(two_commands, tokenizer=TOKENIZER)
    async with (
        open_loopback_server(server) as url,
        ServerPool([url], limits=limits) as pool,
        VLLMGenerateClient(pool) as client,
        limits.tool_calls,
    ):
        await client.generate([1, 2, 3], SamplingParams(max_tokens=4))
        points = metric_points(reader)
    limit_points = points["hermes_async.limiter.limit"]
    assert 7 in [v for a, v in limit_points if a["limiter"] == "model_requests"]
    assert any(
        a["limiter"] == "tool_calls" and v == 1 for a, v in points["hermes_async.limiter.in_use"]
    )
    pooled = url.removeprefix("http://")
    assert any(a["limiter"] == f"model_requests@{pooled}" for a, _ in limit_points)
    assert [v for a, v in points["hermes_async.pool.server.up"] if a["server"] == url] == [1]
    assert [v for a, v in points["hermes_async.pool.server.requests"] if a["server"] == url] == [1]
    # The pool is gone from the metrics once closed.
    after = metric_points(reader)
    assert not [a for a, _ in after.get("hermes_async.pool.server.up", []) if a["server"] == url]


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    data = reader.get_metrics_data()
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    out.setdefault(metric.name, []).append(
                        (dict(point.attributes or {}), point.value)
                    )
    return out


def test_without_a_provider_nothing_is_recorded() -> None:
    configure_telemetry()
    assert not tracing_enabled()
    assert _otel.span("x", {"a": 1}) is _otel.NO_SPAN
    configure_telemetry(tracer_provider=TracerProvider(), enabled=False)
    assert _otel.span("x") is _otel.NO_SPAN
    configure_telemetry()


async def test_the_prometheus_endpoint_shows_limiters_and_pool_servers_during_a_run() -> None:
    limits = Limits(tool_calls=3)
    server = ScriptedModelServer(two_commands, tokenizer=TOKENIZER)
    async with (
        open_loopback_server(server) as url,
        ServerPool([url], limits=limits) as pool,
        VLLMGenerateClient(pool) as client,
        anyio.create_task_group() as tg,
    ):
        port = await tg.start(serve_metrics, 0)
        await client.generate([1, 2], SamplingParams(max_tokens=4))
        async with limits.tool_calls, httpx.AsyncClient() as http:  # a slot held while scraped
            page = await http.get(f"http://127.0.0.1:{port}/metrics")
            missing = await http.get(f"http://127.0.0.1:{port}/other")
        tg.cancel_scope.cancel("the test is done")
    assert page.status_code == 200 and missing.status_code == 404
    text = page.text
    number = next(
        line.split('limits="')[1].split('"')[0]
        for line in text.splitlines()
        if 'limiter="tool_calls"' in line
        and line.startswith("hermes_async_limiter_limit")
        and line.endswith(" 3")
    )
    assert f'hermes_async_limiter_in_use{{limiter="tool_calls",limits="{number}"}} 1' in text
    assert f'hermes_async_pool_server_up{{server="{url}"}} 1' in text
    assert f'hermes_async_pool_server_requests_total{{server="{url}"}} 1' in text
    assert "# TYPE hermes_async_limiter_wait_seconds_total counter" in text


_GLOBAL_PROVIDER = """
import os, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from hermes_async import _otel

exporter = InMemorySpanExporter()
with _otel.span("before"):
    pass  # no provider yet: nothing recorded
if sys.argv[1] == "code":
    provider = TracerProvider()
    trace.set_tracer_provider(provider)
else:  # named by OTel's variable, set before the process started
    assert os.environ["OTEL_PYTHON_TRACER_PROVIDER"] == "sdk_tracer_provider"
    provider = trace.get_tracer_provider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
with _otel.span("after"):
    pass
print(",".join(s.name for s in exporter.get_finished_spans()))
"""


@pytest.mark.parametrize("how", ["code", "env"])
def test_a_global_provider_set_later_or_named_by_the_environment_is_used(how: str) -> None:
    """Spans skip OTel's own global lookup while no provider is set (a cost on every span);
    a provider set later by code, or named by OTEL_PYTHON_TRACER_PROVIDER, is still used."""
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
    if how == "env":
        env["OTEL_PYTHON_TRACER_PROVIDER"] = "sdk_tracer_provider"
    done = subprocess.run(
        [sys.executable, "-c", _GLOBAL_PROVIDER, how],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "after"
