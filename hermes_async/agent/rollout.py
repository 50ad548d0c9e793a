"""Scored rollouts for any trainer: :func:`run_rollout` and :func:`run_group`.

One rollout is ``loop.run -> reward (ToolContext on the same sandbox) -> release -> rows``.
A failing rollout never cancels its siblings; the group's :class:`FailurePolicy` decides
what ``infra`` / ``verifier`` / ``agent_timeout`` failures do. The sandbox is always
released through the manager. See docs/architecture.md, "The flow of one rollout".
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import anyio

from hermes_async._groups import single_errors
from hermes_async._otel import span
from hermes_async._paced import start_paced
from hermes_async._redact import redact
from hermes_async.agent._start_ramp import StartRamp
from hermes_async.agent._watch import WatchedSandboxes
from hermes_async.agent.context import ToolContext
from hermes_async.agent.failures import (
    GROUP_FAILURE_CATEGORIES,
    FailureCategory,
    RolloutFailure,
    classify_exception,
    worst_failure,
)
from hermes_async.agent.loop import HermesAgentLoop, RunAbort
from hermes_async.agent.options import AgentOptions
from hermes_async.agent.result import AgentResult
from hermes_async.agent.scoring import (
    Rows,
    model_answered,
    rollout_rows,
    scored_data_group,
)
from hermes_async.agent.versions import (
    Staleness,
    StalenessReport,
    read_version,
    staleness_of,
    version_spans,
)
from hermes_async.errors import InferenceError
from hermes_async.inference.pool import ServerPool, pool_session
from hermes_async.inference.tokenizer import Tokenizer, load_tokenizer
from hermes_async.inference.trajectory import MASK_ID, MASKED_LOGPROB
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.telemetry import in_flight, record_rollout
from hermes_async.tools.browser import current_browser_manager
from hermes_async.tools.registry import ToolDefinitions, ToolRegistry
from hermes_async.tools.sandbox.manager import (
    SandboxManager,
    current_sandbox_manager,
    open_sandbox_manager,
)
from hermes_async.tools.sandbox.snapshot import SandboxSetup, prepare_group
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "DEFAULT_FAILURE_POLICY",
    "DEFAULT_OPTIONS",
    "DEFAULT_SETUP",
    "FailureAction",
    "FailurePolicy",
    "GroupOutcome",
    "Reward",
    "RolloutSetup",
    "RolloutTask",
    "ScoredGroup",
    "ScoredRollout",
    "TaskSource",
    "TimeoutAction",
    "Tools",
    "run_group",
    "run_rollout",
)

logger = logging.getLogger(__name__)

#: ``async (result, ctx) -> float``: scores a finished rollout; ``ctx`` reaches its sandbox.
Reward: TypeAlias = Callable[[AgentResult, ToolContext], Awaitable[float]]

#: The tools offered: a :class:`~hermes_async.tools.registry.ToolDefinitions` (what
#: ``get_tool_definitions`` returns) or any ``(schemas, valid_names)`` pair.
Tools: TypeAlias = ToolDefinitions | tuple[Sequence[JSONObject], Collection[str]]

#: The options used when none are given (the loop's defaults).
DEFAULT_OPTIONS = AgentOptions()

Encode: TypeAlias = Callable[[str], Sequence[int]]

#: What a group does with ``infra`` / ``verifier`` failures.
FailureAction: TypeAlias = Literal["retry", "mask", "zero"]
#: What a group does with ``agent_timeout`` failures.
TimeoutAction: TypeAlias = Literal["zero", "mask"]
#: How a group ended: ``ok`` (no failure the policy acts on), ``retried`` (some rollouts were
#: re-run, all succeeded), ``zeroed`` (failed rollouts kept with reward 0), ``masked`` (dropped),
#: ``stale`` (dropped: tokens older than ``max_staleness``, see :class:`Staleness`).
GroupOutcome: TypeAlias = Literal["ok", "retried", "zeroed", "masked", "stale"]


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    """What a group does with rollouts whose failure says nothing about the policy.

    Attributes:
        on_failure: ``retry``, ``mask`` or ``zero`` for ``infra`` and ``verifier`` failures.
        on_timeout: ``zero`` (keep, reward 0) or ``mask`` for ``agent_timeout``.
        max_attempts: Attempts per rollout with ``retry``, the first included.
        backoff_seconds: Pause before the first retry; doubled per retry, jittered to 50-100 %.
    """

    on_failure: FailureAction = "retry"
    on_timeout: TimeoutAction = "zero"
    # Two retries: a failure that survives two fresh sandboxes is rarely transient.
    max_attempts: int = 3
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.on_failure not in ("retry", "mask", "zero"):
            raise ValueError(
                f"on_failure must be 'retry', 'mask' or 'zero', got {self.on_failure!r}"
            )
        if self.on_timeout not in ("zero", "mask"):
            raise ValueError(f"on_timeout must be 'zero' or 'mask', got {self.on_timeout!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts!r}")
        if not (self.backoff_seconds >= 0 and self.max_backoff_seconds >= 0):
            raise ValueError(
                "backoff_seconds and max_backoff_seconds must be >= 0, got "
                f"{self.backoff_seconds!r} and {self.max_backoff_seconds!r}"
            )

    def group_failing(self, failure: RolloutFailure | None) -> bool:
        """Whether ``failure`` is one this policy acts on (not an observation of the policy)."""
        if failure is None:
            return False
        if failure.category == "agent_timeout":
            return self.on_timeout == "mask"
        return failure.category in GROUP_FAILURE_CATEGORIES

    def retries(self, failure: RolloutFailure | None, attempt: int) -> bool:
        """Whether a rollout that ended with ``failure`` on attempt ``attempt`` is re-run."""
        return (
            self.on_failure == "retry"
            and failure is not None
            and failure.retryable
            and attempt < self.max_attempts
        )

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """The pause before attempt ``attempt + 1``, in seconds (jittered)."""
        nominal = min(self.max_backoff_seconds, self.backoff_seconds * 2.0 ** (attempt - 1))
        return nominal * rng.uniform(0.5, 1.0)


#: The policy used when none is given.
DEFAULT_FAILURE_POLICY = FailurePolicy()


@dataclass(frozen=True, slots=True)
class RolloutSetup:
    """What rollouts need besides their options; one value serves a whole batch.

    Attributes:
        reward: ``async (result, ctx) -> float`` on the rollout's own sandbox; ``None`` scores
            0.0. One that raises is a ``verifier`` failure.
        tokenizer: Phase 2: the model's tokenizer. Phase 1: tokenizes the placeholder rows.
        sandboxes: The sandbox manager (default: the current one, else a private local one).
        sandbox_setup: ``async (sandbox) -> None`` run before the first turn, within
            ``rollout_timeout``; if it raises, the attempt is an ``infra`` failure.
    """

    reward: Reward | None = None
    tokenizer: Tokenizer | None = None
    registry: ToolRegistry | None = None
    sandboxes: SandboxManager | None = None
    limits: Limits | None = None
    failure_policy: FailurePolicy = DEFAULT_FAILURE_POLICY
    sandbox_spec: SandboxSpec | None = None
    sandbox_setup: SandboxSetup | None = None
    placeholder_encode: Encode | None = None

    def __post_init__(self) -> None:
        # Refused here, not in each rollout: every rollout of a batch would fail the same way.
        if self.reward is not None and not callable(self.reward):
            raise TypeError(
                "reward must be an async function (result, ctx) -> float, or None, got "
                f"{type(self.reward).__name__}"
            )
        if not isinstance(self.failure_policy, FailurePolicy):
            raise TypeError(
                f"failure_policy must be a FailurePolicy, got {type(self.failure_policy).__name__}"
            )
        if self.sandbox_setup is not None and not callable(self.sandbox_setup):
            raise TypeError(
                "sandbox_setup must be an async function (sandbox) -> None, got "
                f"{type(self.sandbox_setup).__name__}"
            )


#: The setup used when none is given.
DEFAULT_SETUP = RolloutSetup()


@dataclass(frozen=True, slots=True)
class RolloutTask:
    """One item made ready to run: its prompt, tools, setup and options.

    Made by ``HermesAgentBaseEnv.rollout_task(item)``; a trainer adapter runs it with
    :func:`run_group` and needs to know nothing else about the environment.
    """

    messages: Sequence[Mapping[str, Any]]
    tools: Tools
    setup: RolloutSetup = DEFAULT_SETUP
    options: AgentOptions = DEFAULT_OPTIONS


#: ``item -> RolloutTask`` (sync or async): how one item of a dataset becomes a task, for
#: users without an environment class (trainer adapters and rollout workers take one; a
#: ``HermesAgentBaseEnv`` serves as one through its ``rollout_task``).
TaskSource: TypeAlias = Callable[[Any], "RolloutTask | Awaitable[RolloutTask]"]


@dataclass(frozen=True, slots=True)
class ScoredRollout:
    """One finished rollout, rewarded and turned into training rows.

    Attributes:
        task_id: The rollout's task id (its sandbox's key; a retry has its own).
        masks: The id where the policy sampled it, ``-100`` elsewhere.
        logprobs: The sampled logprob, ``1.0`` at masked positions.
        trainable: True for exact Phase 2 tokens; False for Phase 1 placeholders.
        error: Why the rollout ended early, else why the reward failed (redacted).
        failure: The most severe :class:`~hermes_async.agent.failures.RolloutFailure`, or ``None``.
        stale_masked_tokens: Sampled positions masked because their policy version was too old.
    """

    task_id: str
    result: AgentResult
    reward: float
    tokens: list[int]
    masks: list[int]
    logprobs: list[float]
    trainable: bool
    seconds: float
    error: str | None
    reward_error: str | None
    failure: RolloutFailure | None = None
    attempt: int = 1
    stale_masked_tokens: int = 0

    @property
    def version_spans(self) -> list[tuple[int, int, int | None]]:
        """The completion segments as ``(start, end, version)`` offsets into :attr:`tokens`."""
        return version_spans(self.result.managed_state)

    @property
    def policy_versions(self) -> list[int]:
        """The distinct policy versions that sampled this rollout, in order."""
        return list(dict.fromkeys(v for _, _, v in self.version_spans if v is not None))

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.result.messages

    @property
    def category(self) -> FailureCategory | None:
        return self.failure.category if self.failure is not None else None


@dataclass(frozen=True, slots=True)
class ScoredGroup:
    """The rollouts of one :func:`run_group`, in order, and how the group ended.

    Attributes:
        rollouts: One :class:`ScoredRollout` per rollout (the last attempt of each).
        outcome: ``ok``, ``retried``, ``zeroed``, ``masked`` or ``stale``.
        retried: The attempts replaced by a retry.
        staleness: The ages of the group's tokens, when ``run_group`` checked them.
    """

    rollouts: tuple[ScoredRollout, ...]
    outcome: GroupOutcome = "ok"
    retried: tuple[ScoredRollout, ...] = ()
    staleness: StalenessReport | None = None

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]

    @property
    def trainable(self) -> bool:
        """True if every rollout carries exact (Phase 2) tokens."""
        return all(r.trainable for r in self.rollouts)

    @property
    def masked(self) -> bool:
        """True if the group was dropped (failures, or stale tokens): it has no training data."""
        return self.outcome in ("masked", "stale")

    def failure_counts(self) -> Counter[FailureCategory]:
        """Failures per category over every attempt (replaced ones included)."""
        return Counter(
            r.failure.category for r in (*self.retried, *self.rollouts) if r.failure is not None
        )

    def __len__(self) -> int:
        return len(self.rollouts)

    def to_scored_data_group(
        self, generation_params: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The Atropos-shaped ``ScoredDataGroup`` dict (no atroposlib import).

        See :func:`~hermes_async.agent.scoring.scored_data_group` for the fields.

        Raises:
            ValueError: The group is masked or stale (check :attr:`masked` first).
        """
        if self.masked:
            raise ValueError(
                f"a {self.outcome} group has no training data: check ScoredGroup.masked before "
                f"to_scored_data_group() (failures: {dict(self.failure_counts())})"
            )
        extra: dict[str, Any] = {}
        if self.staleness is not None:
            extra = {
                "policy_version_current": self.staleness.current_version,
                "max_staleness": self.staleness.max_staleness,
            }
        return scored_data_group(
            self.rollouts, generation_params=generation_params, group_overrides=extra
        )


