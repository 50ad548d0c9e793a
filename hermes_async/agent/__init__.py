"""The rollout core: the agent loop, reward access to its sandbox, and scored rollouts.

Everything a trainer needs to turn prompts into training rows, on asyncio or trio, with no
atroposlib anywhere (``hermes_async.envs`` is the Atropos adapter on top of this):

* :func:`run_group` / :func:`run_rollout` — loop -> ``reward(result, ctx)`` on the rollout's own
  sandbox -> bounded release -> a :class:`ScoredRollout` (messages, tokens, masks, logprobs,
  reward, timings, errors); :meth:`ScoredGroup.to_scored_data_group` gives Atropos' dict shape.
* :class:`HermesAgentLoop` — the multi-turn tool-calling loop itself (Phase 1 chat servers,
  Phase 2 token servers with early tool dispatch); :class:`AgentOptions` its knobs.
* :class:`ToolContext` — reward functions run commands and read files in the rollout's sandbox.
* :class:`BudgetConfig` — oversized tool results are saved into the sandbox, the model sees a
  preview.
* :class:`RolloutFailure` — every rollout's categorized failure (``model``, ``tool``,
  ``agent_timeout``, ``infra``, ``verifier``, ``cancelled``); :class:`FailurePolicy` — what a
  group does with them (retry on a fresh sandbox, mask, zero).
* Asynchronous RL (:mod:`hermes_async.agent.versions`): aborted generations resume exactly
  (``AgentOptions.max_resumes``), every segment carries the policy version that sampled it
  (``AgentOptions.version_source``), paused servers are waited for
  (``AgentOptions.pause_probe``), and :class:`Staleness` drops or masks groups that are too old.

Layout: ``options`` (every loop option), ``loop`` (orchestration, deadlines, cancellation), ``_chat_turn`` / ``_token_turn``
(the two turn strategies), ``_tool_runner`` (one turn's calls), ``_transcript`` (pure message
and token bookkeeping), ``result``, ``failures`` (the taxonomy, pure), ``_watch`` (noticing a
lost sandbox), ``budget``, ``context``, ``rollout``, ``scoring`` (pure rows), ``versions`` (versions, pauses,
staleness).
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
