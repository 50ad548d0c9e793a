"""hermes_async: a natively async (anyio) rollout layer for agentic RL.

The public API, re-exported lazily (PEP 562): ``import hermes_async`` loads no subpackage until
a name is used. ``hermes_async.agent`` is the rollout core; ``hermes_async.envs`` the atroposlib
adapter.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes_async.agent import (
        AgentOptions as AgentOptions,
        AgentResult as AgentResult,
        BudgetConfig as BudgetConfig,
        ChatServer as ChatServer,
        FailureCategory as FailureCategory,
        FailurePolicy as FailurePolicy,
        HermesAgentLoop as HermesAgentLoop,
        Reward as Reward,
        RolloutFailure as RolloutFailure,
        RolloutSetup as RolloutSetup,
        RolloutTask as RolloutTask,
        ScoredGroup as ScoredGroup,
        ScoredRollout as ScoredRollout,
        ToolContext as ToolContext,
        ToolError as ToolError,
        run_group as run_group,
        run_rollout as run_rollout,
    )
    from hermes_async.errors import (
        AsyncBackendError as AsyncBackendError,
        ConfigError as ConfigError,
        HermesAsyncError as HermesAsyncError,
        InferenceError as InferenceError,
        LimitError as LimitError,
        RequestError as RequestError,
        SandboxError as SandboxError,
        ToolArgumentsError as ToolArgumentsError,
        ToolExecutionError as ToolExecutionError,
        ToolTimeoutError as ToolTimeoutError,
        UnknownLimiterError as UnknownLimiterError,
        UnknownParserError as UnknownParserError,
        WorkerError as WorkerError,
    )
    from hermes_async.gc_tuning import (
        gc_tuned_for_rollouts as gc_tuned_for_rollouts,
        tune_gc_for_rollouts as tune_gc_for_rollouts,
    )
    from hermes_async.inference import (
        AtroposGenerateClient as AtroposGenerateClient,
        ChatClient as ChatClient,
        HTTPOptions as HTTPOptions,
        ModelServerError as ModelServerError,
        RetryPolicy as RetryPolicy,
        SamplingParams as SamplingParams,
        SGLangGenerateClient as SGLangGenerateClient,
        TokenClient as TokenClient,
        TokenDelta as TokenDelta,
        Tokenizer as Tokenizer,
        VLLMGenerateClient as VLLMGenerateClient,
        load_tokenizer as load_tokenizer,
    )
    from hermes_async.inference.trajectory import (
        Trajectory as Trajectory,
    )
    from hermes_async.jsontypes import (
        JSON as JSON,
        JSONObject as JSONObject,
    )
    from hermes_async.limits import (
        LagMonitor as LagMonitor,
        LagStatistics as LagStatistics,
        LimiterStatistics as LimiterStatistics,
        Limits as Limits,
        NamedLimiter as NamedLimiter,
        open_lag_monitor as open_lag_monitor,
    )
    from hermes_async.parsers import (
        ParseResult as ParseResult,
        ToolCallParser as ToolCallParser,
        get_parser as get_parser,
        list_parsers as list_parsers,
        register_parser as register_parser,
    )
    from hermes_async.tools.registry import (
        Tool as Tool,
        ToolDefinitions as ToolDefinitions,
        ToolOutcome as ToolOutcome,
        ToolRegistry as ToolRegistry,
        ToolRuntime as ToolRuntime,
        builtin_registry as builtin_registry,
        dispatch as dispatch,
        get_tool_definitions as get_tool_definitions,
    )
    from hermes_async.tools.sandbox import (
        ExecResult as ExecResult,
        LocalSandbox as LocalSandbox,
        Sandbox as Sandbox,
        SandboxManager as SandboxManager,
        local_factory as local_factory,
        open_sandbox_manager as open_sandbox_manager,
        use_sandbox_manager as use_sandbox_manager,
    )
    from hermes_async.tools.sandbox.backends import (
        make_backend_factory as make_backend_factory,
    )
    from hermes_async.tools.toolsets import (
        list_distributions as list_distributions,
        list_toolsets as list_toolsets,
        sample_toolsets_from_distribution as sample_toolsets_from_distribution,
    )

from hermes_async._version import __version__ as __version__


def _install_log_redaction() -> None:
    """Redact credentials from every ``hermes_async`` log record (loaded on first use)."""
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if record.name.startswith("hermes_async"):
            from hermes_async._redact import redact_record

            redact_record(record)
        return record

    logging.setLogRecordFactory(factory)


_install_log_redaction()

__all__ = (
    "JSON",
    "AgentOptions",
    "AgentResult",
    "AsyncBackendError",
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
    "ParseResult",
    "RequestError",
    "RetryPolicy",
    "Reward",
    "RolloutFailure",
    "RolloutSetup",
    "RolloutTask",
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
    "UnknownLimiterError",
    "UnknownParserError",
    "VLLMGenerateClient",
    "WorkerError",
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
    "register_parser",
    "run_group",
    "run_rollout",
    "sample_toolsets_from_distribution",
    "tune_gc_for_rollouts",
    "use_sandbox_manager",
)

#: Where each public name lives (its public module).
_WHERE: dict[str, str] = {
    "AgentOptions": "hermes_async.agent",
    "AgentResult": "hermes_async.agent",
    "AsyncBackendError": "hermes_async.errors",
    "AtroposGenerateClient": "hermes_async.inference",
    "BudgetConfig": "hermes_async.agent",
    "ChatClient": "hermes_async.inference",
    "ChatServer": "hermes_async.agent",
    "ConfigError": "hermes_async.errors",
    "ExecResult": "hermes_async.tools.sandbox",
    "FailureCategory": "hermes_async.agent",
    "FailurePolicy": "hermes_async.agent",
    "HTTPOptions": "hermes_async.inference",
    "HermesAgentLoop": "hermes_async.agent",
    "HermesAsyncError": "hermes_async.errors",
    "InferenceError": "hermes_async.errors",
    "JSON": "hermes_async.jsontypes",
    "JSONObject": "hermes_async.jsontypes",
    "LagMonitor": "hermes_async.limits",
    "LagStatistics": "hermes_async.limits",
    "LimitError": "hermes_async.errors",
    "LimiterStatistics": "hermes_async.limits",
    "Limits": "hermes_async.limits",
    "LocalSandbox": "hermes_async.tools.sandbox",
    "ModelServerError": "hermes_async.inference",
    "NamedLimiter": "hermes_async.limits",
    "ParseResult": "hermes_async.parsers",
    "RetryPolicy": "hermes_async.inference",
    "Reward": "hermes_async.agent",
    "RolloutSetup": "hermes_async.agent",
    "RolloutTask": "hermes_async.agent",
    "RequestError": "hermes_async.errors",
    "RolloutFailure": "hermes_async.agent",
    "SGLangGenerateClient": "hermes_async.inference",
    "SamplingParams": "hermes_async.inference",
    "Sandbox": "hermes_async.tools.sandbox",
    "SandboxError": "hermes_async.errors",
    "SandboxManager": "hermes_async.tools.sandbox",
    "ScoredGroup": "hermes_async.agent",
    "ScoredRollout": "hermes_async.agent",
    "TokenClient": "hermes_async.inference",
    "TokenDelta": "hermes_async.inference",
    "Tokenizer": "hermes_async.inference",
    "Tool": "hermes_async.tools.registry",
    "ToolArgumentsError": "hermes_async.errors",
    "ToolCallParser": "hermes_async.parsers",
    "ToolContext": "hermes_async.agent",
    "ToolDefinitions": "hermes_async.tools.registry",
    "ToolError": "hermes_async.agent",
    "ToolExecutionError": "hermes_async.errors",
    "ToolOutcome": "hermes_async.tools.registry",
    "ToolRegistry": "hermes_async.tools.registry",
    "ToolRuntime": "hermes_async.tools.registry",
    "ToolTimeoutError": "hermes_async.errors",
    "Trajectory": "hermes_async.inference.trajectory",
    "UnknownLimiterError": "hermes_async.errors",
    "UnknownParserError": "hermes_async.errors",
    "VLLMGenerateClient": "hermes_async.inference",
    "WorkerError": "hermes_async.errors",
    "builtin_registry": "hermes_async.tools.registry",
    "dispatch": "hermes_async.tools.registry",
    "gc_tuned_for_rollouts": "hermes_async.gc_tuning",
    "get_parser": "hermes_async.parsers",
    "get_tool_definitions": "hermes_async.tools.registry",
    "list_distributions": "hermes_async.tools.toolsets",
    "list_parsers": "hermes_async.parsers",
    "list_toolsets": "hermes_async.tools.toolsets",
    "load_tokenizer": "hermes_async.inference",
    "local_factory": "hermes_async.tools.sandbox",
    "make_backend_factory": "hermes_async.tools.sandbox.backends",
    "open_lag_monitor": "hermes_async.limits",
    "open_sandbox_manager": "hermes_async.tools.sandbox",
    "register_parser": "hermes_async.parsers",
    "run_group": "hermes_async.agent",
    "run_rollout": "hermes_async.agent",
    "sample_toolsets_from_distribution": "hermes_async.tools.toolsets",
    "tune_gc_for_rollouts": "hermes_async.gc_tuning",
    "use_sandbox_manager": "hermes_async.tools.sandbox",
}


# hermes_async._lazy.lazy_getattr's logic, written out: ``import hermes_async`` loads no
# submodule at all (tests/test_public_api.py), not even that one.
def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'hermes_async' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