# ------------------------------------------------------------------------------------------
# plumbing


_BUILTIN_TOKENIZER: Tokenizer | None = None

#: The one thread that may load the built-in tokenizer (a named limiter, per the invariant that
#: ``anyio.to_thread`` is only used for an unavoidable blocking call behind one); it also makes
#: concurrent first callers wait for one load instead of loading it twice.
TOKENIZER_LOAD_LIMITER = anyio.CapacityLimiter(1)


async def _builtin_encoder() -> Encode:
    """The built-in offline tokenizer's ``encode``, loaded once per process (off the loop)."""
    global _BUILTIN_TOKENIZER
    if _BUILTIN_TOKENIZER is None:
        async with TOKENIZER_LOAD_LIMITER:
            if _BUILTIN_TOKENIZER is None:
                # A one-time blocking load (~0.2 s: the BPE ranks) off the loop.
                _BUILTIN_TOKENIZER = await anyio.to_thread.run_sync(load_tokenizer)
    return _BUILTIN_TOKENIZER.encode


async def _placeholder_encoder(tokenizer: Tokenizer | None, given: Encode | None) -> Encode:
    if given is not None:
        return given
    if tokenizer is not None:
        return tokenizer.encode
    return await _builtin_encoder()  # Phase 1 with nothing to tokenize placeholders with


