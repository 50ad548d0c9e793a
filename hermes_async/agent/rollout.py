"""Scored rollouts for any trainer: :func:`run_rollout` and :func:`run_group`.

The rollout pipeline, with no atroposlib in it::

    loop.run(messages) -> reward(result, ToolContext on the same sandbox) -> release -> rows

* **Loop**: :class:`~hermes_async.agent.loop.HermesAgentLoop` (Phase 1 with a chat server,
  Phase 2 with a token server and a tokenizer), bounded by ``options.rollout_timeout``.
* **Reward**: an ``async (result, ctx) -> float`` (:data:`Reward`) with a
  :class:`~hermes_async.agent.context.ToolContext` on the rollout's own sandbox, called only if
  the model answered at all. A reward that raises scores 0.0 and sets ``reward_error`` (the
  reference's rule).
* **Release**: the rollout's sandbox is released through the manager whatever happened (reward
  raised, group cancelled). The manager's ``release`` is the one bound (``close_timeout``) and
  shields itself; nothing here adds a second one.
* **Rows**: :mod:`~hermes_async.agent.scoring` turns the result into aligned ``tokens`` /
  ``masks`` / ``logprobs`` (exact in Phase 2, placeholders in Phase 1).

Sandboxes come from the ``sandboxes`` manager given, else the current one
(``use_sandbox_manager``), else a private local :class:`SandboxManager` opened for the call's
lifetime, so a trainer needs no setup::

    group = await run_group(client, [{"role": "user", "content": task}], tools,
                            size=8, reward=check, tokenizer=tokenizer)
    batch = group.to_scored_data_group()
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias

import anyio

from hermes_async._groups import single_errors
from hermes_async._redact import redact
from hermes_async.agent.context import ToolContext
from hermes_async.agent.loop import AgentOptions, HermesAgentLoop
from hermes_async.agent.result import AgentResult
from hermes_async.agent.scoring import model_answered, rollout_rows, scored_data_group
from hermes_async.errors import InferenceError
from hermes_async.inference.tokenizer import Tokenizer, load_tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.tools.browser import current_browser_manager
from hermes_async.tools.registry import ToolDefinitions, ToolRegistry
from hermes_async.tools.sandbox.manager import (
    SandboxManager,
    current_sandbox_manager,
    open_sandbox_manager,
)

__all__ = (
    "DEFAULT_OPTIONS",
    "Reward",
    "ScoredGroup",
    "ScoredRollout",
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


@dataclass(frozen=True, slots=True)
class ScoredRollout:
    """One finished rollout, rewarded and turned into training rows.

    Attributes:
        task_id: The rollout's task id (its sandbox's key).
        result: The loop's :class:`~hermes_async.agent.result.AgentResult` (messages, turns,
            tool errors, timings, ``managed_state``).
        reward: The score (0.0 when the model never answered or the reward raised).
        tokens: Token ids, aligned one to one with ``masks`` and ``logprobs``.
        masks: The id where the policy sampled it, ``-100`` elsewhere.
        logprobs: The sampled logprob, ``1.0`` at masked positions.
        trainable: True for exact Phase 2 tokens; False for Phase 1 placeholders.
        seconds: Wall time of the rollout: loop, reward and release.
        error: Why the loop stopped early, else why the reward failed (redacted), else ``None``.
        reward_error: Why the reward failed (redacted), if it did.
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

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The rollout's full conversation (``result.messages``)."""
        return self.result.messages


