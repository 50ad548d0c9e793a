"""The rollout core: the agent loop, reward access to its sandbox, and scored rollouts.

Everything a trainer needs to turn prompts into training rows, on asyncio or trio, with no
atroposlib (``hermes_async.envs`` is the Atropos adapter on top). Start at :func:`run_group`;
:class:`HermesAgentLoop` is the loop, :class:`AgentOptions` its options. Layout:
docs/architecture.md.
"""

from __future__ import annotations

from hermes_async._exports import fixup_module_metadata
from hermes_async.agent._sampling import SamplingHook
from hermes_async.agent._segments import TemplateCheck
from hermes_async.agent.budget import BudgetConfig
from hermes_async.agent.context import ToolContext
from hermes_async.agent.failures import FAILURE_CATEGORIES, FailureCategory, RolloutFailure
from hermes_async.agent.loop import ChatServer, HermesAgentLoop, RunAbort
from hermes_async.agent.options import AgentOptions
from hermes_async.agent.result import AgentResult, ToolError
from hermes_async.agent.rollout import (
    DEFAULT_FAILURE_POLICY,
    FailurePolicy,
    GroupOutcome,
    Reward,
    RolloutSetup,
    RolloutTask,
    ScoredGroup,
    ScoredRollout,
    TaskSource,
    Tools,
    run_group,
    run_rollout,
)
from hermes_async.agent.versions import (
    PauseProbe,
    PolledPause,
    PolledVersion,
    Staleness,
    StalenessReport,
    VersionReadError,
    VersionSource,
)

__all__ = (
    "DEFAULT_FAILURE_POLICY",
    "FAILURE_CATEGORIES",
    "AgentOptions",
    "AgentResult",
    "BudgetConfig",
    "ChatServer",
    "FailureCategory",
    "FailurePolicy",
    "GroupOutcome",
    "HermesAgentLoop",
    "PauseProbe",
    "PolledPause",
    "PolledVersion",
    "Reward",
    "RolloutFailure",
    "RolloutSetup",
    "RolloutTask",
    "RunAbort",
    "SamplingHook",
    "ScoredGroup",
    "ScoredRollout",
    "Staleness",
    "StalenessReport",
    "TaskSource",
    "TemplateCheck",
    "ToolContext",
    "ToolError",
    "Tools",
    "VersionReadError",
    "VersionSource",
    "run_group",
    "run_rollout",
)

fixup_module_metadata(__name__, globals())