@asynccontextmanager
async def _sandbox_manager(
    given: SandboxManager | None, limits: Limits | None
) -> AsyncIterator[SandboxManager]:
    """The given manager, else the current one, else a private local one for the block."""
    manager = given if given is not None else current_sandbox_manager()
    if manager is not None:
        yield manager
        return
    async with open_sandbox_manager(limits=limits) as private:
        yield private


@asynccontextmanager
async def _model_client(server: Any) -> AsyncIterator[Any]:
    """``server`` itself, or for a :class:`ServerPool` a client of its ``api`` for the block."""
    if not isinstance(server, ServerPool):
        yield server
        return
    async with server.client() as client:
        yield client


def _split_tools(tools: Tools) -> tuple[Sequence[JSONObject], Collection[str]]:
    try:
        schemas, names = tools
    except (TypeError, ValueError):
        raise TypeError(
            "tools must be a ToolDefinitions (get_tool_definitions(...)) or a "
            f"(schemas, valid_names) pair, got {type(tools).__name__}"
        ) from None
    return schemas, names


def _check_call(messages: object, options: object, setup: object) -> None:
    """Refuse the mistakes every rollout of a batch would make, before any starts."""
    if not isinstance(options, AgentOptions):
        raise TypeError(f"options must be an AgentOptions, got {type(options).__name__}")
    if not isinstance(setup, RolloutSetup):
        raise TypeError(f"setup must be a RolloutSetup, got {type(setup).__name__}")
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise TypeError(
            "messages must be a list of chat messages ({'role': ..., 'content': ...}), got "
            f"{type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages is empty: a rollout needs its prompt (at least one message)")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{i}] must be a mapping, got {type(message).__name__}")
        if not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{i}] has no 'role' string (system, user, assistant, tool)")


