"""A scripted model on loopback (or in-process), ready for a client or an environment.

:func:`open_scripted_endpoint` serves a :class:`~hermes_async.testing.ScriptedModelServer` and
yields its URL, the server and an atroposlib server config pointing at it. The pytest plugin's
``hermes_model_server`` fixture and ``hermes-async eval --oracle`` use it. Importing this is
cheap; the server is imported when one is opened.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes_async.inference.tokenizer import Tokenizer
    from hermes_async.testing.scripted_server import PolicyRequest, ScriptedModelServer

__all__ = ("ScriptedEndpoint", "open_scripted_endpoint")


@dataclass(frozen=True, slots=True)
class ScriptedEndpoint:
    """A running scripted model server.

    Chat clients add ``/v1`` to ``base_url``; ``transport`` is ``None`` on loopback.
    """

    base_url: str
    server: ScriptedModelServer
    transport: Any = None

    @property
    def openai_url(self) -> str:
        """The URL an OpenAI-style client (and atroposlib's ``base_url``) wants."""
        return self.base_url + "/v1"

    def server_config(self, server_type: str = "vllm") -> Any:
        """An atroposlib ``APIServerConfig`` for this server (needs the ``atropos`` extra)."""
        try:
            from atroposlib.envs.server_handling.server_baseline import APIServerConfig
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                f"server_config() needs atroposlib: pip install 'hermes-async[atropos]' ({exc})"
            ) from exc

        return APIServerConfig(
            base_url=self.openai_url,
            server_type=server_type,
            model_name="scripted",
            api_key="x",
            health_check=False,
        )


@asynccontextmanager
async def open_scripted_endpoint(
    policy: Callable[[PolicyRequest], str],
    *,
    seed: int = 0,
    loopback: bool = True,
    tokenizer: Tokenizer | None = None,
) -> AsyncIterator[ScriptedEndpoint]:
    """Serve a scripted model following ``policy`` (randomness keyed by the prompt).

    ``loopback`` serves real HTTP on 127.0.0.1 (the ``testing`` extra); else in-process. The
    ``tokenizer`` must be the client's (default: the built-in one).

    **Cancellation**: the server is shut down.
    """
    from hermes_async.testing.http import open_app_endpoint
    from hermes_async.testing.scripted_server import ScriptedModelServer

    server = ScriptedModelServer(policy, seed=seed, rng_key="prompt", tokenizer=tokenizer)
    async with open_app_endpoint(server, loopback=loopback) as (base_url, transport):
        yield ScriptedEndpoint(base_url, server, transport)
