"""What one rollout of the agent loop produced: :class:`AgentResult` and :class:`ToolError`.

Both keep the reference's field names, types and defaults (code written against the reference
reads them unchanged); fields added here are additive and default to empty values.
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
        turn: 1-based turn number on which the call was made.
        tool_name: The tool the model called (as the model spelled it).
        arguments: The raw argument string, truncated to 200 characters.
        error: A short description of what went wrong.
        tool_result: The exact string the model was shown for this call.
        category: ``"model"`` when the model wrote the call wrong (unknown tool, arguments
            that do not decode or validate, a call cut off or malformed), ``"tool"`` when a
            well-formed call failed (non-zero exit, timeout, missing file). Not in the
            reference; see :mod:`hermes_async.agent.failures`.
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

    ``messages`` is the very list passed to :meth:`HermesAgentLoop.run
    <hermes_async.agent.loop.HermesAgentLoop.run>` (mutated in place), as in the reference.
    There is no ``final_response`` field: verifiers scan ``messages``.

    Attributes:
        messages: Full OpenAI-format history.
        managed_state: Phase 2 token state, ``{"nodes": [node]}`` where the node has ``tokens``,
            ``masked_tokens`` and ``logprobs`` aligned one to one; ``None`` in Phase 1.
        turns_used: Number of model calls made, including a failed one.
        finished_naturally: True iff the model ended with a turn that has no tool calls.
        reasoning_per_turn: One entry per successful model response (``None`` if it had none).
        tool_errors: Errors collected during the loop.
        error: Why the loop stopped early (model server failure, deadline), if it did.
        template_mismatches: Phase 2: divergences between the decoded trajectory and the chat
            template's rendering of the messages, each counted once, at the turn where it
            appeared (a final answer cut by ``max_tokens`` is not one); reported, never hidden.
        timings: One record per turn: ``turn``, ``time_to_first_token``, ``generation_seconds``,
            ``tool_seconds``, ``model_wait_seconds`` and ``tool:<index>:<name>`` durations.
        template_checks: Phase 2: every divergence found, with its turn, reason (``history``,
            ``completion``, or the uncounted ``length``) and the two texts where they part
            (:class:`~hermes_async.agent.TemplateCheck`).
        failure: Why the loop ended early, categorized (``infra``: the model server or the
            sandbox failed; ``agent_timeout``: a deadline; ``model``: the context is full), if
            it did; :attr:`error` is its message. Malformed calls and failed tools do not end
            the loop: they are :attr:`tool_errors` with their own ``category``.
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