def _seed(options: AgentOptions, index: int) -> int | None:
    """Rollout ``index``'s sampling seed: the configured seed + index (distinct samples)."""
    sampling = options.sampling
    if sampling is None or sampling.seed is None:
        return None
    return sampling.seed + index


def _rewardable(result: AgentResult) -> bool:
    """Whether the reward runs: the model answered, and the rollout was not lost or timed out."""
    if not model_answered(result):
        return False  # nothing to verify if the model never answered (reference)
    failure = result.failure
    return failure is None or failure.category not in ("infra", "agent_timeout")


async def _score(
    reward: Reward | None, result: AgentResult, ctx: ToolContext, deadline: float
) -> tuple[float, RolloutFailure | None]:
    """``(reward, failure)``: a reward that raises, overruns or gives no number: ``verifier``."""
    if reward is None:
        return 0.0, None
    with (
        anyio.move_on_at(deadline) as scope,
        span("reward", {"hermes_async.task_id": ctx.task_id}) as traced,
        in_flight("reward"),
    ):
        try:
            pending: object = reward(result, ctx)  # typed Awaitable; a sync one slips through
            if not inspect.isawaitable(pending):
                return 0.0, RolloutFailure.of(
                    "verifier",
                    f"reward failed: it returned {type(pending).__name__}, not an awaitable; a "
                    "reward is an async function (async def reward(result, ctx) -> float), so "
                    "its checks never block the event loop",
                    source="reward",
                )
            value: object = await pending
        except Exception as exc:  # contained: a failing reward is the rollout's failure
            return 0.0, classify_exception(exc, source="reward")
        traced.set("hermes_async.reward", repr(value)[:100])
    if scope.cancelled_caught:
        return 0.0, RolloutFailure.of(
            "verifier",
            "reward failed: it did not finish before the rollout deadline",
            source="reward",
            exception="TimeoutError",
        )
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        return 0.0, RolloutFailure.of(
            "verifier",
            f"reward failed: it returned {value!r:.200}, not a finite number",
            source="reward",
        )
    return number, None


