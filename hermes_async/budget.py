"""The former import path of the tool-result budget: re-exports :mod:`hermes_async.agent.budget`.

The code lives in :mod:`hermes_async.agent.budget`.
"""

from __future__ import annotations

from hermes_async.agent.budget import (
    DEFAULT_BUDGET,
    DEFAULT_PREVIEW_SIZE_CHARS,
    DEFAULT_RESULT_SIZE_CHARS,
    DEFAULT_TURN_BUDGET_CHARS,
    PERSIST_TIMEOUT_SECONDS,
    PERSISTED_OUTPUT_TAG,
    PINNED_THRESHOLDS,
    BudgetConfig,
    content_for_file,
    enforce_turn_budget,
    maybe_persist_tool_result,
    next_to_persist,
    render_preview,
    resolve_threshold,
    result_file_name,
)

__all__ = (
    "DEFAULT_BUDGET",
    "DEFAULT_PREVIEW_SIZE_CHARS",
    "DEFAULT_RESULT_SIZE_CHARS",
    "DEFAULT_TURN_BUDGET_CHARS",
    "PERSISTED_OUTPUT_TAG",
    "PERSIST_TIMEOUT_SECONDS",
    "PINNED_THRESHOLDS",
    "BudgetConfig",
    "content_for_file",
    "enforce_turn_budget",
    "maybe_persist_tool_result",
    "next_to_persist",
    "render_preview",
    "resolve_threshold",
    "result_file_name",
)
