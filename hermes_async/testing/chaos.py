"""A chaos harness: many rollouts against a misbehaving world, and what came out of it.

:func:`run_chaos` runs groups of rollouts against the scripted model server and fake or
local sandboxes, injecting faults reproducibly from ``seed`` at every decision point.
:class:`ChaosStatistics` says whether the containment held. The faults and the verdict's
rules: docs/decisions/051-chaos-harness.md.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias, get_args

import anyio

from hermes_async._cleanup import bounded_cleanup
from hermes_async._paced import start_paced
from hermes_async.agent import (
    FAILURE_CATEGORIES,
    AgentOptions,
    AgentResult,
    FailurePolicy,
    RolloutSetup,
    ScoredGroup,
    ScoredRollout,
    ToolContext,
    run_group,
)
from hermes_async.errors import SandboxError
from hermes_async.inference import HTTPOptions, RetryPolicy
from hermes_async.inference.chat import ChatClient
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.inference.tokenizer import Tokenizer, load_tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.testing.fake_sandbox import FakeSandbox
from hermes_async.testing.http import open_app_endpoint
from hermes_async.testing.scripted_server import (
    Fault,
    PolicyRequest,
    ScriptedModelServer,
    hermes_tool_call,
)
from hermes_async.tools.registry import get_tool_definitions
from hermes_async.tools.sandbox.base import ExecResult, Sandbox
from hermes_async.tools.sandbox.manager import SandboxManager

__all__ = (
    "ALL_FAULTS",
    "CHAOS_SECRET",
    "HOSTILE_TEXTS",
    "ChaosConfig",
    "ChaosFault",
    "ChaosStatistics",
    "run_chaos",
)

ChaosFault: TypeAlias = Literal[
    "server_500",
    "server_429",
    "disconnect",
    "malformed_chunk",
    "stall",
    "create_failure",
    "create_hang",
    "exec_hang",
    "exec_death",
    "reward_raises",
    "hostile_text",
]

#: Every fault kind.
ALL_FAULTS: tuple[ChaosFault, ...] = get_args(ChaosFault)

_SERVER: tuple[ChaosFault, ...] = (
    "server_500",
    "server_429",
    "disconnect",
    "malformed_chunk",
    "stall",
)
_SANDBOX: tuple[ChaosFault, ...] = ("create_failure", "create_hang", "exec_hang", "exec_death")

#: A credential planted in reward errors and model text; it must never come out unredacted.
CHAOS_SECRET = "sk-chaos0123456789abcdefghijklmnop"

#: What a hostile model writes (the issue's reproductions and more).
HOSTILE_TEXTS: tuple[str, ...] = (
    # ~1,000 levels of JSON nesting in a call
    '<tool_call>\n{"name": "terminal", "arguments": {"command": '
    + '{"a": ' * 1000
    + "1"
    + "}" * 1000
    + "}}\n</tool_call>",
    "{" * 9,  # nine braces in a row
    # lone surrogates, escaped in the JSON of the arguments
    '<tool_call>\n{"name": "terminal", "arguments": {"command": "echo \\ud800 \\udfff"}}\n'
    "</tool_call>",
    '<tool_call>\n{"name": "terminal", "arguments": {"command": \n</tool_call>',  # broken JSON
    '<tool_call>\n{"name": "teleport", "arguments": {"to": "mars"}}\n</tool_call>',  # unknown
    '<tool_call>\n{"name": "terminal", "arguments": {"command": 42}}\n</tool_call>',  # bad type
    '<tool_call>\n{"name": "terminal"',  # never closed
    "<tool_call>" * 40,
    "\x00\x01\x02 binary \x1b[31m noise \x7f" * 50,
    f"my key is {CHAOS_SECRET} and AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY",
    "z" * 5000,  # longer than max_tokens: cut off
)


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """One chaos run.

    Attributes:
        rollouts: Rollouts in total (rounded up to whole groups).
        concurrency: Groups running at once.
        fault_rate: Probability that one decision point is faulted.
        sandbox: ``"fake"`` (:class:`FakeSandbox`) or ``"local"`` (real local sandboxes).
        protocol: ``"vllm"`` (Phase 2 tokens) or ``"chat"`` (Phase 1).
        loopback: Serve the model over a real loopback socket (needs the ``testing`` extra).
        rollout_timeout: Each rollout's deadline (covers loop, reward and release).
        read_timeout: The client's longest silence (a stalled server).
        policy: The groups' failure policy (default: retry with short backoffs).
        slack_seconds: Scheduling slack allowed on top of ``rollout_timeout + close_timeout``.
    """

    rollouts: int = 200
    group_size: int = 8
    concurrency: int = 8
    seed: int = 0
    fault_rate: float = 0.08
    faults: tuple[ChaosFault, ...] = ALL_FAULTS
    sandbox: Literal["fake", "local"] = "fake"
    protocol: Literal["vllm", "chat"] = "vllm"
    loopback: bool = False
    rollout_timeout: float = 10.0
    close_timeout: float = 2.0
    create_timeout: float = 1.0
    tool_timeout: float = 0.5
    read_timeout: float = 1.0
    max_turns: int = 4
    policy: FailurePolicy = field(
        default_factory=lambda: FailurePolicy(backoff_seconds=0.01, max_backoff_seconds=0.05)
    )
    slack_seconds: float = 2.0

    def __post_init__(self) -> None:
        if self.rollouts < 1 or self.group_size < 1 or self.concurrency < 1:
            raise ValueError("rollouts, group_size and concurrency must be >= 1")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError(f"fault_rate must be in [0, 1], got {self.fault_rate!r}")
        unknown = set(self.faults) - set(ALL_FAULTS)
        if unknown:
            raise ValueError(f"unknown chaos faults {sorted(unknown)}; known: {ALL_FAULTS}")


@dataclass(frozen=True, slots=True)
class ChaosStatistics:
    """What a chaos run measured; :attr:`ok` is the verdict.

    Attributes:
        rollouts: Final rollouts (one per slot of every group).
        attempts: Rollout attempts, retries included.
        group_aborts: Groups whose ``run_group`` raised.
        mixed_groups: Kept groups holding an infra/verifier failure (policy retry or mask).
        failures: Attempts per failure category (``none`` for clean ones).
        causes: Attempts per ``category/source/exception`` of their failure.
        over_deadline: Attempts that took longer than the deadline + close bound + slack.
        secret_leaks: Places the planted credential appeared unredacted.
        leaked_sandboxes: Sandboxes left open (or sandbox directories left behind).
        leaked_fds: File descriptors open after the run that were not before.
    """

    rollouts: int
    attempts: int
    groups: int
    group_aborts: int
    abort_errors: tuple[str, ...]
    mixed_groups: int
    outcomes: dict[str, int]
    failures: dict[str, int]
    causes: dict[str, int]
    faults: dict[str, int]
    uncategorized: int
    over_deadline: int
    max_attempt_seconds: float
    secret_leaks: int
    leaked_sandboxes: int
    leaked_tasks: int
    leaked_fds: int
    seconds: float

    @property
    def ok(self) -> bool:
        """Containment held: no aborts, no mixed groups, all on time and categorized, no leaks."""
        return not (
            self.group_aborts
            or self.mixed_groups
            or self.uncategorized
            or self.over_deadline
            or self.secret_leaks
            or self.leaked_sandboxes
            or self.leaked_tasks
            or self.leaked_fds
        )

    def format(self) -> str:
        lines = [
            f"{self.rollouts} rollouts ({self.attempts} attempts) in {self.groups} groups, "
            f"{self.seconds:.1f} s ({self.attempts / max(self.seconds, 1e-9):.0f} attempts/s)",
            f"  group aborts {self.group_aborts}, mixed groups {self.mixed_groups}, "
            f"uncategorized {self.uncategorized}, over deadline {self.over_deadline} "
            f"(max attempt {self.max_attempt_seconds:.2f} s), secret leaks {self.secret_leaks}",
            f"  leaked: sandboxes {self.leaked_sandboxes}, tasks {self.leaked_tasks}, "
            f"fds {self.leaked_fds}",
            "  outcomes: " + _counts(self.outcomes),
            "  failures: " + _counts(self.failures),
            "  causes: " + _counts(self.causes),
            "  faults injected: " + _counts(self.faults),
            f"  verdict: {'OK' if self.ok else 'FAILED'}",
        ]
        lines.extend(f"  abort: {error}" for error in self.abort_errors)
        return "\n".join(lines)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "-"


class _World:
    """The faulty world of one run: decisions, the policy, the sandboxes, the reward."""

    def __init__(self, config: ChaosConfig, tokenizer: Tokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.injected: Counter[str] = Counter()
        self.fakes: list[FakeSandbox] = []
        self.root = Path(tempfile.mkdtemp(prefix="hermes-chaos-"))
        self._local: Callable[[str], Awaitable[Sandbox]] | None = None

    def decide(self, point: str, kinds: tuple[ChaosFault, ...]) -> ChaosFault | None:
        """The fault at one decision point (reproducible from the seed and the point)."""
        enabled = [k for k in kinds if k in self.config.faults]
        if not enabled:
            return None
        rng = random.Random(f"{self.config.seed}:{point}")
        if rng.random() >= self.config.fault_rate:
            return None
        kind = rng.choice(enabled)
        self.injected[kind] += 1
        return kind

    # ---- the model server

    def fault_plan(self, number: int, body: JSONObject) -> Fault | None:
        kind = self.decide(f"request:{number}", _SERVER)
        if kind == "server_500":
            return Fault.http_error(500)
        if kind == "server_429":
            return Fault.rate_limited(0.01)
        if kind == "disconnect":
            return Fault.disconnect(after_tokens=2)
        if kind == "malformed_chunk":
            return Fault.malformed(after_tokens=2)
        if kind == "stall":
            return Fault.stall(after_tokens=1)
        return None

    def policy(self, request: PolicyRequest) -> str:
        if self.decide(f"reply:{request.request_number}", ("hostile_text",)):
            rng = random.Random(f"{self.config.seed}:hostile:{request.request_number}")
            return rng.choice(HOSTILE_TEXTS)
        done = sum(1 for m in request.messages if m.get("role") == "tool")
        if done == 0:
            return hermes_tool_call("terminal", {"command": "echo step one"})
        if done == 1:
            local_hang = self.config.sandbox == "local" and self.decide(
                f"command:{request.request_number}", ("exec_hang",)
            )
            return hermes_tool_call(
                "terminal", {"command": "sleep 30" if local_hang else "echo step two"}
            )
        return "Done: both steps ran."

    # ---- the sandboxes

    async def factory(self, task_id: str) -> Sandbox:
        kinds = _SANDBOX if self.config.sandbox == "fake" else ("create_failure", "exec_death")
        kind = self.decide(f"sandbox:{task_id}", kinds)
        if kind == "create_failure":
            raise SandboxError(f"chaos: no capacity for {task_id}", task_id=task_id)
        if kind == "create_hang":
            await anyio.sleep_forever()
        if self.config.sandbox == "local":
            if self._local is None:
                from hermes_async.tools.sandbox.local import local_factory

                self._local = local_factory(str(self.root))
            sandbox = await self._local(task_id)
            if kind == "exec_death":
                # A box that died under the rollout. Closed as a release is (shielded and
                # bounded): a cancelled close would leave its directory behind, and the sandbox
                # counts as closed, so the manager's own release would not remove it again.
                await bounded_cleanup(
                    f"kill the chaos sandbox of {task_id!r}",
                    lambda: sandbox.aclose(interrupted=True),
                    timeout=self.config.close_timeout,
                )
            return sandbox
        fake = FakeSandbox(
            task_id,
            exec_script=_hanging_step_two
            if kind == "exec_hang"
            else {"*": ExecResult("ok\n", "", 0)},
            dies_after_execs=1 if kind == "exec_death" else None,
        )
        self.fakes.append(fake)
        return fake

    def open_sandboxes(self) -> int:
        """Sandboxes left open (fake) or directories left behind (local)."""
        if self.config.sandbox == "fake":
            return sum(1 for fake in self.fakes if not fake.closed)
        return sum(1 for _ in self.root.iterdir())

    # ---- the reward

    async def reward(self, result: AgentResult, ctx: ToolContext) -> float:
        if self.decide(f"reward:{ctx.task_id}", ("reward_raises",)):
            raise RuntimeError(f"chaos: the verifier crashed (its key {CHAOS_SECRET})")
        out = await ctx.terminal("echo verify", timeout=5)
        if out.get("exit_code") != 0:
            return 0.0
        return 1.0 if result.finished_naturally else 0.0


async def _hanging_step_two(command: str) -> ExecResult:
    # The loop's second command hangs (as ``sleep 30`` does on a local sandbox); the sandbox
    # itself stays healthy, so the reward's own command still answers. The terminal tool wraps
    # the model's command (it carries the working directory over), hence ``in``.
    if "echo step two" in command:
        await anyio.sleep_forever()
    return ExecResult("ok\n", "", 0)


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: not measured
        return 0


@asynccontextmanager
async def _open_client(
    config: ChaosConfig, world: _World, server: ScriptedModelServer
) -> AsyncIterator[Any]:
    options = HTTPOptions(
        read_timeout=config.read_timeout,
        retry=RetryPolicy(initial_backoff_seconds=0.01, max_backoff_seconds=0.05),
    )
    async with AsyncExitStack() as stack:
        url, transport = await stack.enter_async_context(
            open_app_endpoint(server, loopback=config.loopback)
        )
        client: Any
        if config.protocol == "chat":
            client = ChatClient(url + "/v1", model="scripted", options=options, transport=transport)
        else:
            client = VLLMGenerateClient(
                url, options=options, transport=transport, vocab_size=len(world.tokenizer)
            )
        yield await stack.enter_async_context(client)


async def run_chaos(config: ChaosConfig, *, tokenizer: Tokenizer | None = None) -> ChaosStatistics:
    """Run the chaos described by ``config`` and measure the containment.

    Args:
        config: The run.
        tokenizer: Default: the built-in offline Qwen one.

    **Cancellation**: every group is cancelled, every sandbox released; nothing is returned.
    """
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
    gc.collect()
    fds_before = _open_fds()
    tasks_before = len(anyio.get_running_tasks())
    world = _World(config, tokenizer)
    server = ScriptedModelServer(
        world.policy, tokenizer=tokenizer, seed=config.seed, fault_plan=world.fault_plan
    )
    tools = get_tool_definitions(["terminal"])
    options = AgentOptions(
        max_turns=config.max_turns,
        max_tokens=4096,
        tool_timeout=config.tool_timeout,
        rollout_timeout=config.rollout_timeout,
    )
    groups_total = math.ceil(config.rollouts / config.group_size)
    groups: list[ScoredGroup] = []
    aborts: list[str] = []
    limiter = anyio.CapacityLimiter(config.concurrency)
    limits = Limits(model_requests=256, sandbox_create=64, sandbox_exec=256, tool_calls=256)
    start = time.perf_counter()
    try:
        async with (
            _open_client(config, world, server) as client,
            SandboxManager(
                world.factory,
                limits=limits,
                idle_timeout=None,
                create_timeout=config.create_timeout,
                close_timeout=config.close_timeout,
            ) as manager,
        ):

            async def group(number: int) -> None:
                async with limiter:
                    try:
                        groups.append(
                            await run_group(
                                client,
                                [{"role": "user", "content": f"Run both steps ({number})."}],
                                tools,
                                size=config.group_size,
                                task_ids=[f"g{number}-r{i}" for i in range(config.group_size)],
                                options=options,
                                setup=RolloutSetup(
                                    reward=world.reward,
                                    tokenizer=tokenizer,
                                    sandboxes=manager,
                                    limits=limits,
                                    failure_policy=config.policy,
                                ),
                            )
                        )
                    except Exception as exc:  # an abort: what the harness exists to catch
                        if len(aborts) < 5:
                            aborts.append(f"{type(exc).__name__}: {exc}"[:500])
                        else:
                            aborts.append("")

            async with anyio.create_task_group() as tg:
                await start_paced(tg, group, range(groups_total))
            still_open = manager.statistics().active
        seconds = time.perf_counter() - start
    finally:
        leftovers = world.open_sandboxes()
        if config.sandbox == "local":
            import shutil

            shutil.rmtree(world.root, ignore_errors=True)
        else:
            os.rmdir(world.root)
    gc.collect()
    return _statistics(
        config,
        groups,
        aborts,
        world.injected,
        seconds=seconds,
        leaked_sandboxes=leftovers + still_open,
        leaked_tasks=max(0, len(anyio.get_running_tasks()) - tasks_before),
        leaked_fds=max(0, _open_fds() - fds_before),
    )


def _statistics(
    config: ChaosConfig,
    groups: list[ScoredGroup],
    aborts: list[str],
    injected: Counter[str],
    *,
    seconds: float,
    leaked_sandboxes: int,
    leaked_tasks: int,
    leaked_fds: int,
) -> ChaosStatistics:
    bound = config.rollout_timeout + config.close_timeout + config.slack_seconds
    attempts: list[ScoredRollout] = [a for g in groups for a in (*g.retried, *g.rollouts)]
    failures: Counter[str] = Counter(a.category or "none" for a in attempts)
    causes: Counter[str] = Counter(
        f"{a.failure.category}/{a.failure.detail.get('source')}/"
        f"{a.failure.detail.get('exception', '-')}"
        for a in attempts
        if a.failure is not None
    )
    mixed = 0
    leaks = 0
    for g in groups:
        if g.masked:
            continue
        if config.policy.on_failure != "zero" and any(
            config.policy.group_failing(r.failure) for r in g.rollouts
        ):
            mixed += 1
        batch = g.to_scored_data_group()
        if len(batch["tokens"]) != config.group_size:
            mixed += 1
        leaks += json.dumps(batch["messages"], ensure_ascii=False).count(CHAOS_SECRET)
    uncategorized = 0
    for a in attempts:
        unknown = a.failure is not None and a.failure.category not in FAILURE_CATEGORIES
        unlabelled = a.failure is None and (a.error is not None or a.reward_error is not None)
        uncategorized += unknown or unlabelled
        text = " ".join(str(x) for x in (a.error, a.reward_error, a.failure) if x is not None)
        leaks += text.count(CHAOS_SECRET)
    return ChaosStatistics(
        rollouts=sum(len(g.rollouts) for g in groups),
        attempts=len(attempts),
        groups=len(groups) + len(aborts),
        group_aborts=len(aborts),
        abort_errors=tuple(a for a in aborts if a),
        mixed_groups=mixed,
        outcomes=dict(Counter(g.outcome for g in groups)),
        failures=dict(failures),
        causes=dict(causes),
        faults=dict(injected),
        uncategorized=uncategorized,
        over_deadline=sum(1 for a in attempts if a.seconds > bound),
        max_attempt_seconds=max((a.seconds for a in attempts), default=0.0),
        secret_leaks=leaks,
        leaked_sandboxes=leaked_sandboxes,
        leaked_tasks=leaked_tasks,
        leaked_fds=leaked_fds,
        seconds=seconds,
    )