def _tool_failure(result: AgentResult) -> RolloutFailure | None:
    """A ``model`` (malformed calls) or ``tool`` observation from the rollout's tool errors."""
    errors = result.tool_errors
    if not errors:
        return None
    malformed = [e for e in errors if e.category == "model"]
    chosen = malformed or errors
    first = chosen[0]
    category: FailureCategory = "model" if malformed else "tool"
    what = "malformed tool call" if malformed else "failed tool call"
    return RolloutFailure.of(
        category,
        f"{len(chosen)} {what}{'s' if len(chosen) != 1 else ''}; first: "
        f"[turn {first.turn}] {first.tool_name}: {first.error}",
        source="tools",
        count=len(chosen),
    )


class _SetupFailed(Exception):
    """The sandbox setup raised (its exception is the ``__cause__``)."""


async def _set_up(
    setup: SandboxSetup, sandboxes: SandboxManager, task_id: str, deadline: float
) -> None:
    """Run ``setup`` on the rollout's sandbox, within the rollout's deadline."""
    try:
        with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
            await setup(await sandboxes.get(task_id))
    except Exception as exc:
        raise _SetupFailed() from exc


async def _release(manager: SandboxManager, task_id: str, *, interrupted: bool) -> None:
    # The managers' releases shield themselves and are bounded by their own close timeouts;
    # they never raise for a backend failure. No second bound here.
    await manager.release(task_id, interrupted=interrupted)
    browsers = current_browser_manager()
    if browsers is not None:  # the rollout's browser session goes with its sandbox
        await browsers.release(task_id)


