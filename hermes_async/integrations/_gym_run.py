"""The NeMo Gym agent's ``/run``: one hermes_async rollout rendered as Gym's response.

Each model turn is a Responses output item with its exact ``prompt_token_ids``,
``generation_token_ids`` and ``generation_log_probs``, never re-tokenized; each prompt extends
the one before (NeMo RL asserts it). Public through :mod:`hermes_async.integrations.nemo_gym`;
a module of its own so that ``_nemo_gym_agent`` imports it without a circle.
What maps to what: docs/trainers/nemo_gym.md.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from hermes_async.agent import AgentOptions, ScoredRollout, run_rollout
from hermes_async.agent.failures import RolloutFailure
from hermes_async.errors import ConfigError
from hermes_async.inference.generate import SamplingParams
from hermes_async.integrations._rollouts import (
    RolloutStatus,
    TaskSource,
    load_tasks,
    make_task,
    rollout_status,
    turn_tokens,
)
from hermes_async.jsontypes import JSONObject

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = (
    "GymAgent",
    "UnsupportedRequestError",
    "create_app",
    "failure_fields",
    "messages_from_params",
    "open_token_client",
    "render_response",
)

logger = logging.getLogger(__name__)


class UnsupportedRequestError(ConfigError):
    """A ``/run`` request asks for something this agent cannot honour (answered with 422)."""


# Responses request fields the agent cannot honour, and why (each refused, never dropped).
_REFUSED = {
    "background": "a /run request is answered when its rollout ends",
    "conversation": "each /run request is one whole rollout; there is no stored conversation",
    "previous_response_id": "each /run request is one whole rollout; nothing is stored",
    "prompt": "prompt templates are resolved by the caller; send the messages in `input`",
    "max_tool_calls": "the rollout's turns are bounded by the environment's max_agent_turns",
    "include": "only token ids and sampled logprobs are returned",
}


def _check_params(params: Mapping[str, Any]) -> None:
    """Raise :class:`UnsupportedRequestError` for a field the agent cannot honour."""
    for name, why in _REFUSED.items():
        if params.get(name) not in (None, False, [], {}):
            raise UnsupportedRequestError(f"responses_create_params.{name} is not supported: {why}")
    if params.get("stream"):
        raise UnsupportedRequestError("responses_create_params.stream must be false for /run")
    if params.get("top_logprobs"):
        raise UnsupportedRequestError(
            f"responses_create_params.top_logprobs={params['top_logprobs']!r} is not supported: "
            "each turn carries the sampled tokens' logprobs only (generation_log_probs)"
        )
    choice = params.get("tool_choice", "auto")
    if choice not in ("auto", None):
        raise UnsupportedRequestError(
            f"responses_create_params.tool_choice={choice!r} is not supported: the model "
            "chooses its tools ('auto'); a forced or disabled choice cannot be applied to "
            "token-level generation"
        )
    tools = params.get("tools")
    if tools is not None and (isinstance(tools, str) or not isinstance(tools, Sequence)):
        raise UnsupportedRequestError(
            f"responses_create_params.tools must be a list, got {type(tools).__name__}"
        )
    for name in ("temperature", "top_p", "max_output_tokens"):
        value = params.get(name)
        if value is None:
            continue
        rule = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"}
        try:
            SamplingParams.check(rule[name], value, owner="responses_create_params")
        except ValueError as exc:
            raise UnsupportedRequestError(str(exc)) from None


def _text(content: object) -> str:
    """The text of a Responses message ``content`` (a string or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, Mapping):
                raise UnsupportedRequestError(
                    f"input content part of type {part.get('type')!r} is not supported: text only"
                )
        return "".join(parts)
    return ""


