"""The agent loop's result types (the loop itself builds on these).

``AgentResult`` and ``ToolError`` keep the reference's field names, types and defaults so that
reward functions written for the reference read them unchanged. Fields added here are additive
and default to empty values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AgentResult", "ToolError"]

#: The reference truncates the raw argument string kept on a ToolError to this many characters.
TOOL_ERROR_ARGUMENTS_MAX_CHARS = 200


@dataclass(slots=True)
class ToolError:
    """One tool call that failed, as recorded on :class:`AgentResult`.

    Attributes:
        turn: 1-based turn number on which the call was made.
        tool_name: The tool the model called (as the model spelled it).
        arguments: The raw argument string, truncated to 200 characters.
        error: A short description of what went wrong.
        tool_result: The exact string the model was shown for this call.
    """

    turn: int
    tool_name: str
    arguments: str
    error: str
    tool_result: str

    def __post_init__(self) -> None:
        if len(self.arguments) > TOOL_ERROR_ARGUMENTS_MAX_CHARS:
            self.arguments = self.arguments[:TOOL_ERROR_ARGUMENTS_MAX_CHARS]


@dataclass(slots=True)
class AgentResult:
    """What one rollout of the agent loop produced.

    ``messages`` is the very list passed to ``HermesAgentLoop.run`` (mutated in place), as in the
    reference. There is no ``final_response`` field: verifiers scan ``messages``.

    Attributes:
        messages: Full OpenAI-format history.
        managed_state: Phase 2 token state, ``{"nodes": [node]}`` where the node has ``tokens``,
            ``masked_tokens`` and ``logprobs`` aligned one to one; ``None`` in Phase 1.
        turns_used: Number of model calls made, including a failed one.
        finished_naturally: True iff the model ended with a turn that has no tool calls.
        reasoning_per_turn: One entry per successful model response (``None`` if it had none).
        tool_errors: Errors collected during the loop.
        error: Why the loop stopped early (model server failure, deadline, cancellation), if it did.
        template_mismatches: Number of turns where the decoded trajectory differed from the chat
            template rendering of the messages (Phase 2); never hidden, never silently trained on.
        timings: Per-turn timing records (time to first token, generation, tools, limiter waits).
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