@dataclass(slots=True)
class _Batch:
    """What the rollouts of one call share: loop, manager, setup and placeholder encoder."""

    loop: HermesAgentLoop
    manager: SandboxManager
    setup: RolloutSetup
    encode: Encode
    rng: random.Random = field(default_factory=random.Random)

    async def attempt(
        self, messages: Sequence[Mapping[str, Any]], task_id: str, index: int, number: int
    ) -> ScoredRollout:
        """One attempt of rollout ``index``; raises only cancellation."""
        start = anyio.current_time()
        timeout = self.loop.options.rollout_timeout
        deadline = start + timeout if timeout is not None else math.inf
        abort = RunAbort()
        conversation = [dict(m) for m in messages]
        spec = self.setup.sandbox_spec
        if spec is not None:  # this attempt's sandbox is created from the item's spec
            self.manager.assign_spec(task_id, spec)
        # The agent's own invoke_agent span is the loop's (a child of this one).
        with span("rollout", {"hermes_async.task_id": task_id}) as traced, in_flight("rollout"):
            return await self._attempt(
                messages, task_id, index, number, start, deadline, abort, conversation, traced
            )

    async def _attempt(
        self,
        messages: Sequence[Mapping[str, Any]],
        task_id: str,
        index: int,
        number: int,
        start: float,
        deadline: float,
        abort: RunAbort,
        conversation: list[dict[str, Any]],
        traced: Any,
    ) -> ScoredRollout:
        result: AgentResult | None = None
        value, reward_failure, harness = 0.0, None, None
        interrupted = False
        try:
            # The task group hosts the sandbox's creation (see WatchedSandboxes), so a tool
            # timeout never cuts it; it is cancelled once the rollout is done.
            setup = self.setup
            if setup.sandbox_setup is not None:
                await _set_up(setup.sandbox_setup, self.manager, task_id, deadline)
            async with anyio.create_task_group() as tg:
                watched = WatchedSandboxes(self.manager, abort.abort, tg)
                result = await self.loop.run(
                    conversation,
                    task_id=task_id,
                    seed=_seed(self.loop.options, index),
                    deadline=deadline,
                    sandboxes=watched,
                    abort=abort,
                )
                if _rewardable(result):
                    ctx = ToolContext(task_id, manager=self.manager, registry=setup.registry)
                    value, reward_failure = await _score(setup.reward, result, ctx, deadline)
                tg.cancel_scope.cancel(reason="the rollout is done")
        except anyio.get_cancelled_exc_class():
            interrupted = True
            record_rollout("cancelled", 0, 0)
            raise
        except _SetupFailed as failed:  # the sandbox never reached the rollout's start state
            assert failed.__cause__ is not None
            harness = classify_exception(failed.__cause__, source="the sandbox setup")
            logger.warning("task %s: %s", task_id, harness.message)
            interrupted = True
        except Exception as exc:  # a harness bug (or a parser that raised): contained
            harness = classify_exception(exc, source="the rollout")
            logger.warning("task %s: %s", task_id, harness.message, exc_info=True)
            interrupted = True
        finally:
            await _release(self.manager, task_id, interrupted=interrupted)
        if result is None:
            result = AgentResult(messages=conversation)
        if harness is not None and result.failure is None:
            result.failure, result.error = harness, harness.message
        if reward_failure is not None:
            logger.warning("task %s: %s; reward 0.0", task_id, reward_failure.message)
        try:
            rows = rollout_rows(result, self.encode)
        except Exception as exc:  # e.g. a tokenizer that cannot encode the placeholder text
            harness = classify_exception(exc, source="building the rows")
            logger.warning("task %s: %s", task_id, harness.message, exc_info=True)
            rows = Rows([], [], [], trainable=False)
        failure = worst_failure([result.failure, reward_failure, harness, _tool_failure(result)])
        outcome = failure.category if failure is not None else "ok"
        traced.set("hermes_async.outcome", outcome)
        traced.set("hermes_async.turns", result.turns_used)
        traced.set("hermes_async.reward", value)
        if failure is not None:
            traced.error(failure.message)
        sampled = sum(1 for m in rows.masks if m != MASK_ID)
        record_rollout(outcome, len(rows.tokens) - sampled, sampled)
        reward_error = reward_failure.message if reward_failure is not None else None
        if result.error:
            error: str | None = redact(result.error)
        elif reward_error is not None:
            error = reward_error
        else:
            error = harness.message if harness is not None else None
        return ScoredRollout(
            task_id=task_id,
            result=result,
            reward=value,
            tokens=rows.tokens,
            masks=rows.masks,
            logprobs=rows.logprobs,
            trainable=rows.trainable,
            seconds=anyio.current_time() - start,
            error=error,
            reward_error=reward_error,
            failure=failure,
            attempt=number,
        )

    async def rollout(
        self,
        messages: Sequence[Mapping[str, Any]],
        task_id: str,
        index: int,
        *,
        give_up: Callable[[], bool] = lambda: False,
        replaced: list[ScoredRollout] | None = None,
    ) -> ScoredRollout:
        """Rollout ``index`` with the policy's retries, each on a fresh task id and sandbox."""
        number = 1
        attempt_id = task_id
        while True:
            scored = await self.attempt(messages, attempt_id, index, number)
            policy = self.setup.failure_policy
            if not policy.retries(scored.failure, number) or give_up():
                return scored
            assert scored.failure is not None
            pause = policy.backoff(number, self.rng)
            logger.info(
                "task %s: attempt %d failed (%s); retrying on a fresh sandbox in %.1f s",
                attempt_id,
                number,
                scored.failure,
                pause,
            )
            if replaced is not None:
                replaced.append(scored)
            await anyio.sleep(pause)
            number += 1
            attempt_id = f"{task_id}-attempt{number}"


@asynccontextmanager
async def _open_batch(
    server: Any, tools: Tools, setup: RolloutSetup, options: AgentOptions
) -> AsyncIterator[_Batch]:
    """The batch's sandboxes and loop; a lone exception of the block comes out unwrapped."""
    schemas, names = _split_tools(tools)
    with single_errors():
        async with (
            _sandbox_manager(setup.sandboxes, setup.limits) as manager,
            _model_client(server) as model,
        ):
            loop = HermesAgentLoop(
                model,
                schemas,
                names,
                options=options,
                tokenizer=setup.tokenizer,
                limits=setup.limits if setup.limits is not None else manager.limits,
                sandboxes=manager,
                registry=setup.registry,
            )
            encode = await _placeholder_encoder(setup.tokenizer, setup.placeholder_encode)
            yield _Batch(loop, manager, setup, encode)


