"""hermes_async beside its peers on one agent workload: client CPU, wall time, peak RSS, completion.

Workload: N rollouts started at once, each three model turns: a call of the tool ``step``
(``{"number": 1}``), a second one (``{"number": 2}``), then a plain answer. The tool is a
coroutine that sleeps ``--tool-latency`` seconds. Every side talks to one scripted model server
(:class:`~hermes_async.testing.ScriptedModelServer`, ``--model-latency`` before each response)
running in its own process, so the server's CPU never counts against a client. Sides:

* ``hermes-chat``: ``run_group`` (groups of ``--group-size``) over ``ChatClient``: Phase 1,
  OpenAI chat completions with structured tool calls;
* ``hermes-token``: the same groups over ``VLLMGenerateClient`` with the built-in tokenizer:
  Phase 2, the token endpoint, the chat template, the incremental parser on the client
  (what trains);
* ``hermes-token-json``: the same with ``VLLMGenerateClient(stream=False)``: one JSON
  response per request instead of Server-Sent Events (like the chat side's requests);
* ``verifiers``: its ``ToolEnv`` (``evaluate`` over N examples);
* ``inspect``: ``inspect_ai.eval`` of a task whose solver is ``react(tools=[step],
  submit=False)`` over N samples.

Each side runs in its own client process (a peer in its own venv: ``bench/peers/setup.sh``,
which pins the versions), once untimed on a few rollouts, then on N. Client CPU is
``getrusage`` (user + system, all threads) over the timed run; peak RSS the process's
``ru_maxrss``. Every side may have ``--connections`` model requests in flight (hermes_async's
default limit; Inspect's ``max_connections``; the connection pool of verifiers' OpenAI client);
a run past ``--deadline`` is killed and counts as not completed. Rounds alternate the sides'
order; medians are printed with the ratios peer / ``hermes-chat``.

    PYTHONPATH=. .venv/bin/python bench/peers.py                       # N = 100, 1000
    PYTHONPATH=. .venv/bin/python bench/peers.py --sizes 5000 --rounds 1
    PYTHONPATH=. .venv/bin/python bench/peers.py --sides hermes-chat,hermes-token
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIDES = ("hermes-chat", "hermes-token", "hermes-token-json", "verifiers", "inspect")
#: The venv (under the checkout, or $HERMES_PEERS_VENVS) each peer runs in.
PEER_VENVS = {"verifiers": "verifiers", "inspect": "inspect"}
FINAL_ANSWER = "All steps are complete."
TOOL_CALLS = 2
WARM_UP = 10
MAX_TOKENS = 128
STEP_DESCRIPTION = "Carry out one numbered step of the task."


def _tool_call(number: int) -> dict[str, Any]:
    return {"name": "step", "arguments": {"number": number}}


# ------------------------------------------------------------------------------ server process


def serve(model_latency: float) -> None:
    """The scripted model server: print its base URL, then serve until killed."""
    import anyio

    sys.path.insert(0, str(HERE))
    from _scripted import serve as serve_policy, tool_turns

    anyio.run(
        serve_policy, tool_turns(TOOL_CALLS, lambda turn: _tool_call(turn + 1)), model_latency
    )


# ------------------------------------------------------------------------------ client process


def _rusage_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


Prepare = Callable[[int, str], Callable[[], int]]


def measure(prepare: Prepare, args: argparse.Namespace) -> dict[str, Any]:
    """Warm up on a few rollouts, then time a run of N.

    ``prepare(n, label)`` builds what a run needs (datasets, tasks: not timed) and returns the
    run, which returns how many rollouts completed.
    """
    prepare(min(WARM_UP, args.n), "warm")()
    run = prepare(args.n, "run")
    rss_before = _rss_kb()
    cpu, wall = _rusage_cpu(), time.perf_counter()
    completed = run()
    cpu, wall = _rusage_cpu() - cpu, time.perf_counter() - wall
    return {
        "side": args.client,
        "n": args.n,
        "cpu_s": cpu,
        "wall_s": wall,
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "rss_before_kb": rss_before,
        "completed": completed,
    }


class Hermes:
    """hermes_async's side: ``run_group`` over the chat or the token client.

    ``loop`` is ``"asyncio"`` or ``"uvloop"`` (anyio's ``use_uvloop``).
    """

    def __init__(self, args: argparse.Namespace, phase: str, loop: str = "asyncio") -> None:
        import anyio

        from hermes_async import (
            AgentOptions,
            SamplingParams,
            Tool,
            ToolRegistry,
            load_tokenizer,
        )

        self.args, self.phase, self.loop = args, phase, loop
        self.gc_tuned = False

        async def step(arguments: Any, runtime: Any) -> str:
            await anyio.sleep(args.tool_latency)
            return f"step {arguments['number']} done"

        schema = {
            "type": "object",
            "properties": {"number": {"type": "integer"}},
            "required": ["number"],
        }
        self.registry = ToolRegistry([Tool("step", STEP_DESCRIPTION, schema, step, "bench")])
        self.tools = self.registry.definitions(["bench"])
        self.tokenizer = load_tokenizer() if phase.startswith("token") else None
        self.options = AgentOptions(
            max_turns=TOOL_CALLS + 2, sampling=SamplingParams(max_tokens=MAX_TOKENS)
        )

    @staticmethod
    def completed(scored: Any) -> bool:
        """The rollout ran both tools and ended with the final answer."""
        result = scored.result
        last = result.messages[-1]
        return bool(
            result.finished_naturally
            and not result.tool_errors
            and result.turns_used == TOOL_CALLS + 1
            and last.get("role") == "assistant"
            and last.get("content") == FINAL_ANSWER
        )

    @asynccontextmanager
    async def open(self, n: int) -> AsyncIterator[tuple[Any, Any]]:
        """The model client and the rollouts' setup for a batch of ``n``."""
        from hermes_async import (
            ChatClient,
            Limits,
            RolloutSetup,
            VLLMGenerateClient,
            open_sandbox_manager,
        )

        limits = Limits(model_requests=self.args.connections, tool_calls=max(n, 1))
        client: Any
        if self.phase == "chat":
            client = ChatClient(f"{self.args.base_url}/v1", limiter=limits.model_requests)
        else:
            client = VLLMGenerateClient(
                self.args.base_url, stream=self.phase == "token", limiter=limits.model_requests
            )
        async with client, open_sandbox_manager(limits=limits) as manager:
            setup = RolloutSetup(
                tokenizer=self.tokenizer, registry=self.registry, limits=limits, sandboxes=manager
            )
            yield client, setup

    async def batch(self, n: int, label: str) -> int:
        import anyio

        from hermes_async import run_group

        completed = 0

        async def group(g: int, size: int, client: Any, setup: Any) -> None:
            nonlocal completed
            scored = await run_group(
                client,
                [{"role": "user", "content": f"Do task {label}-{g}."}],
                self.tools,
                size=size,
                setup=setup,
                options=self.options,
            )
            completed += sum(1 for r in scored.rollouts if self.completed(r))

        async with self.open(n) as (client, setup), anyio.create_task_group() as tg:
            size = self.args.group_size
            for g, start in enumerate(range(0, n, size)):
                tg.start_soon(group, g, min(size, n - start), client, setup)
        return completed

    def run(self, function: Callable[..., Any], *arguments: Any) -> Any:
        """``anyio.run`` on this side's event loop."""
        import anyio

        options = {"use_uvloop": True} if self.loop == "uvloop" else {}
        return anyio.run(function, *arguments, backend="asyncio", backend_options=options)

    def prepare(self, n: int, label: str) -> Callable[[], int]:
        from hermes_async.gc_tuning import tune_gc_for_rollouts

        if not self.gc_tuned:
            # What the docs ask of a process running many rollouts, once at its start-up (as
            # bench/concurrency.py does): untimed, like the imports and the tokenizer's load.
            tune_gc_for_rollouts()
            self.gc_tuned = True

        def run() -> int:
            return int(self.run(self.batch, n, label))

        return run


def _inspect_run(args: argparse.Namespace) -> Prepare:
    from inspect_ai import Task, eval as inspect_eval
    from inspect_ai.agent import react
    from inspect_ai.dataset import Sample
    from inspect_ai.tool import tool

    @tool
    def step() -> Any:
        async def execute(number: int) -> str:
            """Carry out one numbered step of the task.

            Args:
                number: The step's number.
            """
            import anyio

            await anyio.sleep(args.tool_latency)
            return f"step {number} done"

        return execute

    os.environ.setdefault("SCRIPTED_API_KEY", "unused")
    log_dir = tempfile.mkdtemp(prefix="hermes-bench-inspect-")
    atexit.register(shutil.rmtree, log_dir, ignore_errors=True)  # after the measurement

    def prepare(n: int, label: str) -> Callable[[], int]:
        task = Task(
            dataset=[Sample(input=f"Do task {label}-{i}.", id=i) for i in range(n)],
            solver=react(tools=[step()], submit=False),
        )
        return lambda: _inspect_completed(task_run(task, n))

    def task_run(task: Any, n: int) -> Any:
        return inspect_eval(
            task,
            model="openai-api/scripted/default",
            model_base_url=f"{args.base_url}/v1",
            max_connections=args.connections,
            max_samples=n,
            max_tokens=MAX_TOKENS,
            display="none",
            log_dir=log_dir,
            log_level="error",
        )

    return prepare


def _inspect_completed(logs: Any) -> int:
    completed = 0
    for log in logs:
        for sample in log.samples or []:
            messages = sample.messages
            tools_done = sum(1 for m in messages if m.role == "tool" and not m.error)
            if (
                tools_done == TOOL_CALLS
                and messages[-1].role == "assistant"
                and messages[-1].text == FINAL_ANSWER
            ):
                completed += 1
    return completed


def _verifiers_run(args: argparse.Namespace) -> Prepare:
    import asyncio

    import verifiers as vf
    from datasets import Dataset
    from verifiers.types import ClientConfig

    async def step(number: int) -> str:
        """Carry out one numbered step of the task.

        Args:
            number: The step's number.
        """
        await asyncio.sleep(args.tool_latency)
        return f"step {number} done"

    os.environ.setdefault("SCRIPTED_API_KEY", "unused")
    config = ClientConfig(
        api_base_url=f"{args.base_url}/v1",
        api_key_var="SCRIPTED_API_KEY",
        max_connections=args.connections,
        max_keepalive_connections=args.connections,
    )

    def prepare(n: int, label: str) -> Callable[[], int]:
        # Groups as hermes_async's: each example rolled out --group-size times.
        per_example = min(args.group_size, n)
        examples = n // per_example
        rows = [{"question": f"Do task {label}-{i}.", "answer": ""} for i in range(examples)]
        env = vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[step], max_turns=TOOL_CALLS + 2)

        def run() -> int:
            outputs = asyncio.run(
                env.evaluate(
                    client=config,
                    model="default",
                    sampling_args={"max_tokens": MAX_TOKENS},
                    num_examples=examples,
                    rollouts_per_example=per_example,
                    on_progress=lambda *a, **k: None,
                )
            )
            return _verifiers_completed(outputs)

        return run

    return prepare