@dataclass(frozen=True, slots=True)
class ScoredGroup:
    """The rollouts of one :func:`run_group`, in rollout order.

    Attributes:
        rollouts: One :class:`ScoredRollout` per rollout.
    """

    rollouts: tuple[ScoredRollout, ...]

    @property
    def rewards(self) -> list[float]:
        """The rollouts' rewards, in order."""
        return [r.reward for r in self.rollouts]

    @property
    def trainable(self) -> bool:
        """True if every rollout carries exact (Phase 2) tokens."""
        return all(r.trainable for r in self.rollouts)

    def __len__(self) -> int:
        return len(self.rollouts)

    def to_scored_data_group(
        self, generation_params: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The Atropos-shaped ``ScoredDataGroup`` dict (no atroposlib import).

        ``tokens``, ``masks``, ``scores``, ``inference_logprobs`` and ``messages`` per
        rollout, aligned; see :func:`~hermes_async.agent.scoring.scored_data_group`.
        """
        return scored_data_group(self.rollouts, generation_params=generation_params)


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


async def _placeholder_encoder(
    loop: HermesAgentLoop, tokenizer: Tokenizer | None, given: Encode | None
) -> Encode:
    if given is not None:
        return given
    if tokenizer is not None:
        return tokenizer.encode
    if loop.tokenizer is None:  # Phase 1 with nothing to tokenize placeholders with
        return await _builtin_encoder()
    return loop.tokenizer.encode


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


def _split_tools(tools: Tools) -> tuple[Sequence[JSONObject], Collection[str]]:
    try:
        schemas, names = tools
    except (TypeError, ValueError):
        raise TypeError(
            "tools must be a ToolDefinitions (get_tool_definitions(...)) or a "
            f"(schemas, valid_names) pair, got {type(tools).__name__}"
        ) from None
    return schemas, names


def _seed(options: AgentOptions, index: int) -> int | None:
    """Rollout ``index``'s sampling seed: the configured seed + index (distinct samples)."""
    sampling = options.sampling
    if sampling is None or sampling.seed is None:
        return None
    return sampling.seed + index


async def _score(
    reward: Reward | None, result: AgentResult, ctx: ToolContext
) -> tuple[float, str | None]:
    """``(reward, reward_error)``; a raising reward scores 0.0 (the reference's rule)."""
    if reward is None or not model_answered(result):
        return 0.0, None  # nothing to verify if the model never answered (reference)
    try:
        return float(await reward(result, ctx)), None
    except Exception as exc:  # the reference's rule: a failing reward scores 0.0
        message = redact(f"{type(exc).__name__}: {exc}")
        logger.warning("task %s: reward failed (%s); reward 0.0", ctx.task_id, message)
        return 0.0, f"reward failed: {message}"


async def _release(manager: SandboxManager, task_id: str, *, interrupted: bool) -> None:
    # The managers' releases shield themselves and are bounded by their own close timeouts;
    # they never raise for a backend failure. No second bound here.
    await manager.release(task_id, interrupted=interrupted)
    browsers = current_browser_manager()
    if browsers is not None:  # the rollout's browser session goes with its sandbox
        await browsers.release(task_id)


@dataclass(frozen=True, slots=True)
class _Batch:
    """What the rollouts of one call share: the loop, the manager, the reward, the encoder."""

    loop: HermesAgentLoop
    manager: SandboxManager
    options: AgentOptions
    reward: Reward | None
    registry: ToolRegistry | None
    encode: Encode

    async def rollout(
        self, messages: Sequence[Mapping[str, Any]], task_id: str, index: int
    ) -> ScoredRollout:
        """Rollout ``index`` of the batch: loop, reward, release, rows."""
        start = anyio.current_time()
        interrupted = False
        try:
            result = await self.loop.run(
                [dict(m) for m in messages], task_id=task_id, seed=_seed(self.options, index)
            )
            ctx = ToolContext(task_id, manager=self.manager, registry=self.registry)
            value, reward_error = await _score(self.reward, result, ctx)
        except anyio.get_cancelled_exc_class():
            interrupted = True
            raise
        finally:
            await _release(self.manager, task_id, interrupted=interrupted)
        rows = rollout_rows(result, self.encode)
        return ScoredRollout(
            task_id=task_id,
            result=result,
            reward=value,
            tokens=rows.tokens,
            masks=rows.masks,
            logprobs=rows.logprobs,
            trainable=rows.trainable,
            seconds=anyio.current_time() - start,
            error=redact(result.error) if result.error else reward_error,
            reward_error=reward_error,
        )


@asynccontextmanager
async def _open_batch(
    server: Any,
    tools: Tools,
    *,
    reward: Reward | None,
    tokenizer: Tokenizer | None,
    options: AgentOptions,
    sandboxes: SandboxManager | None,
    limits: Limits | None,
    registry: ToolRegistry | None,
    placeholder_encode: Encode | None,
) -> AsyncIterator[_Batch]:
    """The batch's sandboxes and loop; a lone exception of the block comes out unwrapped."""
    schemas, names = _split_tools(tools)
    with single_errors():
        async with _sandbox_manager(sandboxes, limits) as manager:
            loop = HermesAgentLoop.from_options(
                server,
                schemas,
                names,
                options,
                tokenizer=tokenizer,
                limits=limits if limits is not None else manager.limits,
                sandboxes=manager,
                registry=registry,
            )
            encode = await _placeholder_encoder(loop, tokenizer, placeholder_encode)
            yield _Batch(loop, manager, options, reward, registry, encode)


# ------------------------------------------------------------------------------------------
# API


async def run_rollout(
    server: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Tools,
    *,
    reward: Reward | None = None,
    task_id: str | None = None,
    tokenizer: Tokenizer | None = None,
    options: AgentOptions = DEFAULT_OPTIONS,
    sandboxes: SandboxManager | None = None,
    limits: Limits | None = None,
    registry: ToolRegistry | None = None,
    placeholder_encode: Encode | None = None,
) -> ScoredRollout:
    """Run one rollout, reward it on its own sandbox, release the sandbox, build its rows.

    Args:
        server: A chat server (Phase 1) or a token client (Phase 2, needs ``tokenizer``).
        messages: The prompt; copied, so the caller's list is never changed.
        tools: ``get_tool_definitions(...)`` or a ``(schemas, valid_names)`` pair.
        reward: ``async (result, ctx) -> float``; ``None`` scores 0.0.
        task_id: The rollout's id (its sandbox's key); a fresh uuid4 if ``None``.
        tokenizer: Phase 2: the model's tokenizer. Phase 1: tokenizes the placeholder rows.
        options: The loop's options (turns, sampling, deadlines, parser, budget).
        sandboxes: The sandbox manager (default: the current one, else a private local one
            opened for this call).
        limits: Shared limiters (default: the manager's).
        registry: Tool implementations (default: the built-in tools).
        placeholder_encode: Phase 1: ``text -> ids`` for the placeholder rows (default: the
            tokenizer's, else the built-in offline tokenizer's).

    Returns:
        The :class:`ScoredRollout`. A model-server failure or the rollout deadline is not
        raised: it ends the rollout early with ``error`` set (reward only if the model
        answered at all).

    Raises:
        ValueError: Bad options, or a token server without a tokenizer.
        TypeError: ``server`` is neither kind of server, or ``tools`` is not a pair.
        Exception: Whatever the rollout raised (a reward's exception is not raised: it scores
            0.0), as itself even when a private manager's task group wrapped it.

    **Cancellation**: the model request and running tools are cancelled, the sandbox is
    released (shielded and bounded by the manager), and the cancellation propagates. A private
    manager is closed on the way out, releasing everything it holds.
    """
    async with _open_batch(
        server,
        tools,
        reward=reward,
        tokenizer=tokenizer,
        options=options,
        sandboxes=sandboxes,
        limits=limits,
        registry=registry,
        placeholder_encode=placeholder_encode,
    ) as batch:
        return await batch.rollout(messages, task_id or str(uuid.uuid4()), 0)


async def run_group(
    server: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Tools,
    *,
    size: int,
    reward: Reward | None = None,
    task_ids: Sequence[str] | None = None,
    tokenizer: Tokenizer | None = None,
    options: AgentOptions = DEFAULT_OPTIONS,
    sandboxes: SandboxManager | None = None,
    limits: Limits | None = None,
    registry: ToolRegistry | None = None,
    placeholder_encode: Encode | None = None,
    on_rollout: Callable[[ScoredRollout], object] | None = None,
) -> ScoredGroup:
    """Run ``size`` rollouts of the same prompt concurrently; reward and score each one.

    Every rollout gets its own copy of ``messages``, its own sandbox and (with a configured
    ``options.sampling.seed`` s) its own seed, s + its index, so a seeded group still samples
    ``size`` different completions. One :class:`HermesAgentLoop` serves the whole group (a loop
    keeps per-run state apart). The arguments are :func:`run_rollout`'s, plus:

    Args:
        server: A chat server (Phase 1) or a token client (Phase 2, needs ``tokenizer``).
        messages: The prompt shared by the group; copied per rollout.
        tools: ``get_tool_definitions(...)`` or a ``(schemas, valid_names)`` pair.
        size: Number of rollouts (>= 1).
        reward: ``async (result, ctx) -> float``; ``None`` scores 0.0.
        task_ids: One id per rollout (default: fresh uuid4s).
        tokenizer: See :func:`run_rollout`.
        options: See :func:`run_rollout`.
        sandboxes: See :func:`run_rollout`; a private manager is shared by the group.
        limits: See :func:`run_rollout`.
        registry: See :func:`run_rollout`.
        placeholder_encode: See :func:`run_rollout`.
        on_rollout: Called with each :class:`ScoredRollout` as it finishes (progress displays);
            what it raises fails the group like a failing rollout.

    Returns:
        The :class:`ScoredGroup`, rollouts in index order.

    Raises:
        ValueError: ``size`` < 1 or ``task_ids`` of another length, bad options, or a token
            server without a tokenizer.
        InferenceError: Every rollout failed before the model answered (a dead server): a group
            of zeros would be trained on as if the policy had failed.
        Exception: Whatever a rollout raised (a reward's exception is not raised: it scores
            0.0). The siblings are cancelled first and their sandboxes released. A lone
            exception is re-raised as itself, not wrapped in an ``ExceptionGroup`` (one failing
            rollout is the common case and callers catch its type); only several concurrent
            failures surface as an ``ExceptionGroup``.

    **Cancellation**: reaches every rollout (generation streams closed, tools killed); every
    sandbox is released, shielded and bounded by the manager; a private manager is closed.
    """
    if size < 1:
        raise ValueError(f"run_group size must be >= 1, got {size!r}")
    ids = list(task_ids) if task_ids is not None else [str(uuid.uuid4()) for _ in range(size)]
    if len(ids) != size:
        raise ValueError(f"run_group got {len(ids)} task_ids for size={size}; pass one per rollout")
    rollouts: list[ScoredRollout | None] = [None] * size
    async with _open_batch(
        server,
        tools,
        reward=reward,
        tokenizer=tokenizer,
        options=options,
        sandboxes=sandboxes,
        limits=limits,
        registry=registry,
        placeholder_encode=placeholder_encode,
    ) as batch:

        async def one(index: int) -> None:
            scored = await batch.rollout(messages, ids[index], index)
            rollouts[index] = scored
            if on_rollout is not None:
                on_rollout(scored)

        async with anyio.create_task_group() as tg:
            for index in range(size):
                tg.start_soon(one, index, name=f"rollout {ids[index]}")
    done = tuple(r for r in rollouts if r is not None)
    if all(r.result.error and not _has_assistant(r.result) for r in done):
        raise InferenceError(
            f"every rollout of the group failed before the model answered: {done[0].error}"
        )
    return ScoredGroup(done)


def _has_assistant(result: AgentResult) -> bool:
    return any(m.get("role") == "assistant" for m in result.messages)
