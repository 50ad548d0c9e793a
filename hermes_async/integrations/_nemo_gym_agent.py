"""The hermes_async agent as a NeMo Gym server class, for Gym's own launcher (``ng_run``).

It subclasses nemo-gym's ``SimpleResponsesAPIAgent``, so it needs the ``nemo-gym`` extra and
is imported through :mod:`hermes_async.integrations.nemo_gym` only when used. ``/run`` is
:class:`~hermes_async.integrations.nemo_gym.GymAgent`'s. Wiring: docs/trainers/nemo_gym.md.
"""

# No postponed annotations here: FastAPI reads the route handlers' annotations at runtime.
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal

from hermes_async.errors import ConfigError
from hermes_async.integrations._gym_run import (
    GymAgent,
    UnsupportedRequestError,
    open_token_client,
)
from hermes_async.integrations._rollouts import load_tasks

try:
    from fastapi import Body, FastAPI, HTTPException, Request
    from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
    from nemo_gym.base_responses_api_agent import (
        BaseResponsesAPIAgentConfig,
        SimpleResponsesAPIAgent,
    )
    from nemo_gym.config_types import ModelServerRef
    from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
    from pydantic import PrivateAttr
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        f"HermesGymAgent needs nemo-gym: pip install 'hermes-async[nemo-gym]' ({exc})"
    ) from exc

__all__ = ("HermesGymAgent", "HermesGymAgentConfig")

_BODY = Body()  # FastAPI: the parameter is the JSON body


class HermesGymAgentConfig(BaseResponsesAPIAgentConfig):  # type: ignore[misc]
    """The agent's entry in Gym's config (beside Gym's own server fields).

    Attributes:
        tasks: The task source, ``"package.module:attribute"``.
        model_url: The model server's base URL (vLLM as NeMo RL exposes it, or SGLang).
        model_server: Instead of ``model_url``: a Gym model server whose ``base_url`` is used.
        token_endpoint: ``vllm``, ``completions`` or ``sglang``.
        vocab_size: The tokenizer's size (ids outside it are refused).
    """

    tasks: str
    model_url: str | None = None
    model_server: ModelServerRef | None = None
    token_endpoint: Literal["vllm", "completions", "sglang"] = "vllm"
    vocab_size: int | None = None


class HermesGymAgent(SimpleResponsesAPIAgent):  # type: ignore[misc]
    """hermes_async rollouts behind Gym's agent server (``/run``; ``/v1/responses`` too).

    A Gym ``app.py`` for it: ``HermesGymAgent.run_webserver()`` under ``__main__``.
    """

    config: HermesGymAgentConfig
    _hermes: GymAgent | None = PrivateAttr(default=None)

    def model_base_url(self) -> str:
        """``model_url``, or the Gym model server's ``base_url``.

        Raises:
            ConfigError: Neither is set, or the Gym model server has no ``base_url``.
        """
        if self.config.model_url:
            return str(self.config.model_url)
        if self.config.model_server is None:
            raise ConfigError(
                f"agent {self.config.name!r}: set model_url (the vLLM server) or model_server"
            )
        name = self.config.model_server.name
        entry = _server_entry(self.server_client.global_config_dict, name)
        base_url: Any = entry.get("base_url") if entry is not None else None
        if _is_sequence(base_url):  # several vLLM servers: the first (a list or a ListConfig)
            base_url = next(iter(base_url), None)
        if not isinstance(base_url, str) or not base_url:
            raise ConfigError(
                f"agent {self.config.name!r}: model server {name!r} has no base_url in Gym's "
                "config; set model_url to the vLLM server instead"
            )
        return base_url

    def setup_webserver(self) -> FastAPI:
        """Gym's app, with the token client open for the app's lifetime."""
        app: FastAPI = super().setup_webserver()
        self._hermes = hermes = GymAgent(load_tasks(self.config.tasks), None)
        inner = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(application: Any) -> AsyncIterator[Any]:
            async with AsyncExitStack() as stack:
                hermes.server = await stack.enter_async_context(
                    open_token_client(
                        self.model_base_url(),
                        self.config.token_endpoint,
                        vocab_size=self.config.vocab_size,
                    )
                )
                async with inner(application) as state:
                    yield state

        app.router.lifespan_context = lifespan
        return app

    async def _answer(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if self._hermes is None:
            raise HTTPException(500, "the agent's app was not set up (setup_webserver)")
        try:
            return await self._hermes.run(body)
        except UnsupportedRequestError as exc:
            raise HTTPException(422, str(exc)) from None
        except ConfigError as exc:
            raise HTTPException(500, str(exc)) from None

    async def run(self, request: Request, body: BaseRunRequest = _BODY) -> BaseVerifyResponse:
        """One rollout of the request (its dataset fields reach the task source).

        **Cancellation**: the rollout is cancelled and its sandbox released (bounded).
        """
        raw = await request.json()
        return BaseVerifyResponse.model_validate(await self._answer(raw))

    async def responses(
        self, body: NeMoGymResponseCreateParamsNonStreaming = _BODY
    ) -> NeMoGymResponse:
        """One rollout of ``body``; its response without the reward.

        **Cancellation**: as for :meth:`run`.
        """
        answer = await self._answer({"responses_create_params": dict(body)})
        return NeMoGymResponse.model_validate(answer["response"])


def _is_sequence(value: object) -> bool:
    return hasattr(value, "__iter__") and not isinstance(value, str | bytes | Mapping)


def _server_entry(config: Any, name: str) -> Mapping[str, Any] | None:
    """The config of server instance ``name`` (``{name: {kind: {type: {...}}}}``)."""
    instance = config.get(name) if config is not None else None
    if instance is None:
        return None
    for servers in instance.values():
        for entry in servers.values():
            return entry  # type: ignore[no-any-return]
    return None