def _verifiers_completed(outputs: Any) -> int:
    completed = 0
    for output in outputs["outputs"]:
        completion = output.get("completion") or []
        tools_done = sum(1 for m in completion if _role(m) == "tool")
        if (
            output.get("error") is None
            and tools_done == TOOL_CALLS
            and completion
            and _role(completion[-1]) == "assistant"
            and _content(completion[-1]) == FINAL_ANSWER
        ):
            completed += 1
    return completed


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else getattr(message, "role", None)


def _content(message: Any) -> Any:
    if isinstance(message, dict):
        return message.get("content")
    return getattr(message, "content", None)


def client(args: argparse.Namespace) -> None:
    prepare: Prepare
    if args.client.startswith("hermes-"):
        phase, _, loop = args.client.removeprefix("hermes-").partition("+")
        prepare = Hermes(args, phase, loop or "asyncio").prepare
    elif args.client == "inspect":
        prepare = _inspect_run(args)
    elif args.client == "verifiers":
        prepare = _verifiers_run(args)
    else:
        raise SystemExit(f"unknown side {args.client!r}; known: {', '.join(SIDES)}")
    print(json.dumps(measure(prepare, args)), flush=True)


# ------------------------------------------------------------------------------ orchestrator


def venv_python(side: str) -> str:
    """The python a side runs on: this one for hermes_async, the peer's venv's otherwise."""
    if side not in PEER_VENVS:
        return sys.executable
    base = os.environ.get("HERMES_PEERS_VENVS")
    name = PEER_VENVS[side]
    venv = Path(base) / name if base else ROOT / f".venv-peers-{name}"
    return str(venv / "bin" / "python")


