"""What every trainer adapter reads off a scored rollout: its turns, its flat rows, its status.

Pure functions over :class:`~hermes_async.agent.ScoredRollout`. Every id and logprob a
trainer receives is one the rollout recorded, in order; nothing is re-tokenized. A cut to a
trainer's budget is at the end, and the status says ``truncated``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from hermes_async.agent import AgentOptions, RolloutTask, ScoredRollout
from hermes_async.agent.rollout import TaskSource
from hermes_async.errors import ConfigError
from hermes_async.inference.generate import SamplingParams
from hermes_async.inference.trajectory import MASK_ID

__all__ = (
    "FlatRollout",
    "RolloutStatus",
    "TaskSource",
    "TurnTokens",
    "as_tuple",
    "flatten",
    "load_tasks",
    "make_task",
    "rollout_status",
    "status_counts",
    "turn_tokens",
    "with_sampling",
)


#: How a rollout ended, in the words every trainer has one of: ``completed`` (the model
#: answered), ``truncated`` (a budget ended it: turns, tokens, context, deadline, or a tool
#: call cut by ``max_tokens``), ``aborted`` (cancelled, or the server kept aborting it) and
#: ``failed`` (the model server, the sandbox or the reward failed: not the policy's doing).
RolloutStatus: TypeAlias = Literal["completed", "truncated", "aborted", "failed"]


def load_tasks(path: str) -> Any:
    """The task source named ``"package.module:attribute"``.

    Raises:
        ConfigError: The path is malformed or does not import.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"tasks must be 'package.module:attribute', got {path!r}")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load the task source {path!r}: {exc}") from exc


async def make_task(source: object, item: Any) -> RolloutTask:
    """The :class:`RolloutTask` of ``item``, from an environment or a task function.

    Raises:
        ConfigError: The task has no tokenizer (trainers need Phase 2), or the source returned
            something else than a ``RolloutTask``.
    """
    rollout_task = getattr(source, "rollout_task", None)
    made: object = (
        rollout_task(item, token_server=True) if callable(rollout_task) else source(item)  # type: ignore[operator]
    )
    if inspect.isawaitable(made):
        made = await made
    if not isinstance(made, RolloutTask):
        raise ConfigError(
            f"the task source returned {type(made).__name__}, not a RolloutTask; return "
            "RolloutTask(messages, tools, setup, options) from it"
        )
    if made.setup.tokenizer is None:
        raise ConfigError(
            "the rollout task has no tokenizer: a trainer needs exact token ids, so set "
            "RolloutSetup(tokenizer=...) to the model's tokenizer (an environment: its "
            "tokenizer_name)"
        )
    return made


def as_tuple(value: object) -> object:
    """A trainer's list setting (``stop``, ``stop_token_ids``) as a tuple; a lone string is one
    item. Anything else stays as it is, for ``SamplingParams`` to refuse by name."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, Iterable) else value


def with_sampling(options: AgentOptions, trainer: Mapping[str, Any]) -> AgentOptions:
    """``options`` with the trainer's sampling fields applied.

    The task's own ``temperature`` / ``max_tokens`` hold where the trainer gives none.

    Raises:
        ConfigError: A value no server takes (``temperature=-1``, ``top_p=0``, ...).
    """
    sampling = options.sampling or SamplingParams()
    own = {
        name: value
        for name in ("temperature", "max_tokens")
        if (value := getattr(options, name)) is not None
    }
    changes = {**own, **trainer}
    if "extra" in changes:
        changes["extra"] = {**sampling.extra, **changes["extra"]}
    try:
        sampling = dataclasses.replace(sampling, **changes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"the trainer's sampling parameters cannot be honoured: {exc}") from None
    return dataclasses.replace(options, sampling=sampling, temperature=None, max_tokens=None)


@dataclass(frozen=True, slots=True)
class TurnTokens:
    """One model turn as the server saw it.

    Attributes:
        prompt_ids: Every id before this turn's completion (append-only across turns).
        completion_ids: The ids the server sampled on this turn, resumes included.
        versions: The policy version of each request of the turn (``None``: unknown).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: tuple[int | None, ...]


