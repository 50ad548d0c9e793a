"""What the bundled example environments (``TerminalTestEnv``, ``CodingEnv``) share."""

from __future__ import annotations

from typing import Any, TypeVar

from hermes_async.envs._atropos import APIServerConfig
from hermes_async.envs.config import HermesAgentEnvConfig

__all__ = ("CyclingItems", "example_configs")

C = TypeVar("C", bound=HermesAgentEnvConfig)

#: Defaults every example starts from: terminal + file tools in local sandboxes, no wandb.
EXAMPLE_DEFAULTS: dict[str, Any] = {
    "enabled_toolsets": ["terminal", "file"],
    "terminal_backend": "local",
    "max_token_length": 4096,
    "use_wandb": False,
}


def example_configs(config_cls: type[C], **fields: Any) -> tuple[C, list[APIServerConfig]]:
    """``(config, [server])``: the shared defaults overridden by ``fields``, a local vLLM server."""
    server = APIServerConfig(
        base_url="http://127.0.0.1:8000/v1",
        model_name="default",
        server_type="vllm",
        api_key="x",
        health_check=False,
    )
    return config_cls(**{**EXAMPLE_DEFAULTS, **fields}), [server]


class CyclingItems:
    """Mixin: ``get_next_item`` hands out ``self.train_items`` round-robin."""

    train_items: list[Any]
    _index: int = 0

    async def get_next_item(self) -> Any:
        """The next training item, cycling.

        **Cancellation**: nothing to clean up.
        """
        item = self.train_items[self._index % len(self.train_items)]
        self._index += 1
        return item