def _outcome(
    rollouts: Sequence[ScoredRollout], replaced: Sequence[ScoredRollout], policy: FailurePolicy
) -> GroupOutcome:
    """How a group ends under ``policy``: failed and trained rollouts mix only under ``zero``."""
    failing = [r.failure for r in rollouts if policy.group_failing(r.failure)]
    if not failing:
        return "retried" if replaced else "ok"
    for failure in failing:
        assert failure is not None
        if failure.category == "agent_timeout" or policy.on_failure != "zero":
            return "masked"  # "retry" whose retries ran out ends here too
    return "zeroed"


def _dead_server(attempts: Sequence[ScoredRollout]) -> bool:
    """Every attempt lost to the model server before the model answered at all.

    A stream that broke after some tokens does not count: that server is up and flaky.
    """
    return all(
        r.failure is not None
        and r.failure.category == "infra"
        and r.failure.detail.get("source") == "model_server"
        and not r.failure.detail.get("completion_tokens")
        and not _has_assistant(r.result)
        for r in attempts
    )


def _has_assistant(result: AgentResult) -> bool:
    return any(m.get("role") == "assistant" for m in result.messages)


# ------------------------------------------------------------------------------------------
# API


async def run_rollout(
    server: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Tools,
    *,
    setup: RolloutSetup = DEFAULT_SETUP,
    options: AgentOptions = DEFAULT_OPTIONS,
    task_id: str | None = None,
) -> ScoredRollout:
    """Run one rollout, reward it on its own sandbox, release the sandbox, build its rows.

    Args:
        server: A chat server (Phase 1), a token client (Phase 2, needs ``tokenizer``), or a
            :class:`~hermes_async.inference.pool.ServerPool`.
        tools: ``get_tool_definitions(...)`` or a ``(schemas, valid_names)`` pair.
        task_id: The rollout's id (default: a uuid4). A retry runs as ``<task_id>-attempt<n>``.

    Returns:
        The :class:`ScoredRollout` of the last attempt; its failures are not raised.

    Raises:
        ValueError: Bad options, an empty prompt, a message without a role, or a token server
            without a tokenizer.
        TypeError: A wrong type for ``server``, ``tools``, ``options``, ``setup`` or ``messages``.
        UnknownParserError: ``options.tool_call_parser`` is not registered.

    **Cancellation**: the request and tools are cancelled, the sandbox is released (shielded,
    bounded), a private manager is closed, and the cancellation propagates.
    """
    _check_call(messages, options, setup)
    async with StartRamp(), _open_batch(server, tools, setup, options) as batch:
        return await batch.rollout(messages, task_id or str(uuid.uuid4()), 0)


