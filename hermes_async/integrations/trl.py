"""TRL rollout function: ``GRPOTrainer(rollout_func=...)`` over hermes_async rollouts.

TRL calls ``rollout_func(prompts, trainer)`` synchronously and trains on ``prompt_ids``,
``completion_ids``, ``logprobs`` and ``env_mask``. :class:`RolloutFunc` runs each run of
identical prompts as one :func:`~hermes_async.agent.run_group` in a blocking portal (its own
event loop in a thread) against the vLLM server TRL keeps in sync. Wiring, and what is lost:
docs/trainers/trl.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.from_thread

from hermes_async._groups import single_errors
from hermes_async._paced import start_paced
from hermes_async.agent import AgentOptions, RolloutTask, ScoredRollout, run_group
from hermes_async.agent.rollout import RolloutSetup
from hermes_async.errors import ConfigError
from hermes_async.inference.completions import VLLMCompletionsClient
from hermes_async.integrations._rollouts import (
    RolloutStatus,
    TaskSource,
    flatten,
    make_task,
    rollout_status,
    with_sampling,
)
from hermes_async.tools.sandbox.manager import SandboxFactory, open_sandbox_manager

__all__ = ("RolloutFunc", "hermes_reward", "messages_of", "rollout_fields")


def messages_of(prompt: object) -> list[dict[str, Any]]:
    """A TRL prompt as chat messages: a conversation as it is, a string as one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        return [dict(m) for m in prompt]
    raise ConfigError(
        f"a TRL prompt must be a string or a list of messages, got {type(prompt).__name__}"
    )


def rollout_fields(
    rollouts: Sequence[ScoredRollout],
    *,
    max_completion_length: int | None = None,
    max_turns: int | None = None,
) -> dict[str, list[Any]]:
    """The ``rollout_func`` result of ``rollouts`` (in order).

    ``hermes_reward`` and ``hermes_status`` reach the reward functions. A failed rollout keeps
    its ids with ``env_mask`` all 0 and reward 0.0.
    """
    out: dict[str, list[Any]] = {
        key: []
        for key in (
            "prompt_ids",
            "completion_ids",
            "logprobs",
            "env_mask",
            "hermes_reward",
            "hermes_status",
        )
    }
    for rollout in rollouts:
        flat = flatten(rollout, max_completion_length)
        status: RolloutStatus = (
            "truncated" if flat.truncated else rollout_status(rollout, max_turns=max_turns)
        )
        failed = status == "failed"
        out["prompt_ids"].append(flat.prompt_ids)
        out["completion_ids"].append(flat.response_ids)
        out["logprobs"].append(flat.response_logprobs)
        out["env_mask"].append([0] * len(flat.response_mask) if failed else flat.response_mask)
        out["hermes_reward"].append(0.0 if failed else rollout.reward)
        out["hermes_status"].append(status)
    return out


def hermes_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """A TRL reward function: each rollout's own reward (``reward_funcs=[hermes_reward]``)."""
    return [float(r) for r in kwargs["hermes_reward"]]


def _trainer_sampling(trainer: Any) -> dict[str, Any]:
    """The trainer's sampling settings as ``SamplingParams`` fields.

    Raises:
        ConfigError: A setting the rollouts cannot honour: refused, never dropped.
    """
    args = getattr(trainer, "args", None)
    if generation_kwargs := getattr(args, "generation_kwargs", None):
        raise ConfigError(
            f"GRPOConfig.generation_kwargs={generation_kwargs!r} cannot be honoured by the "
            "hermes_async rollout function (it applies temperature, top_p, top_k, min_p and "
            "repetition_penalty); set those instead, or leave generation_kwargs empty"
        )
    if getattr(args, "vllm_structured_outputs_regex", None):
        raise ConfigError(
            "GRPOConfig.vllm_structured_outputs_regex cannot be honoured: one regex for every "
            "turn would forbid the tool calls; constrain turns with AgentOptions.sampling_hook"
        )
    out: dict[str, Any] = {}
    for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k")):
        value = getattr(args, theirs, None)
        if value is not None:
            out[ours] = -1 if ours == "top_k" and value == 0 else value
    extra = {
        name: value
        for name in ("min_p", "repetition_penalty")
        if (value := getattr(args, name, None)) is not None
    }
    if extra:
        out["extra"] = extra
    return out