def run_side(
    script: str, side: str, n: int, base_url: str, args: argparse.Namespace
) -> dict[str, Any] | None:
    """One timed client run of ``side`` (``script --client side``); ``None`` if it failed."""
    command = [venv_python(side), script, "--client", side, "--n", str(n), "--base-url", base_url]
    command += ["--tool-latency", str(args.tool_latency), "--connections", str(args.connections)]
    command += ["--group-size", str(args.group_size)]
    env = dict(os.environ)
    if side in PEER_VENVS:
        env.pop("PYTHONPATH", None)  # the peer's venv, nothing of this checkout
    else:
        env["PYTHONPATH"] = str(ROOT)
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=args.deadline, check=False
        )
    except subprocess.TimeoutExpired:
        print(f"    {side} N={n}: past the {args.deadline:g} s deadline, killed", flush=True)
        return None
    if done.returncode != 0:
        print(f"    {side} N={n}: exit {done.returncode}: {done.stderr[-2000:]}", flush=True)
        return None
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


Results = dict[str, list[dict[str, Any] | None]]


def median_of(rows: list[dict[str, Any] | None], key: str) -> float | None:
    """The median of ``key`` over the runs that finished (``None`` if none did)."""
    ok = [float(r[key]) for r in rows if r is not None]
    return statistics.median(ok) if ok else None


