"""Tracing on vs off: client CPU per rollout at 2,000 concurrent rollouts, in one run.

Workload: ``--groups`` groups of ``--size`` rollouts at once (default 250 x 8 = 2,000), each
``--turns`` tool-calling turns and an answer, through ``run_group`` (rollout, turn, generation,
tool, sandbox release and reward spans), against the scripted model server in a *separate
process* over loopback (its CPU does not count). The tool is a coroutine (``anyio.sleep``); the
sandboxes are fakes, shared through one manager.

* **off**: opentelemetry-api importable, no SDK provider configured (what a user gets without
  ``[otel]`` set up): the span sites take the no-op path.
* **batch**: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` into an
  ``InMemorySpanExporter`` (the processor OpenTelemetry recommends for production: a span's end
  queues it, the SDK's worker thread exports batches; that thread's CPU counts too, the clock
  is the process's), and an SDK ``MeterProvider`` with an in-memory reader. The acceptance line.
* **simple**: the same with a ``SimpleSpanProcessor`` (each span exported synchronously as it
  ends; OpenTelemetry's processor for debugging and tests).
* **bare** (``--modes`` only): an SDK ``TracerProvider`` with no processor: the SDK's own cost
  of creating and ending spans, the floor under any exporter.
* **drop** (``--modes`` only): ``batch`` into an exporter that counts the spans and keeps none
  (as a network exporter does once a batch is sent): what keeping every span in memory costs.

The collector runs as shipped (``tune_gc_for_rollouts()``). Every exporter keeps every span of its round (they are counted afterwards). Rounds alternate
(off, batch, simple, off, ...) so drift on a shared machine hits every mode; the reported
ratios are the median CPU per rollout of each mode over that of ``off``.

    .venv/bin/python bench/telemetry.py                    # 250 x 8 rollouts, 3 rounds each
    .venv/bin/python bench/telemetry.py --groups 50 --rounds 5 --modes off,batch,bare
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from _scripted import scripted_group, serve, server_process, tool_turns
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hermes_async import Limits, Tool, ToolRegistry, ToolRuntime, load_tokenizer
from hermes_async.agent import AgentOptions
from hermes_async.gc_tuning import tune_gc_for_rollouts
from hermes_async.inference import SamplingParams
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.jsontypes import JSONObject
from hermes_async.telemetry import configure_telemetry, tracing_enabled
from hermes_async.testing import FakeSandboxFactory, PolicyRequest
from hermes_async.tools.sandbox.manager import SandboxManager

WAIT_SCHEMA: JSONObject = {
    "type": "object",
    "properties": {"seconds": {"type": "number"}},
    "required": ["seconds"],
}


def make_policy(turns: int, tool_latency: float) -> Callable[[PolicyRequest], str]:
    return tool_turns(turns, lambda _: {"name": "wait", "arguments": {"seconds": tool_latency}})


async def one_round(base_url: str, args: argparse.Namespace, label: str) -> tuple[float, int]:
    """``(client CPU seconds, rollouts that finished cleanly)`` of one round."""
    tokenizer = load_tokenizer()

    async def wait(arguments: JSONObject, runtime: ToolRuntime) -> str:
        await anyio.sleep(float(arguments["seconds"]))
        return '{"ok": true}'

    registry = ToolRegistry([Tool("wait", "Wait.", WAIT_SCHEMA, wait, "terminal")])
    tools = registry.definitions(["terminal"])
    n = args.groups * args.size
    limits = Limits(tool_calls=n, model_requests=args.model_requests)
    options = AgentOptions(max_turns=args.turns + 1, sampling=SamplingParams(max_tokens=128))
    clean = 0

    cpu = time.process_time()
    async with (
        VLLMGenerateClient(base_url, limiter=limits.model_requests) as client,
        SandboxManager(FakeSandboxFactory(), limits=limits) as manager,
    ):

        async def group(g: int) -> None:
            nonlocal clean
            scored = await scripted_group(
                client,
                tools,
                f"{label}-{g}",
                size=args.size,
                tokenizer=tokenizer,
                options=options,
                sandboxes=manager,
                limits=limits,
                registry=registry,
            )
            clean += sum(1 for r in scored.rollouts if r.error is None)

        async with anyio.create_task_group() as tg:
            for g in range(args.groups):
                tg.start_soon(group, g)
    return time.process_time() - cpu, clean


async def main(args: argparse.Namespace) -> None:
    load_tokenizer().apply_chat_template([{"role": "user", "content": "x"}], None)
    tune_gc_for_rollouts()
    arguments = ["--model-latency", str(args.model_latency), "--turns", str(args.turns)]
    arguments += ["--tool-latency", str(args.tool_latency)]
    n = args.groups * args.size
    modes = args.modes
    unknown = set(modes) - {"off", "batch", "simple", "bare", "drop"}
    if unknown or "off" not in modes:
        raise SystemExit(f"--modes: from off,batch,simple,bare,drop, with off; got {args.modes}")
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    spans_per_rollout = 0.0
    async with server_process(__file__, arguments) as base_url:
        print(
            f"scripted server (separate process) at {base_url}; {args.groups} groups x "
            f"{args.size} = {n} concurrent rollouts, {args.turns} tool turns + answer each; "
            f"model latency {args.model_latency}s, tool latency {args.tool_latency}s"
        )
        try:
            await one_round(base_url, args, "warmup")
            for r in range(args.rounds):
                for mode in modes:
                    provider, exported, reader = configure(mode)
                    seconds, clean = await one_round(base_url, args, f"{mode}{r}")
                    if provider is not None:
                        provider.shutdown()  # flushes the batch processor's queue
                    cpu[mode].append(seconds / n)
                    spans = exported()
                    if mode in ("batch", "simple", "drop"):
                        spans_per_rollout = spans / n
                    if reader is not None:
                        reader.get_metrics_data()
                    print(
                        f"  round {r} {mode:6s}: client CPU {seconds / n * 1e3:6.2f} ms/rollout, "
                        f"{clean}/{n} clean, {spans / n:.1f} spans/rollout",
                        flush=True,
                    )
        finally:
            configure_telemetry()
    off, off_min = statistics.median(cpu["off"]), min(cpu["off"])
    print(
        f"\nclient CPU per rollout over {args.rounds} rounds ({spans_per_rollout:.1f} spans per "
        "rollout traced); the median, and the least (a busy machine only ever adds CPU time):"
    )
    for mode in modes:
        median, least = statistics.median(cpu[mode]), min(cpu[mode])
        print(
            f"  {mode:6s} median {median * 1e3:.2f} ms, ratio to off {median / off:.3f} "
            f"({(median / off - 1) * 100:+.1f}%); least {least * 1e3:.2f} ms, ratio "
            f"{least / off_min:.3f} ({(least / off_min - 1) * 100:+.1f}%)"
        )
    for processor in ("none", "batch", "simple"):
        site = span_site_cost(processor)
        print(
            f"one span site, CPU, processor {processor:6s}: {site * 1e6:6.2f} us "
            f"(x {spans_per_rollout:.0f} per rollout: {site * spans_per_rollout / off:.2%} "
            "of a rollout)"
        )
    print(f"one span site, CPU, tracing off:          {span_site_cost(None) * 1e6:6.2f} us")


class CountingExporter(SpanExporter):
    """Counts the spans it is given and keeps none."""

    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def configure(mode: str) -> tuple[TracerProvider | None, Callable[[], int], Any]:
    """Set up tracing for one round of ``mode``: ``(provider, spans exported, metric reader)``."""
    if mode == "off":
        configure_telemetry()  # no SDK configured
        assert not tracing_enabled()
        return None, lambda: 0, None
    provider = TracerProvider()
    kept = InMemorySpanExporter()
    counted = CountingExporter()
    if mode in ("batch", "drop"):
        # A queue as large as a round's spans: nothing is dropped (dropped spans would be
        # cheaper, not comparable).
        target: SpanExporter = kept if mode == "batch" else counted
        provider.add_span_processor(BatchSpanProcessor(target, max_queue_size=1 << 17))
    elif mode == "simple":
        provider.add_span_processor(SimpleSpanProcessor(kept))
    reader = InMemoryMetricReader()
    configure_telemetry(tracer_provider=provider, meter_provider=MeterProvider([reader]))
    assert tracing_enabled()
    return provider, lambda: len(kept.get_finished_spans()) + counted.count, reader


def span_site_cost(processor: str | None, *, n: int = 20_000) -> float:
    """CPU seconds of one ``with span(...)`` site (two attributes and one set).

    ``processor``: ``None`` (tracing off), ``"none"`` (an SDK provider without processors),
    ``"batch"`` or ``"simple"`` (into an in-memory exporter).
    """
    from hermes_async._otel import span

    provider: TracerProvider | None = None
    if processor is None:
        configure_telemetry()
    else:
        provider = TracerProvider()
        exporter = InMemorySpanExporter()
        if processor == "batch":
            provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 17))
        elif processor == "simple":
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        configure_telemetry(tracer_provider=provider)
    try:
        start = time.process_time()
        for _ in range(n):
            with span("turn", {"hermes_async.task_id": "t", "hermes_async.turn": 1}) as s:
                s.set("hermes_async.reward", 1.0)
        if provider is not None:
            provider.shutdown()
        return (time.process_time() - start) / n
    finally:
        configure_telemetry()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--groups", type=int, default=250)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--modes",
        type=lambda text: text.split(","),
        default=["off", "batch", "simple"],
        help="comma-separated, from off,batch,simple,bare,drop (off is always needed)",
    )
    parser.add_argument("--model-latency", type=float, default=0.05)
    parser.add_argument("--tool-latency", type=float, default=0.05)
    parser.add_argument("--model-requests", type=int, default=64)
    parsed = parser.parse_args()
    if parsed.serve:
        anyio.run(serve, make_policy(parsed.turns, parsed.tool_latency), parsed.model_latency)
    else:
        anyio.run(main, parsed)
