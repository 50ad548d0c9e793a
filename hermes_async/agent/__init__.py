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

Layout: ``loop`` (orchestration, deadlines, cancellation), ``_chat_turn`` / ``_token_turn``
(the two turn strategies), ``_tool_runner`` (one turn's calls), ``_transcript`` (pure message
and token bookkeeping), ``result``, ``budget``, ``context``, ``rollout``, ``scoring`` (pure rows).
"""

from __future__ import annotations

from hermes_async._exports import fixup_module_metadata
from hermes_async.agent._sampling import SamplingHook
from hermes_async.agent._segments import TemplateCheck
from hermes_async.agent.budget import BudgetConfig
from hermes_async.agent.context import ToolContext
from hermes_async.agent.loop import AgentOptions, ChatServer, HermesAgentLoop
from hermes_async.agent.result import AgentResult, ToolError
from hermes_async.agent.rollout import (
    Reward,
    ScoredGroup,
    ScoredRollout,
    Tools,
    run_group,
    run_rollout,
)

__all__ = (
    "AgentOptions",
    "AgentResult",
    "BudgetConfig",
    "ChatServer",
    "HermesAgentLoop",
    "Reward",
    "SamplingHook",
    "ScoredGroup",
    "ScoredRollout",
    "TemplateCheck",
    "ToolContext",
    "ToolError",
    "Tools",
    "run_group",
    "run_rollout",
)

fixup_module_metadata(__name__, globals())