def _completion_segments(rollout: ScoredRollout) -> list[Mapping[str, Any]]:
    state = rollout.result.managed_state or {}
    return [
        seg
        for seg in state.get("segments") or ()
        if isinstance(seg, Mapping) and seg.get("kind") == "completion"
    ]


def turn_tokens(rollout: ScoredRollout) -> list[TurnTokens]:
    """The rollout's model turns, in order (empty for a rollout without exact tokens)."""
    if not rollout.trainable:
        return []
    by_turn: dict[int, list[Mapping[str, Any]]] = {}
    for seg in _completion_segments(rollout):
        by_turn.setdefault(int(seg["turn"]), []).append(seg)
    tokens, logprobs = rollout.tokens, rollout.logprobs
    turns = []
    for segs in by_turn.values():
        first, last = int(segs[0]["start"]), int(segs[-1]["end"])
        turns.append(
            TurnTokens(
                prompt_ids=tokens[:first],
                completion_ids=tokens[first:last],
                logprobs=logprobs[first:last],
                versions=tuple(s.get("version") for s in segs),
            )
        )
    return turns


@dataclass(frozen=True, slots=True)
class FlatRollout:
    """A rollout as one prompt and one response, the shape verl, SkyRL, slime and TRL train on.

    Attributes:
        response_ids: Everything after the prompt: completions, tool responses, suffixes.
        response_mask: 1 where the policy sampled the id, 0 elsewhere.
        response_logprobs: The sampled logprob where the mask is 1, 0.0 elsewhere.
        truncated: The response was cut to the trainer's budget.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    truncated: bool = False


def flatten(rollout: ScoredRollout, max_response_tokens: int | None = None) -> FlatRollout:
    """The rollout as one prompt + one response, cut at ``max_response_tokens`` if given.

    Raises:
        ConfigError: The rollout has no exact tokens (a chat server: Phase 1).
    """
    if not rollout.trainable:
        raise ConfigError(
            "the rollout has placeholder tokens (a chat server, Phase 1); a trainer needs a "
            "token server (vLLM /inference/v1/generate, SGLang /generate, ...) and a tokenizer"
        )
    tokens, masks, logprobs = rollout.tokens, rollout.masks, rollout.logprobs
    start = next((i for i, m in enumerate(masks) if m != MASK_ID), len(tokens))
    response = tokens[start:]
    mask = [0 if m == MASK_ID else 1 for m in masks[start:]]
    response_logprobs = [lp if m else 0.0 for lp, m in zip(logprobs[start:], mask, strict=True)]
    cut = max_response_tokens is not None and len(response) > max_response_tokens
    if cut:
        end = max_response_tokens
        response, mask, response_logprobs = response[:end], mask[:end], response_logprobs[:end]
    return FlatRollout(tokens[:start], response, mask, response_logprobs, truncated=cut)


def rollout_status(rollout: ScoredRollout, *, max_turns: int | None = None) -> RolloutStatus:
    """How ``rollout`` ended (see :data:`RolloutStatus`); ``max_turns`` is its options' limit."""
    failure = rollout.failure
    result = rollout.result
    if failure is not None:
        if failure.category == "cancelled" or failure.detail.get("aborted"):
            return "aborted"
        if failure.category in ("infra", "verifier"):
            return "failed"
        if failure.category == "agent_timeout":
            return "truncated"
        if result.failure is not None and result.failure.category == "model":
            return "truncated"  # the context is full: the loop's only model failure that ends it
    if result.finished_naturally:
        if any(check.reason == "length" for check in result.template_checks):
            return "truncated"  # the final answer was cut by max_tokens
        return "completed"
    if max_turns is not None and result.turns_used >= max_turns:
        return "truncated"
    return "truncated" if rollout.trainable else "failed"


def status_counts(statuses: Sequence[RolloutStatus]) -> dict[str, int]:
    out: dict[str, int] = {}
    for status in statuses:
        out[status] = out.get(status, 0) + 1
    return out
