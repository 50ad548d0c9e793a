"""The reference's import path of the agent loop: re-exports from :mod:`hermes_async.agent`."""

from __future__ import annotations

from hermes_async.agent.loop import ChatServer, HermesAgentLoop, resize_tool_pool
from hermes_async.agent.options import DEFAULT_TOOL_TIMEOUT_SECONDS, AgentOptions
from hermes_async.agent.result import (
    TOOL_ERROR_ARGUMENTS_MAX_CHARS,
    TOOL_ERROR_RESULT_MAX_CHARS,
    AgentResult,
    ToolError,
)

__all__ = (
    "DEFAULT_TOOL_TIMEOUT_SECONDS",
    "TOOL_ERROR_ARGUMENTS_MAX_CHARS",
    "TOOL_ERROR_RESULT_MAX_CHARS",
    "AgentOptions",
    "AgentResult",
    "ChatServer",
    "HermesAgentLoop",
    "ToolError",
    "resize_tool_pool",
)
