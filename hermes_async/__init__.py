"""hermes_async: a natively async (anyio) rollout layer for agentic RL.

The public API is re-exported here; everything else lives in its own module
(``hermes_async.agent_loop``, ``hermes_async.tools.registry``, ...) or in ``_private`` modules
that are not API.
"""

from __future__ import annotations

from hermes_async.agent_loop import AgentResult, ToolError
from hermes_async.errors import (
    ConfigError,
    HermesAsyncError,
    InferenceError,
    LimitError,
    ParseError,
    SandboxError,
    ToolArgumentsError,
    ToolExecutionError,
    ToolTimeoutError,
)
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.limits import (
    LagMonitor,
    LagStatistics,
    LimiterStatistics,
    Limits,
    NamedLimiter,
    open_lag_monitor,
)
from hermes_async.tools.registry import (
    Tool,
    ToolDefinitions,
    ToolOutcome,
    ToolRegistry,
    ToolRuntime,
    builtin_registry,
    dispatch,
    get_tool_definitions,
)
from hermes_async.tools.toolsets import (
    list_distributions,
    list_toolsets,
    sample_toolsets_from_distribution,
)

__version__ = "0.1.0"

__all__ = [
    "JSON",
    "AgentResult",
    "ConfigError",
    "HermesAsyncError",
    "InferenceError",
    "JSONObject",
    "LagMonitor",
    "LagStatistics",
    "LimitError",
    "LimiterStatistics",
    "Limits",
    "NamedLimiter",
    "ParseError",
    "SandboxError",
    "Tool",
    "ToolArgumentsError",
    "ToolDefinitions",
    "ToolError",
    "ToolExecutionError",
    "ToolOutcome",
    "ToolRegistry",
    "ToolRuntime",
    "ToolTimeoutError",
    "__version__",
    "builtin_registry",
    "dispatch",
    "get_tool_definitions",
    "list_distributions",
    "list_toolsets",
    "open_lag_monitor",
    "sample_toolsets_from_distribution",
]
