"""AgentOptions: every option of the agent loop, declared and documented once.

The loop, its turn strategies, :func:`~hermes_async.agent.rollout.run_rollout` and
:func:`~hermes_async.agent.rollout.run_group` take this value whole. Adding an option is one
field here and one line where it is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hermes_async.agent._reasoning import check_reasoning
from hermes_async.agent._sampling import SamplingHook
from hermes_async.agent.budget import BudgetConfig
from hermes_async.agent.versions import PauseProbe, VersionSource
from hermes_async.inference.generate import SamplingParams

__all__ = ("DEFAULT_TOOL_TIMEOUT_SECONDS", "AgentOptions")

#: Deadline of one tool call, in the loop and through ToolContext: the reference ToolContext's
#: ``future.result(timeout=300)`` (its loop had none), above the terminal tool's own timeout.
DEFAULT_TOOL_TIMEOUT_SECONDS = 300.0


def _check_timeout(name: str, value: float | None) -> None:
    if value is not None and not value > 0:  # also rejects NaN
        raise ValueError(f"{name} must be > 0 seconds or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Everything the agent loop takes beyond the server, the tools and the plumbing.

    Defaults are the reference's where it had the knob. In Phase 2 a value given explicitly
    wins over a default (:mod:`hermes_async.agent._sampling`).

    Attributes:
        max_turns: Maximum model calls per rollout.
        temperature: ``None``: not given (Phase 1 sends 1.0; Phase 2 uses
            ``sampling.temperature``).
        max_tokens: Per-turn completion cap (``None``: the server's default).
        extra_body: Extra request fields for every chat request (Phase 1) or token request
            (Phase 2, checked against the server when the loop is built).
        budget: Tool-result budget (``None``: 100,000 chars per result, 200,000 per turn).
        tool_timeout: Per-tool-call deadline; the model is told the call timed out.
        turn_timeout: Deadline for one model call (Phase 1) or generation (Phase 2).
        rollout_timeout: Deadline for the whole rollout; the partial result has ``error`` set.
        parallel_tool_calls: Run one turn's calls concurrently (default: in order).
        max_tool_calls_per_turn: Tool calls of one turn that run; each one past it gets an
            error result.
        tool_call_parser: Phase 2 parser name (the Phase 1 fallback always uses ``hermes``).
        early_dispatch: Phase 2: start each call the moment it is sealed.
        sampling: Phase 2 sampling parameters.
        split_reasoning: Phase 2: move a leading ``<think>`` block into ``reasoning_content``.
        terminal_timeout: Default ``terminal`` command timeout (``None``: the run's
            ``use_tool_defaults``, else ``TERMINAL_TIMEOUT``, else 180 s).
        skills_dir: Where the ``skills`` tools read (``None``: ``~/.hermes/skills``, else the
            built-in examples).
        thinking_mode: Ask the model to reason (atroposlib's ``thinking_mode``).
        reasoning_effort: ``none``, ``minimal``, ``low``, ``medium``, ``high`` or ``xhigh``.
        max_reasoning_tokens: A reasoning token budget (Phase 1 only); how the three reach
            each server: :mod:`hermes_async.agent._reasoning`.
        sampling_hook: Phase 2: ``hook(turn, messages, params) -> SamplingParams | None``
            before each generation; a result replaces that turn's parameters.
        end_of_turn: Phase 2: the tokens (ids or texts) that end a model turn; ``None``: the
            tokenizer's ``end_of_turn_ids``, else its ``eos_token_id``.
        max_resumes: Phase 2: resumes per turn after the server aborted it; the resumed
            request asks for the remaining budget. ``0``: an abort fails the rollout.
        version_source: Phase 2: the trainer's policy version (``() -> int``, sync or async),
            read once per request and carried by every completion segment.
        pause_probe: Phase 2: ``() -> bool`` (sync or async), is the server paused? A resume
            then waits, and a stream cut during a pause is resumed instead of failing.
        pause_timeout: Longest wait for a paused server, per pause.
        incremental_rendering: Phase 2: render only each turn's new messages where the
            template allows it (:mod:`hermes_async.inference.rendering`).

    Raises:
        ValueError: A count < 1, a timeout that is not positive, or a bad reasoning option.
    """

    max_turns: int = 30
    temperature: float | None = None
    max_tokens: int | None = None
    extra_body: Mapping[str, Any] | None = None
    budget: BudgetConfig | None = None
    tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT_SECONDS
    turn_timeout: float | None = None
    rollout_timeout: float | None = None
    parallel_tool_calls: bool = False
    # Models rarely write ten calls in a turn; 2,000 terminal calls in order took 22 s.
    max_tool_calls_per_turn: int = 64
    tool_call_parser: str = "hermes"
    early_dispatch: bool = True
    sampling: SamplingParams | None = None
    split_reasoning: bool = True
    terminal_timeout: float | None = None
    skills_dir: str | None = None
    thinking_mode: bool = False
    reasoning_effort: str | None = None
    max_reasoning_tokens: int | None = None
    sampling_hook: SamplingHook | None = None
    end_of_turn: tuple[int | str, ...] | None = None
    max_resumes: int = 8
    version_source: VersionSource | None = None
    pause_probe: PauseProbe | None = None
    pause_timeout: float | None = 600.0  # a weight update takes seconds to minutes
    incremental_rendering: bool = True

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_resumes", "max_tool_calls_per_turn"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        for name in ("max_turns", "max_tool_calls_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_resumes < 0:
            raise ValueError(f"max_resumes must be >= 0, got {self.max_resumes!r}")
        for name in ("temperature", "max_tokens"):  # None: not given
            if (value := getattr(self, name)) is not None:
                SamplingParams.check(name, value, owner="AgentOptions")
        for name in (
            "pause_timeout",
            "tool_timeout",
            "turn_timeout",
            "rollout_timeout",
            "terminal_timeout",
        ):
            _check_timeout(name, getattr(self, name))
        check_reasoning(self.reasoning_effort, self.max_reasoning_tokens)