class RolloutFunc:
    """``rollout_func`` for TRL's ``GRPOTrainer``.

    The trainer's sampling settings apply; ``max_completion_length`` is each turn's budget and
    the completion's cut.

    Args:
        tasks: ``prompt -> RolloutTask`` (sync or async) or an environment; ``None``: the prompt
            as messages with ``tools``, ``setup`` (reward, tokenizer, ...) and ``options``.
        base_url: The vLLM server; ``None``: the trainer's.
        client: ``base_url -> TokenClient`` (default: vLLM's ``/v1/completions`` with ids).
        sandbox_factory: The sandboxes of a task whose setup names no manager (default: local).
            Each call opens one manager and releases every sandbox before returning.
        backend: The portal's event loop: ``"asyncio"`` or ``"trio"``.
    """

    def __init__(
        self,
        tasks: TaskSource | object | None = None,
        *,
        tools: Any = None,
        setup: RolloutSetup | None = None,
        options: AgentOptions | None = None,
        base_url: str | None = None,
        client: Callable[[str], Any] | None = None,
        sandbox_factory: SandboxFactory | None = None,
        backend: str = "asyncio",
    ) -> None:
        if tasks is None:
            if tools is None or setup is None:
                raise ConfigError("RolloutFunc needs tasks=, or tools= and setup= for the prompts")
            fixed_options = options or AgentOptions()

            def default(prompt: object) -> RolloutTask:
                return RolloutTask(messages_of(prompt), tools, setup, fixed_options)

            tasks = default
        self.tasks = tasks
        self.base_url = base_url
        self.client = client or (lambda url: VLLMCompletionsClient(url))
        self.sandbox_factory = sandbox_factory
        self.backend = backend

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Run ``prompts`` (blocking); one row per prompt, in order.

        Raises:
            ConfigError: No server URL, sampling that cannot be honoured, or a task that cannot
                train (no tokenizer).
        """
        url = self.base_url or _trainer_url(trainer)
        with anyio.from_thread.start_blocking_portal(self.backend) as portal:
            return portal.call(self._run, prompts, trainer, url)

    async def _run(self, prompts: list[Any], trainer: Any, url: str) -> dict[str, list[Any]]:
        runs: list[list[int]] = []
        for index, prompt in enumerate(prompts):
            if runs and prompts[runs[-1][0]] == prompt:
                runs[-1].append(index)
            else:
                runs.append([index])
        budget = getattr(getattr(trainer, "args", None), "max_completion_length", None)
        trainer_sampling = _trainer_sampling(trainer)
        if budget is not None:
            trainer_sampling["max_tokens"] = budget
        results: list[ScoredRollout | None] = [None] * len(prompts)
        max_turns = 0
        async with open_sandbox_manager(self.sandbox_factory), self.client(url) as server:

            async def one(indexes: list[int]) -> None:
                nonlocal max_turns
                task = await make_task(self.tasks, prompts[indexes[0]])
                options = with_sampling(task.options, trainer_sampling)
                max_turns = max(max_turns, options.max_turns)
                group = await run_group(
                    server,
                    task.messages,
                    task.tools,
                    size=len(indexes),
                    setup=task.setup,
                    options=options,
                )
                for index, rollout in zip(indexes, group.rollouts, strict=True):
                    results[index] = rollout

            with single_errors():  # a lone error (a dead server) comes out as itself
                async with anyio.create_task_group() as tg:
                    await start_paced(tg, one, runs)
        return rollout_fields(
            [r for r in results if r is not None],
            max_completion_length=budget,
            max_turns=max_turns or None,
        )


def _trainer_url(trainer: Any) -> str:
    client = getattr(getattr(trainer, "vllm_generation", None), "vllm_client", None)
    url = getattr(client, "base_url", None)
    if not isinstance(url, str):
        raise ConfigError(
            "no vLLM server to generate with: run GRPOTrainer with use_vllm=True and "
            "vllm_mode='server' (trl vllm-serve), or pass RolloutFunc(base_url=...)"
        )
    return url