def messages_from_params(params: Mapping[str, Any]) -> list[JSONObject]:
    """The chat messages of ``responses_create_params``: ``instructions``, then ``input``.

    An input item other than a message, function call or its output is refused.

    Raises:
        UnsupportedRequestError: ``input`` is not a string or a list of objects, or holds an
            item or content part this agent cannot read.
    """
    messages: list[JSONObject] = []
    if params.get("instructions"):
        messages.append({"role": "system", "content": str(params["instructions"])})
    given = params.get("input", "")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
        return messages
    if not isinstance(given, Sequence):
        raise UnsupportedRequestError(
            f"responses_create_params.input must be a string or a list of items, got "
            f"{type(given).__name__}"
        )
    for item in given:
        if not isinstance(item, Mapping):
            raise UnsupportedRequestError(
                f"each input item must be an object, got {type(item).__name__}"
            )
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role")
            messages.append({"role": role, "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(output)}
            )
        elif kind != "reasoning":  # a replayed reasoning item is not part of the prompt
            raise UnsupportedRequestError(f"input item of type {kind!r} is not supported")
    return messages


def _options(options: AgentOptions, params: Mapping[str, Any]) -> AgentOptions:
    """``options`` with the request's sampling fields applied (the request wins)."""
    changes: dict[str, Any] = {}
    if params.get("temperature") is not None:
        changes["temperature"] = params["temperature"]
    if params.get("max_output_tokens") is not None:
        changes["max_tokens"] = params["max_output_tokens"]
    if params.get("top_p") is not None:
        sampling = options.sampling or SamplingParams()
        changes["sampling"] = dataclasses.replace(sampling, top_p=params["top_p"])
    return dataclasses.replace(options, **changes) if changes else options


# Our failure categories in Gym's shared vocabulary (nemo_gym/failure_kinds.py).
_FAILURE_KINDS = {
    ("infra", "model_server"): "agent_request_failed",
    ("infra", "sandbox"): "session_lost",
    ("verifier", None): "verifier_error",
    ("agent_timeout", None): "agent_timeout",
    ("cancelled", None): "cancelled",
}


def failure_fields(failure: RolloutFailure | None) -> JSONObject:
    """``mask_sample``, ``failure_kind`` and ``failure_reason`` for a BaseVerifyResponse."""
    # infra, verifier and cancelled failures mask the sample: their reward says nothing of the
    # policy. The policy's own failures (model, tool, agent_timeout) keep it, named.
    if failure is None:
        return {"mask_sample": False}
    source = failure.detail.get("source")
    kind = _FAILURE_KINDS.get((failure.category, source if isinstance(source, str) else None))
    kind = kind or _FAILURE_KINDS.get((failure.category, None))
    if kind is None:
        kind = "agent_run_error" if failure.category == "infra" else None
    return {
        "mask_sample": failure.category in ("infra", "verifier", "cancelled"),
        "failure_kind": kind,
        "failure_reason": str(failure),
    }


def _output_text(text: str) -> JSONObject:
    return {"type": "output_text", "text": text, "annotations": []}


def _turn_items(message: Mapping[str, Any]) -> list[JSONObject]:
    """The Responses output items of one assistant message (reasoning, message, calls)."""
    items: list[JSONObject] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        items.append(
            {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reasoning}],
                "status": "completed",
            }
        )
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    if content or (not calls and not items):
        items.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [_output_text(content)],
            }
        )
    for call in calls:
        items.append(
            {
                "id": call["id"],
                "call_id": call["id"],
                "type": "function_call",
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    return items


def render_response(
    rollout: ScoredRollout,
    params: Mapping[str, Any],
    *,
    status: RolloutStatus,
    model: str = "hermes-async",
) -> JSONObject:
    """The ``NeMoGymResponse`` of ``rollout``; each turn's last item carries its ids."""
    turns = iter(turn_tokens(rollout))
    output: list[JSONObject] = []
    prompt_length = len(messages_from_params(params))
    for message in rollout.messages[prompt_length:]:
        role = message.get("role")
        if role == "assistant":
            items = _turn_items(message)
            turn = next(turns, None)
            if turn is not None:
                items[-1].update(
                    prompt_token_ids=turn.prompt_ids,
                    generation_token_ids=turn.completion_ids,
                    generation_log_probs=turn.logprobs,
                )
            output.extend(items)
        elif role == "tool":
            output.append(
                {
                    "id": f"fco_{uuid.uuid4().hex}",
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": str(message.get("content") or ""),
                    "status": "completed",
                }
            )
        else:
            output.append(
                {"type": "message", "role": role, "content": str(message.get("content") or "")}
            )
    response: JSONObject = {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": time.time(),
        "model": str(params.get("model") or model),
        "output": output,
        "parallel_tool_calls": bool(params.get("parallel_tool_calls", True)),
        "tool_choice": "auto",
        "tools": list(params.get("tools") or []),
        "status": "completed" if status == "completed" else "incomplete",
        "metadata": {"hermes_async_status": status},
    }
    if status == "truncated":
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    return response


class GymAgent:
    """Answers ``/run`` requests with hermes_async rollouts.

    Args:
        tasks: ``body -> RolloutTask`` (sync or async; the whole ``/run`` body, so dataset
            fields reach it), or an environment.
        server: A token client or :class:`~hermes_async.inference.ServerPool`.

    The request's ``temperature``, ``top_p`` and ``max_output_tokens`` override the task's.
    """

    def __init__(self, tasks: TaskSource | object, server: Any) -> None:
        self.tasks = tasks
        self.server = server

    async def run(self, body: Mapping[str, Any]) -> JSONObject:
        """One ``/run``: the ``BaseVerifyResponse`` dict of one rollout of ``body``.

        A failed rollout is a response with reward 0 and its failure named, not an error.

        **Cancellation**: the rollout is cancelled and its sandbox released (bounded).
        """
        params = body.get("responses_create_params")
        if not isinstance(params, Mapping):
            raise UnsupportedRequestError(
                "a /run body needs a 'responses_create_params' object (a BaseRunRequest)"
            )
        _check_params(params)
        messages_from_params(params)  # an input it cannot read is refused before any rollout
        task = await make_task(self.tasks, dict(body))
        options = _options(task.options, params)
        try:
            scored = await run_rollout(
                self.server, task.messages, task.tools, setup=task.setup, options=options
            )
        except (TypeError, ValueError) as exc:  # the task itself is unusable: not the request's
            raise ConfigError(f"the rollout task is invalid: {exc}") from exc
        status = rollout_status(scored, max_turns=options.max_turns)
        request_model = {**params}
        return {
            **{k: v for k, v in body.items() if k != "response"},
            "responses_create_params": request_model,
            "response": render_response(scored, params, status=status),
            "reward": scored.reward,
            **failure_fields(scored.failure),
        }


def create_app(
    tasks: TaskSource | object,
    *,
    server: Any = None,
    model_url: str | None = None,
    token_endpoint: str = "vllm",
    vocab_size: int | None = None,
) -> FastAPI:
    """A FastAPI app serving ``POST /run`` and ``GET /health`` with a :class:`GymAgent`.

    ``tasks`` may be a ``"package.module:attribute"`` name. Without ``server``, a token client
    of ``model_url`` is opened for the app's lifetime (see :func:`open_token_client`). A
    request that cannot be honoured gets 422, a misconfigured agent 500, both without a
    traceback.
    """
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse
    except ImportError as exc:  # pragma: no cover - the extra brings it
        raise ImportError(
            f"the NeMo Gym agent server needs FastAPI: pip install 'hermes-async[nemo-gym]' ({exc})"
        ) from exc
    if server is None and model_url is None:
        raise ConfigError("create_app needs a token client (server=) or a model_url")
    if isinstance(tasks, str):
        tasks = load_tasks(tasks)
    if server is None:
        _client_class(token_endpoint)  # an unknown endpoint fails here, not at startup
    agent = GymAgent(tasks, server)

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if model_url is not None and server is None:
                agent.server = await stack.enter_async_context(
                    open_token_client(model_url, token_endpoint, vocab_size=vocab_size)
                )
            yield

    app = FastAPI(lifespan=lifespan)

    # Plain Starlette routes: the handlers read the raw request (no FastAPI parameter parsing).
    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def run(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"detail": "the /run body is not JSON"}, status_code=422)
        if not isinstance(body, dict):
            return JSONResponse({"detail": "the /run body must be a JSON object"}, status_code=422)
        try:
            return JSONResponse(await agent.run(body))
        except UnsupportedRequestError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=422)
        except ConfigError as exc:
            logger.error("/run: %s", exc)
            return JSONResponse({"detail": str(exc)}, status_code=500)

    app.add_route("/health", health, methods=["GET"])
    app.add_route("/run", run, methods=["POST"])
    return app


def _client_class(token_endpoint: str) -> Any:
    from hermes_async.inference.completions import VLLMCompletionsClient
    from hermes_async.inference.generate import SGLangGenerateClient, VLLMGenerateClient

    clients = {
        "vllm": VLLMGenerateClient,
        "sglang": SGLangGenerateClient,
        "completions": VLLMCompletionsClient,
    }
    if token_endpoint not in clients:
        raise ConfigError(
            f"unknown token_endpoint {token_endpoint!r}; one of: {', '.join(sorted(clients))}"
        )
    return clients[token_endpoint]


def open_token_client(
    model_url: str, token_endpoint: str = "vllm", *, vocab_size: int | None = None
) -> Any:
    """The token client of ``model_url``, not yet open; a trailing ``/v1`` is dropped.

    ``token_endpoint``: ``vllm`` (``/inference/v1/generate``), ``completions`` (vLLM's
    ``/v1/completions`` with ids) or ``sglang`` (``/generate``).
    """
    base = model_url.rstrip("/").removesuffix("/v1")
    return _client_class(token_endpoint)(base, vocab_size=vocab_size)
