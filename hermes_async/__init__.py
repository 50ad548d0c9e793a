"""hermes_async: a natively async (anyio) rollout layer for agentic RL.

The public API is re-exported here; everything else lives in its own module
(``hermes_async.agent``, ``hermes_async.tools.registry``, ...) or in ``_private`` modules that are
not API. ``hermes_async.agent`` is the rollout core (the loop, ``ToolContext``, ``run_group``);
``hermes_async.envs`` the atroposlib adapter on top of it.
"""

from __future__ import annotations

from hermes_async._redact import install_log_redaction as _install_log_redaction
from hermes_async.agent import (
    AgentOptions,
    AgentResult,
    BudgetConfig,
    ChatServer,
    FailureCategory,
    FailurePolicy,
    HermesAgentLoop,
    Reward,
    RolloutFailure,
    ScoredGroup,
    ScoredRollout,
    ToolContext,
    ToolError,
    run_group,
    run_rollout,
)
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
from hermes_async.gc_tuning import gc_tuned_for_rollouts, tune_gc_for_rollouts
from hermes_async.inference import (
    AtroposGenerateClient,
    ChatClient,
    HTTPOptions,
    ModelServerError,
    RetryPolicy,
    SamplingParams,
    SGLangGenerateClient,
    TokenClient,
    TokenDelta,
    Tokenizer,
    VLLMGenerateClient,
    load_tokenizer,
)
from hermes_async.inference.trajectory import Trajectory
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.limits import (
    LagMonitor,
    LagStatistics,
    LimiterStatistics,
    Limits,
    NamedLimiter,
    open_lag_monitor,
)
from hermes_async.parsers import ParseResult, ToolCallParser, get_parser, list_parsers
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
from hermes_async.tools.sandbox import (
    ExecResult,
    LocalSandbox,
    Sandbox,
    SandboxManager,
    local_factory,
    open_sandbox_manager,
    use_sandbox_manager,
)
from hermes_async.tools.sandbox.backends import make_backend_factory
from hermes_async.tools.toolsets import (
    list_distributions,
    list_toolsets,
    sample_toolsets_from_distribution,
)

__version__ = "0.1.0"

# Every log record of a hermes_async logger is redacted of credentials (hermes_async._redact).
_install_log_redaction()

__all__ = (
    "JSON",
    "AgentOptions",
    "AgentResult",
    "AtroposGenerateClient",
    "BudgetConfig",
    "ChatClient",
    "ChatServer",
    "ConfigError",
    "ExecResult",
    "FailureCategory",
    "FailurePolicy",
    "HTTPOptions",
    "HermesAgentLoop",
    "HermesAsyncError",
    "InferenceError",
    "JSONObject",
    "LagMonitor",
    "LagStatistics",
    "LimitError",
    "LimiterStatistics",
    "Limits",
    "LocalSandbox",
    "ModelServerError",
    "NamedLimiter",
    "ParseError",
    "ParseResult",
    "RetryPolicy",
    "Reward",
    "RolloutFailure",
    "SGLangGenerateClient",
    "SamplingParams",
    "Sandbox",
    "SandboxError",
    "SandboxManager",
    "ScoredGroup",
    "ScoredRollout",
    "TokenClient",
    "TokenDelta",
    "Tokenizer",
    "Tool",
    "ToolArgumentsError",
    "ToolCallParser",
    "ToolContext",
    "ToolDefinitions",
    "ToolError",
    "ToolExecutionError",
    "ToolOutcome",
    "ToolRegistry",
    "ToolRuntime",
    "ToolTimeoutError",
    "Trajectory",
    "VLLMGenerateClient",
    "__version__",
    "builtin_registry",
    "dispatch",
    "gc_tuned_for_rollouts",
    "get_parser",
    "get_tool_definitions",
    "list_distributions",
    "list_parsers",
    "list_toolsets",
    "load_tokenizer",
    "local_factory",
    "make_backend_factory",
    "open_lag_monitor",
    "open_sandbox_manager",
    "run_group",
    "run_rollout",
    "sample_toolsets_from_distribution",
    "tune_gc_for_rollouts",
    "use_sandbox_manager",
)
