"""What one rollout of the agent loop produced: :class:`AgentResult` and :class:`ToolError`.

Both keep the reference's field names, types and defaults; added fields default to empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hermes_async.agent._segments import TemplateCheck
from hermes_async.agent.failures import FailureCategory, RolloutFailure

__all__ = (
    "TOOL_ERROR_ARGUMENTS_MAX_CHARS",
    "TOOL_ERROR_RESULT_MAX_CHARS",
    "AgentResult",
    "ToolError",
)

#: The reference truncates the raw argument string kept on a ToolError to this many characters.
TOOL_ERROR_ARGUMENTS_MAX_CHARS = 200
#: ... and the tool result kept on a ToolError to this many.
TOOL_ERROR_RESULT_MAX_CHARS = 500


@dataclass(slots=True)
class ToolError:
    """One tool call that failed, as recorded on :class:`AgentResult`.

    Attributes:
        turn: 1-based.
        tool_name: As the model spelled it.
        arguments: The raw argument string, truncated to 200 characters.
        tool_result: The exact string the model was shown.
        category: ``"model"`` when the model wrote the call wrong (unknown tool, bad or cut
            arguments), ``"tool"`` when a well-formed call failed. Not in the reference.
    """

    turn: int
    tool_name: str
    arguments: str
    error: str
    tool_result: str
    category: FailureCategory = "tool"

    def __post_init__(self) -> None:
        if len(self.arguments) > TOOL_ERROR_ARGUMENTS_MAX_CHARS:
            self.arguments = self.arguments[:TOOL_ERROR_ARGUMENTS_MAX_CHARS]


@dataclass(slots=True)
class AgentResult:
    """What one rollout of the agent loop produced.

    ``messages`` is the very list passed to ``HermesAgentLoop.run``, mutated in place, as in
    the reference. There is no ``final_response``: verifiers scan ``messages``.

    Attributes:
        managed_state: Phase 2 tokens, ``{"nodes": [node]}`` with ``tokens``,
            ``masked_tokens`` and ``logprobs`` aligned; ``None`` in Phase 1.
        turns_used: Model calls made, a failed one included.
        finished_naturally: The model ended with a turn that has no tool calls.
        reasoning_per_turn: One entry per successful model response.
        error: Why the loop stopped early, if it did.
        template_mismatches: Phase 2: divergences between the trajectory and the template's
            rendering, each counted once at its turn; reported, never hidden.
        timings: One record per turn (time to first token, generation, tools, waits).
        template_checks: Phase 2: every divergence, with its turn, reason and texts.
        failure: Why the loop ended early, categorized (``infra``, ``agent_timeout``,
            ``model``); failed tools do not end the loop, they are :attr:`tool_errors`.
    """

    messages: list[dict[str, Any]]
    managed_state: dict[str, Any] | None = None
    turns_used: int = 0
    finished_naturally: bool = False
    reasoning_per_turn: list[str | None] = field(default_factory=list)
    tool_errors: list[ToolError] = field(default_factory=list)
    error: str | None = None
    template_mismatches: int = 0
    timings: list[dict[str, float]] = field(default_factory=list)
    template_checks: list[TemplateCheck] = field(default_factory=list)
    failure: RolloutFailure | None = None
