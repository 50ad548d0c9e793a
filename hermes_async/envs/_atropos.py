"""The one place ``hermes_async`` imports atroposlib (and wandb, which comes with it).

A missing ``atropos`` extra is reported here, once, as an ``ImportError`` naming the extra to
install; every other module of :mod:`hermes_async.envs` imports these names from here.
:func:`atropos_safe` adjusts the server configs handed to atroposlib's own ``ServerManager``.
"""

from __future__ import annotations

import logging
from typing import Any


def _no_torch_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("PyTorch was not found")


# transformers says at import that PyTorch is missing; tokenizers are all this package uses, and
# a start-up that fails should print one line, not this one first.
logging.getLogger("transformers").addFilter(_no_torch_notice)

try:
    import wandb
    from atroposlib.envs.base import BaseEnv, BaseEnvConfig, EvalHandlingEnum, ScoredDataGroup
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "hermes_async.envs needs atroposlib and its dependencies: "
        f"pip install 'hermes-async[atropos]' ({exc})"
    ) from exc

__all__ = (
    "APIServerConfig",
    "BaseEnv",
    "BaseEnvConfig",
    "EvalHandlingEnum",
    "ScoredDataGroup",
    "ServerBaseline",
    "atropos_safe",
    "wandb",
)


def atropos_safe(server_configs: Any) -> Any:
    """Server configs for atroposlib's ``ServerManager`` that cannot hang or go online.

    ``self.server`` stays a working chat server for user code (an LLM judge).
    """

    def fix(config: Any) -> Any:
        if not isinstance(config, ServerBaseline):
            return config
        # A vllm/sglang server would load another HF tokenizer at construction.
        update: dict[str, Any] = {"server_type": "openai"}
        if isinstance(config, APIServerConfig):
            update["health_check"] = False  # its wait loops forever on a dead server
            if not config.api_key:
                update["api_key"] = "x"  # the OpenAI SDK refuses an empty key
        return config.model_copy(update=update)

    if isinstance(server_configs, list):
        return [fix(c) for c in server_configs]
    return fix(server_configs)
