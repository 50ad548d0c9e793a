"""SkyRL generator: a ``GeneratorInterface`` whose trajectories are hermes_async rollouts.

:class:`HermesGenerator` runs each instance's repetitions as one
:func:`~hermes_async.agent.run_group` over SkyRL's HTTP inference endpoint. The interface
needs the ``skyrl`` extra; the conversion (:func:`generator_output`) imports nothing of
SkyRL. Wiring and field mapping: ``docs/trainers/skyrl.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from hermes_async._groups import single_errors
from hermes_async._paced import start_paced
from hermes_async.agent import AgentOptions, ScoredRollout, run_group
from hermes_async.errors import ConfigError
from hermes_async.integrations._rollouts import (
    RolloutStatus,
    TaskSource,
    as_tuple,
    flatten,
    make_task,
    rollout_status,
    status_counts,
    with_sampling,
)

__all__ = (
    "STOP_REASONS",
    "HermesGenerator",
    "generator_output",
    "sampling_from_skyrl",
)

#: Our statuses in SkyRL's stop reasons: its overlong filter trains only on ``"stop"``.
STOP_REASONS: dict[RolloutStatus, str] = {
    "completed": "stop",
    "truncated": "length",
    "aborted": "abort",
    "failed": "error",
}

# SkyRL sampling keys that only shape the text a server returns: ids are what we train on.
_TEXT_ONLY = frozenset({"skip_special_tokens", "include_stop_str_in_output", "logprobs", "n"})


def sampling_from_skyrl(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """SkyRL's ``sampling_params`` as :class:`~hermes_async.inference.SamplingParams` fields.

    ``min_p`` and the penalties become extras.

    Raises:
        ConfigError: ``n`` other than 1, or a key no token endpoint takes.
    """
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in (params or {}).items():
        if value is None or (key in _TEXT_ONLY and key != "n"):
            continue
        if key in ("max_generate_length", "max_tokens", "max_new_tokens"):
            out["max_tokens"] = value
        elif key in ("temperature", "top_p", "seed"):
            out[key] = value
        elif key == "top_k":
            out["top_k"] = -1 if value == 0 else value  # SkyRL's "no cut-off" spelling
        elif key in ("stop", "stop_token_ids"):
            out[key] = as_tuple(value)
        elif key == "n":
            if value != 1:
                raise ConfigError(
                    f"sampling_params.n={value!r}: SkyRL sends one row per trajectory"
                )
        elif key in ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            extra[key] = value
        else:
            raise ConfigError(
                f"sampling_params.{key}={value!r} cannot be honoured by the hermes_async "
                "generator (typed: max_generate_length, temperature, top_p, top_k, seed, stop, "
                "stop_token_ids; extras: min_p and the penalties)"
            )
    if extra:
        out["extra"] = extra
    return out


def generator_output(
    rollouts: Sequence[ScoredRollout],
    *,
    trajectory_ids: Sequence[Any] | None = None,
    max_turns: int | None = None,
    max_response_tokens: int | None = None,
) -> dict[str, Any]:
    """The ``GeneratorOutput`` dict of ``rollouts`` (in order), aligned per trajectory.

    A failed rollout keeps its ids with ``loss_masks`` all 0 and reward 0.0; its stop reason
    ``"error"`` also keeps SkyRL's overlong filter off it.
    """
    prompts, responses, masks, logprobs, rewards, reasons = [], [], [], [], [], []
    statuses: list[RolloutStatus] = []
    for rollout in rollouts:
        flat = flatten(rollout, max_response_tokens)
        status = "truncated" if flat.truncated else rollout_status(rollout, max_turns=max_turns)
        failed = status == "failed"
        prompts.append(flat.prompt_ids)
        responses.append(flat.response_ids)
        masks.append([0] * len(flat.response_mask) if failed else flat.response_mask)
        logprobs.append(flat.response_logprobs)
        rewards.append(0.0 if failed else rollout.reward)
        reasons.append(STOP_REASONS[status])
        statuses.append(status)
    times = [r.seconds for r in rollouts]
    llm = [sum(t.get("generation_seconds", 0.0) for t in r.result.timings) for r in rollouts]
    return {
        "prompt_token_ids": prompts,
        "response_ids": responses,
        "rewards": rewards,
        "loss_masks": masks,
        "stop_reasons": reasons,
        "rollout_metrics": {f"hermes_async/{k}": v for k, v in status_counts(statuses).items()},
        "rollout_logprobs": logprobs,
        "trajectory_ids": list(trajectory_ids) if trajectory_ids is not None else None,
        "trajectory_generation_times": times,
        "trajectory_time_splits": {
            "llm": llm,
            "env": [max(0.0, t - g) for t, g in zip(times, llm, strict=True)],
        },
        "rollout_expert_indices": None,
        "rollout_sample_support": None,
        "is_last_step": None,
        "env_metrics": None,
        "pixel_values": None,
        "image_grid_thw": None,
    }


class HermesGenerator:
    """SkyRL's ``GeneratorInterface`` over hermes_async rollouts (a virtual subclass of it).

    Args:
        tasks: ``item -> RolloutTask`` (sync or async) or an environment.
        server: A token client or ``ServerPool`` over SkyRL's inference endpoint.
        max_response_tokens: The whole trajectory's response budget; a longer response is
            cut and reported ``"length"``.
        weight_version: ``() -> int``, the policy version of every completion segment.
    """

    def __init__(
        self,
        tasks: TaskSource | object,
        server: Any,
        *,
        max_response_tokens: int | None = None,
        weight_version: Any = None,
    ) -> None:
        self.tasks = tasks
        self.server = server
        self.max_response_tokens = max_response_tokens
        self.weight_version = weight_version

    async def generate(self, input_batch: Mapping[str, Any]) -> dict[str, Any]:
        """Run every trajectory of ``input_batch``; outputs in input order, one group per instance.

        Raises:
            ConfigError: Sampling parameters that cannot be honoured, or a task without tokenizer.

        **Cancellation**: every rollout is cancelled and its sandbox released (bounded).
        """
        prompts = list(input_batch["prompts"])
        ids = input_batch.get("trajectory_ids") or [None] * len(prompts)
        extras = input_batch.get("env_extras") or [{}] * len(prompts)
        classes = input_batch.get("env_classes") or [None] * len(prompts)
        groups: dict[Any, list[int]] = {}
        for index, trajectory in enumerate(ids):
            key = getattr(trajectory, "instance_id", None) or ("row", index)
            groups.setdefault(key, []).append(index)
        results: list[ScoredRollout | None] = [None] * len(prompts)
        max_turns: list[int] = []

        async def one_group(indexes: list[int]) -> None:
            first = indexes[0]
            item = {
                "prompt": prompts[first],
                "env_class": classes[first],
                "env_extras": extras[first],
                "trajectory_id": ids[first],
            }
            task = await make_task(self.tasks, item)
            options = self._options(task.options, input_batch.get("sampling_params"))
            max_turns.append(options.max_turns)
            group = await run_group(
                self.server,
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
                await start_paced(tg, one_group, groups.values())
        done = [r for r in results if r is not None]
        return generator_output(
            done,
            trajectory_ids=input_batch.get("trajectory_ids"),
            max_turns=max(max_turns) if max_turns else None,
            max_response_tokens=self.max_response_tokens,
        )

    def _options(self, options: AgentOptions, params: Mapping[str, Any] | None) -> AgentOptions:
        options = with_sampling(options, sampling_from_skyrl(params))
        if self.weight_version is not None and options.version_source is None:
            options = dataclasses.replace(options, version_source=self.weight_version)
        return options


try:  # SkyRL's ABC, when SkyRL is there (it only documents the one method)
    from skyrl.train.generators.base import GeneratorInterface
except ImportError:  # pragma: no cover - depends on the extra
    pass
else:
    GeneratorInterface.register(HermesGenerator)