async def run_group(
    server: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Tools,
    *,
    size: int,
    setup: RolloutSetup = DEFAULT_SETUP,
    options: AgentOptions = DEFAULT_OPTIONS,
    task_ids: Sequence[str] | None = None,
    on_rollout: Callable[[ScoredRollout], object] | None = None,
    staleness: Staleness | None = None,
    snapshot: bool = True,
) -> ScoredGroup:
    """Run ``size`` rollouts of one prompt concurrently; reward and score each.

    Each rollout gets its own copy of ``messages``, its own sandbox and, with a seed s, the seed
    s + index. The other arguments, and their errors, are :func:`run_rollout`'s.

    Args:
        on_rollout: Called with each final :class:`ScoredRollout`; what it raises cancels the
            group and propagates, unwrapped.
        staleness: After the group, ``drop`` it or ``mask`` the segments whose policy is too
            old, or ``keep`` them; needs a version source.
        snapshot: Run ``setup.sandbox_setup`` once and start every rollout from a snapshot of
            it where the backend can.

    Returns:
        The :class:`ScoredGroup`; a masked group is returned, never half emitted.

    Raises:
        ValueError: Bad ``size`` or ``task_ids``, or ``staleness`` without a version source.
        VersionReadError: The version source failed when the ages were measured.
        InferenceError: Every rollout failed at the model server before it answered: the
            server is down, and ``process`` mode would otherwise spin through the dataset.

    **Cancellation**: reaches every rollout; every sandbox is released (shielded, bounded), a
    private manager is closed, and retries not yet started never start.
    """
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"run_group size must be an int >= 1, got {size!r}")
    if size < 1:
        raise ValueError(f"run_group size must be >= 1, got {size!r}")
    _check_call(messages, options, setup)
    failure_policy, sandbox_setup = setup.failure_policy, setup.sandbox_setup
    current_version = None
    if staleness is not None:
        current_version = staleness.version_source or options.version_source
        if current_version is None:
            raise ValueError(
                "run_group(staleness=...) needs a policy version source: pass "
                "Staleness(version_source=...) or AgentOptions(version_source=...)"
            )
    ids = list(task_ids) if task_ids is not None else [str(uuid.uuid4()) for _ in range(size)]
    if len(ids) != size:
        raise ValueError(f"run_group got {len(ids)} task_ids for size={size}; pass one per rollout")
    if len(set(ids)) != size:  # a task id names a rollout's sandbox: two would share one
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"run_group task_ids must be distinct; repeated: {repeated}")
    rollouts: list[ScoredRollout | None] = [None] * size
    replaced: list[ScoredRollout] = []
    lost = False  # a rollout's retries ran out: the group is masked, stop retrying the others

    def give_up() -> bool:
        return lost

    async with StartRamp(), _open_batch(server, tools, setup, options) as batch:
        group_snapshot = None
        if sandbox_setup is not None and snapshot:
            group_snapshot = await prepare_group(
                batch.manager, setup.sandbox_spec, sandbox_setup, task_id=ids[0]
            )
            if group_snapshot is not None:  # the rollouts start from the prepared state
                batch.setup = dataclasses.replace(
                    setup, sandbox_spec=group_snapshot.spec, sandbox_setup=None
                )

        async def one(index: int) -> None:
            nonlocal lost
            scored = await batch.rollout(
                messages, ids[index], index, give_up=give_up, replaced=replaced
            )
            if failure_policy.group_failing(scored.failure) and failure_policy.on_failure != "zero":
                lost = True
            rollouts[index] = scored
            if on_rollout is not None:
                on_rollout(scored)

        # The group's rollouts share a prompt: on a ServerPool they are placed by one key
        # (one server's prefix cache while it has room), each pinned on its own session.
        try:
            with pool_session(f"group:{ids[0]}"):
                async with anyio.create_task_group() as tg:
                    await start_paced(tg, one, range(size), name=lambda i: f"rollout {ids[i]}")
        finally:
            if sandbox_setup is not None and snapshot:
                # The first rollout's sandbox was made before its rollout ran: a no-op once the
                # rollout released it, its release if the group ended before it started.
                await batch.manager.release(ids[0], interrupted=True)
            if group_snapshot is not None:
                await group_snapshot.aclose()  # shielded, bounded
    done = tuple(r for r in rollouts if r is not None)
    if _dead_server((*replaced, *done)):
        raise InferenceError(
            f"every rollout of the group failed before the model answered: {done[0].error}"
        )
    outcome = _outcome(done, replaced, failure_policy)
    if outcome == "masked":
        logger.warning(
            "group of %d masked (failure policy %r): %s",
            size,
            failure_policy.on_failure,
            dict(Counter(r.category for r in done if r.failure is not None)),
        )
    report = None
    if staleness is not None and current_version is not None:
        now = await read_version(current_version)
        report, to_mask = staleness_of([r.version_spans for r in done], now, staleness)
        if report.dropped and outcome != "masked":
            outcome = "stale"
            logger.info(
                "group of %d dropped: %d segments older than max_staleness=%d (version %d)",
                size,
                report.stale_segments,
                staleness.max_staleness,
                now,
            )
        done = tuple(_mask_ranges(r, ranges) for r, ranges in zip(done, to_mask, strict=True))
    return ScoredGroup(done, outcome, tuple(replaced), report)


def _mask_ranges(rollout: ScoredRollout, ranges: Sequence[tuple[int, int]]) -> ScoredRollout:
    """``rollout`` with ``ranges`` of its rows not trained (mask -100, logprob 1.0)."""
    if not ranges:
        return rollout
    masks, logprobs = list(rollout.masks), list(rollout.logprobs)
    count = 0
    for start, end in ranges:
        for i in range(start, end):
            if masks[i] != MASK_ID:
                count += 1
            masks[i], logprobs[i] = MASK_ID, MASKED_LOGPROB
    return dataclasses.replace(
        rollout,
        masks=masks,
        logprobs=logprobs,
        stale_masked_tokens=rollout.stale_masked_tokens + count,
    )
