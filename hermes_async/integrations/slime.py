"""slime custom generate function: one hermes_async rollout per ``Sample``.

:func:`make_generate` builds the ``custom_generate(args, sample, sampling_params)`` that
slime's ``--custom-generate-function-path`` names, over SGLang's ``/generate`` at slime's
router. slime has no PyPI package: this module imports nothing of it and writes only the
fields ``docs/trainers/slime.md`` records (with file references); tests check against
that record.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hermes_async.agent import run_rollout
from hermes_async.errors import ConfigError
from hermes_async.inference.generate import SGLangGenerateClient
from hermes_async.integrations._rollouts import (
    RolloutStatus,
    TaskSource,
    as_tuple,
    flatten,
    make_task,
    rollout_status,
    with_sampling,
)

__all__ = ("fill_sample", "make_generate", "sampling_from_sglang")

logger = logging.getLogger(__name__)

# SGLang sampling keys that shape only the returned text (ids are what is trained on).
_TEXT_ONLY = frozenset({"skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens"})
_EXTRAS = frozenset({"min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"})


def sampling_from_sglang(params: Mapping[str, Any]) -> dict[str, Any]:
    """slime's SGLang ``sampling_params`` as :class:`~hermes_async.inference.SamplingParams` fields.

    Raises:
        ConfigError: A key the SGLang client cannot send (``n`` > 1, ``return_logprob``...).
    """
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in params.items():
        if value is None or key in _TEXT_ONLY:
            continue
        if key == "max_new_tokens":
            out["max_tokens"] = value
        elif key in ("temperature", "top_p", "top_k"):
            out[key] = value
        elif key == "sampling_seed":
            out["seed"] = value
        elif key in ("stop", "stop_token_ids"):
            out[key] = as_tuple(value)
        elif key in _EXTRAS:
            extra[key] = value
        elif key == "n" and value == 1:
            continue
        else:
            raise ConfigError(
                f"sampling_params.{key}={value!r} cannot be honoured by the hermes_async "
                "generate function (it sends max_new_tokens, temperature, top_p, top_k, "
                "sampling_seed, stop, stop_token_ids, min_p and the penalties)"
            )
    if extra:
        out["extra"] = extra
    return out


# Our statuses in slime's Sample.Status member names (slime/utils/types.py).
_STATUS = {
    "completed": "COMPLETED",
    "truncated": "TRUNCATED",
    "aborted": "ABORTED",
    "failed": "FAILED",
}


def _set_status(sample: Any, status: RolloutStatus) -> None:
    enum = getattr(type(sample), "Status", None)
    if enum is None:
        raise ConfigError(
            f"{type(sample).__name__} has no Status enum: pass slime's Sample "
            "(slime/utils/types.py)"
        )
    sample.status = enum[_STATUS[status]]


def fill_sample(
    sample: Any,
    rollout: Any,
    *,
    decode: Callable[[list[int]], str],
    max_response_tokens: int | None = None,
    max_turns: int | None = None,
) -> Any:
    """Set ``sample``'s trained fields from ``rollout``; return it.

    A failed rollout keeps its ids with ``loss_mask`` all 0, reward 0.0, status ``FAILED``
    and its failure in ``metadata["hermes_async_failure"]``.
    """
    flat = flatten(rollout, max_response_tokens)
    status = "truncated" if flat.truncated else rollout_status(rollout, max_turns=max_turns)
    failed = status == "failed"
    sample.tokens = flat.prompt_ids + flat.response_ids
    sample.response_length = len(flat.response_ids)
    sample.response = decode(flat.response_ids)
    sample.loss_mask = [0] * len(flat.response_mask) if failed else flat.response_mask
    sample.rollout_log_probs = flat.response_logprobs
    sample.reward = 0.0 if failed else rollout.reward
    sample.weight_versions = [str(v) for v in rollout.policy_versions]
    _set_status(sample, status)
    if rollout.failure is not None:
        metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
        metadata["hermes_async_failure"] = rollout.failure.to_json()
        sample.metadata = metadata
    return sample


def _fail(sample: Any, message: str) -> Any:
    """``sample`` marked ``FAILED`` with nothing to train on and ``message`` as the reason."""
    sample.tokens, sample.response_length, sample.response = [], 0, ""
    sample.loss_mask, sample.rollout_log_probs, sample.reward = [], [], 0.0
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    metadata["hermes_async_failure"] = {"category": "config", "message": message}
    sample.metadata = metadata
    _set_status(sample, "failed")
    return sample


def make_generate(
    tasks: TaskSource | object,
    *,
    server: Any = None,
    incremental: bool = False,
    max_response_tokens: int | None = None,
) -> Callable[[Any, Any, Mapping[str, Any]], Awaitable[Any]]:
    """slime's custom generate function over hermes_async rollouts.

    Args:
        tasks: ``sample -> RolloutTask`` (sync or async) or an environment.
        server: A token client; ``None``: an SGLang client of slime's router per call.
        incremental: The SGLang server streams deltas (``--incremental-streaming-output``).
        max_response_tokens: Cut the response there (default: ``rollout_max_response_len``).

    Returns:
        ``async generate(args, sample, sampling_params) -> Sample``; every outcome, bad
        sampling parameters included, is a returned sample.
    """

    async def generate(args: Any, sample: Any, sampling_params: Mapping[str, Any]) -> Any:
        """One sample's rollout (see :func:`make_generate`).

        **Cancellation**: the rollout is cancelled and its sandbox released (bounded).
        """
        try:
            trainer = sampling_from_sglang(sampling_params)
            task = await make_task(tasks, sample)
            options = with_sampling(task.options, trainer)
        except ConfigError as exc:  # every sample fails alike: logged as the operator's error
            logger.error("slime sample %s: %s", getattr(sample, "index", "?"), exc)
            return _fail(sample, str(exc))
        budget = max_response_tokens
        if budget is None:
            budget = getattr(args, "rollout_max_response_len", None)
        tokenizer = task.setup.tokenizer
        assert tokenizer is not None  # make_task refused a task without one
        if server is not None:
            scored = await run_rollout(
                server, task.messages, task.tools, setup=task.setup, options=options
            )
        else:
            url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
            async with SGLangGenerateClient(
                url, incremental=incremental, vocab_size=len(tokenizer)
            ) as client:
                scored = await run_rollout(
                    client, task.messages, task.tools, setup=task.setup, options=options
                )
        return fill_sample(
            sample,
            scored,
            decode=tokenizer.decode,
            max_response_tokens=budget,
            max_turns=options.max_turns,
        )

    return generate
