"""verl agent loop: a registered ``AgentLoopBase`` that runs a hermes_async rollout per sample.

The model is verl's ``server_manager``, a Ray actor call that returns a whole ``TokenOutput``,
so :class:`ServerManagerClient` is a one-delta :class:`~hermes_async.inference.TokenClient`.
Needs the ``verl`` extra; asyncio only (verl's workers are asyncio actors). Configuration and
what is lost: docs/trainers/verl.md.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from hermes_async._asynclib import require_asyncio
from hermes_async.agent import run_rollout
from hermes_async.errors import ConfigError
from hermes_async.inference import ModelServerError
from hermes_async.inference.generate import Completion, SamplingParams, TokenDelta
from hermes_async.integrations._rollouts import (
    flatten,
    load_tasks,
    make_task,
    rollout_status,
    with_sampling,
)

try:
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        register,
    )
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        f"the verl agent loop needs verl: pip install 'hermes-async[verl]' ({exc})"
    ) from exc

__all__ = ("HermesAgentLoop", "ServerManagerClient", "sampling_from_verl")

logger = logging.getLogger(__name__)

#: verl's stop reasons in the token clients' finish reasons.
_FINISH = {"aborted": "abort", "completed": "stop", None: "stop"}


def sampling_from_verl(params: Mapping[str, Any]) -> dict[str, Any]:
    """verl's sampling keys that :class:`~hermes_async.inference.SamplingParams` has."""
    # The other keys (repetition_penalty, logprobs) reach the server as verl gave them.
    out = {
        name: params[name]
        for name in ("temperature", "top_p", "top_k", "max_tokens", "seed")
        if params.get(name) is not None
    }
    if out.get("top_k") == 0:
        out["top_k"] = -1
    return out


