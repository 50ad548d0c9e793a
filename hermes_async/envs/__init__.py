"""Atropos environments: :class:`HermesAgentBaseEnv` and example environments.

A thin adapter mapping atroposlib's config, entry points, evaluation and wandb onto
:mod:`hermes_async.agent`'s ``run_group``. Needs the ``atropos`` extra (asyncio only); names
load on first use, and a missing extra is an ``ImportError`` naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes_async._lazy import lazy_getattr

if TYPE_CHECKING:
    from hermes_async.envs.base import EvalReport, HermesAgentBaseEnv, RolloutSummary
    from hermes_async.envs.coding import CodingEnv, CodingEnvConfig
    from hermes_async.envs.config import HermesAgentEnvConfig
    from hermes_async.envs.terminal_test import TerminalTestEnv, TerminalTestEnvConfig
    from hermes_async.errors import AsyncBackendError

__all__ = (
    "AsyncBackendError",
    "CodingEnv",
    "CodingEnvConfig",
    "EvalReport",
    "HermesAgentBaseEnv",
    "HermesAgentEnvConfig",
    "RolloutSummary",
    "TerminalTestEnv",
    "TerminalTestEnvConfig",
)

# Where each name lives (AsyncBackendError is hermes_async.errors', re-exported by base).
_WHERE = {
    "AsyncBackendError": "base",
    "EvalReport": "base",
    "HermesAgentBaseEnv": "base",
    "HermesAgentEnvConfig": "config",
    "RolloutSummary": "base",
    "CodingEnv": "coding",
    "CodingEnvConfig": "coding",
    "TerminalTestEnv": "terminal_test",
    "TerminalTestEnvConfig": "terminal_test",
}


__getattr__ = lazy_getattr(
    "hermes_async.envs",
    {name: f"hermes_async.envs.{module}" for name, module in _WHERE.items()},
    globals(),
)