def report(n: int, results: Results, base: str) -> None:
    """The table of one N: medians per side and each one's ratio to ``base``."""
    print(f"\nN={n} (medians over rounds; ratio = side / {base})")
    print(
        f"  {'side':<20} {'CPU ms/rollout':>14} {'ratio':>7} {'wall s':>8} {'ratio':>7}"
        f" {'peak RSS MB':>11} {'ratio':>6} {'completed':>12}"
    )
    keys = ("cpu_s", "wall_s", "peak_rss_kb")
    base_values = [median_of(results.get(base, []), key) for key in keys]
    for side, rows in results.items():
        values = [median_of(rows, key) for key in keys]
        if values[0] is None:
            print(f"  {side:<20} {'did not finish in any round':>40}")
            continue
        cpu, wall, rss = (v or 0.0 for v in values)
        ratios = [
            f"{v / b:.1f}x" if v is not None and b else ""
            for v, b in zip(values, base_values, strict=True)
        ]
        done = min(int(r["completed"]) for r in rows if r is not None)
        lost = sum(1 for r in rows if r is None)
        print(
            f"  {side:<20} {cpu / n * 1e3:14.2f} {ratios[0]:>7} {wall:8.1f} {ratios[1]:>7}"
            f" {rss / 1024:11.0f} {ratios[2]:>6} {done:>6}/{n}"
            + (f" ({lost} run(s) lost)" if lost else "")
        )


def compare(script: str, sides: list[str], args: argparse.Namespace) -> dict[int, Results]:
    """Serve, then run every side at every N in rounds of alternating order; print each run.

    Returns the runs per N and side (``None`` for a run that failed or passed the deadline).
    """
    peers = sorted({PEER_VENVS[s] for s in sides if s in PEER_VENVS})
    if peers and not args.no_setup:
        subprocess.run(["bash", str(HERE / "peers" / "setup.sh"), *peers], check=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    for n in sizes:
        if n % args.group_size:
            raise SystemExit(f"N={n} is not a multiple of --group-size {args.group_size}")
    serve_command = [
        sys.executable,
        __file__,
        "--serve",
        "--model-latency",
        str(args.model_latency),
    ]
    server = subprocess.Popen(
        serve_command,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    out: dict[int, Results] = {}
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().split()[0]
        print(
            f"scripted chat/token server (own process) at {base_url}; model latency "
            f"{args.model_latency}s, tool latency {args.tool_latency}s; {TOOL_CALLS} tool calls + "
            f"answer per rollout, groups of {args.group_size}; at most {args.connections} model "
            f"requests in flight per side; {args.rounds} rounds, sides alternating"
        )
        for n in sizes:
            results: Results = {side: [] for side in sides}
            for r in range(args.rounds):
                order = sides[r % len(sides) :] + sides[: r % len(sides)]
                for side in order:
                    row = run_side(script, side, n, base_url, args)
                    results[side].append(row)
                    if row is not None:
                        print(
                            f"  round {r} N={n} {side:<20} CPU {row['cpu_s'] / n * 1e3:8.2f} ms/"
                            f"rollout, wall {row['wall_s']:7.1f} s, peak RSS "
                            f"{row['peak_rss_kb'] / 1024:6.0f} MB, completed "
                            f"{row['completed']}/{n}",
                            flush=True,
                        )
            out[n] = results
    finally:
        server.terminate()
        server.wait()
    return out


def _hermes_on_uvloop(side: str) -> bool:
    base, _, loop = side.partition("+")
    return base.startswith("hermes-") and base in SIDES and loop == "uvloop"


def add_arguments(parser: argparse.ArgumentParser, sides: tuple[str, ...]) -> None:
    """The options every side-by-side script of this workload takes."""
    parser.add_argument("--sizes", default="100,1000", help="comma-separated N")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sides", default=",".join(sides), help="comma-separated subset")
    parser.add_argument("--model-latency", type=float, default=0.05, help="seconds per response")
    parser.add_argument("--tool-latency", type=float, default=0.05, help="seconds per tool call")
    parser.add_argument("--connections", type=int, default=64, help="model requests in flight")
    parser.add_argument("--group-size", type=int, default=10, help="rollouts per prompt")
    parser.add_argument("--deadline", type=float, default=1800.0, help="seconds per client run")
    parser.add_argument("--no-setup", action="store_true", help="do not run bench/peers/setup.sh")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in SIDES and not _hermes_on_uvloop(s)]
    if unknown:
        raise SystemExit(
            f"unknown side(s) {unknown}; known: {', '.join(SIDES)} (hermes-*+uvloop: on uvloop)"
        )
    for n, results in compare(__file__, sides, args).items():
        report(n, results, sides[0])
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser, SIDES)
    ns = parser.parse_args()
    if ns.serve:
        serve(ns.model_latency)
    elif ns.client:
        client(ns)
    else:
        sys.exit(main(ns))