class ServerManagerClient:
    """A :class:`~hermes_async.inference.TokenClient` over verl's ``server_manager.generate``.

    One request gives one delta, so early tool dispatch is lost. ``request_id`` keeps every
    turn of a sample on one server (its prefix cache). ``stop_reason="aborted"`` becomes the
    ``abort`` finish reason the loop resumes from.
    """

    def __init__(
        self, server_manager: Any, request_id: str, sampling: Mapping[str, Any] | None = None
    ) -> None:
        self.server_manager = server_manager
        self.request_id = request_id
        self.sampling = dict(sampling or {})

    def _params(self, params: SamplingParams) -> dict[str, Any]:
        out: dict[str, Any] = {**self.sampling, **params.extra}
        out.update(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            logprobs=True,  # the trainer needs them whatever verl's rollout config says
        )
        for name in ("top_k", "seed"):
            if getattr(params, name) is not None:
                out[name] = getattr(params, name)
        if params.stop:
            out["stop"] = list(params.stop)
        if params.stop_token_ids:
            out["stop_token_ids"] = list(params.stop_token_ids)
        return out

    @asynccontextmanager
    async def stream(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> AsyncIterator[AsyncIterator[TokenDelta]]:
        """One generation as a stream of one delta.

        **Cancellation**: the awaited Ray call is abandoned (verl cancels it with the task).
        """
        delta = await self._delta(prompt_ids, params or SamplingParams())

        async def deltas() -> AsyncIterator[TokenDelta]:
            yield delta

        yield deltas()

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> Completion:
        """The whole completion. **Cancellation**: as for :meth:`stream`."""
        delta = await self._delta(prompt_ids, params or SamplingParams())
        assert delta.finish_reason is not None
        return Completion(delta.token_ids, delta.logprobs, delta.finish_reason, 1)

    async def _delta(self, prompt_ids: Sequence[int], params: SamplingParams) -> TokenDelta:
        try:
            output = await self.server_manager.generate(
                self.request_id, prompt_ids=list(prompt_ids), sampling_params=self._params(params)
            )
        except Exception as exc:  # a dead replica, a Ray error: the rollout's model failure
            raise ModelServerError(
                f"verl's server_manager.generate failed: {type(exc).__name__}: {exc}",
                endpoint="verl server_manager.generate",
            ) from exc
        ids = [int(i) for i in output.token_ids]
        logprobs = output.log_probs
        if logprobs is None or len(logprobs) != len(ids):
            raise InvalidTokenOutputError(
                f"verl's server returned {len(ids)} ids and "
                f"{'no' if logprobs is None else len(logprobs)} logprobs; a trainer needs one "
                "logprob per sampled id (is the rollout backend returning logprobs?)"
            )
        finish = _FINISH.get(output.stop_reason, str(output.stop_reason))
        if finish == "stop" and len(ids) >= params.max_tokens:
            finish = "length"
        return TokenDelta(tuple(ids), tuple(float(x) for x in logprobs), finish)


class InvalidTokenOutputError(ConfigError):
    """verl's server gave a ``TokenOutput`` a trainer cannot use (no or misaligned logprobs)."""


@register("hermes_async")
class HermesAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """verl's agent loop for hermes_async rollouts (registered as ``hermes_async``).

    ``tasks`` is ``"package.module:attribute"`` or the source itself: ``item ->
    RolloutTask`` or an environment, the item being the sample's dataset fields.
    """

    def __init__(self, *args: Any, tasks: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if tasks is None:
            raise ConfigError(
                "the hermes_async agent loop needs its task source: add `tasks: "
                "package.module:attribute` to its entry in agent_loop_config_path"
            )
        self.tasks = load_tasks(tasks) if isinstance(tasks, str) else tasks

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One sample: a rollout flattened into an ``AgentLoopOutput``.

        A failed rollout comes back fully masked with ``extra_fields["hermes_failure"]`` set.

        **Cancellation**: the rollout is cancelled and its sandbox released (bounded).
        """
        require_asyncio("the verl agent loop", "verl", remedy="run it inside verl's workers")
        task = await make_task(self.tasks, dict(kwargs))
        response_length = int(self.rollout_config.response_length)
        prompt_length = int(self.rollout_config.prompt_length)
        options = with_sampling(task.options, sampling_from_verl(sampling_params))
        assert options.sampling is not None
        per_turn = min(options.sampling.max_tokens, response_length)
        if "max_tokens" not in sampling_params and task.options.max_tokens is None:
            per_turn = response_length  # verl's default: the whole response budget
        options = dataclasses.replace(
            options, sampling=dataclasses.replace(options.sampling, max_tokens=per_turn)
        )
        request_id = str(kwargs.get("request_id") or kwargs.get("index") or id(task))
        client = ServerManagerClient(self.server_manager, request_id, sampling_params)
        scored = await run_rollout(
            client, task.messages, task.tools, setup=task.setup, options=options
        )
        flat = flatten(scored, max_response_tokens=response_length)
        status = (
            "truncated" if flat.truncated else rollout_status(scored, max_turns=options.max_turns)
        )
        mask, reward = flat.response_mask, scored.reward
        prompt = flat.prompt_ids
        if len(prompt) > prompt_length:  # verl cannot pad it: nothing of it is trained on
            status, prompt = "failed", prompt[-prompt_length:]
        if status == "failed":
            mask, reward = [0] * len(mask), 0.0
        response, logprobs = flat.response_ids, flat.response_logprobs
        if not response:  # verl's rm_scores need one position
            response, mask, logprobs = [self.tokenizer.eos_token_id or 0], [0], [0.0]
        extra: dict[str, Any] = {
            "hermes_status": status,
            "hermes_policy_versions": scored.policy_versions,
        }
        if scored.failure is not None:
            extra["hermes_failure"] = scored.failure.to_json()
        timings = scored.result.timings
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=response,
            response_mask=mask,
            response_logprobs=logprobs,
            reward_score=reward,
            num_turns=len(scored.messages),
            metrics=AgentLoopMetrics(
                generate_sequences=sum(t.get("generation_seconds", 0.0) for t in timings),
                tool_calls=sum(t.get("tool_seconds", 0.0) for t in timings),
            ),
            extra_fields=extra,
        )
