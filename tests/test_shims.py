"""The reference's import paths keep working, and hold nothing but re-exports."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

import hermes_async

SHIMS = {
    "hermes_async.agent_loop": "hermes_async.agent",
    "hermes_async.tool_context": "hermes_async.agent.context",
}

#: ``hermes_async.__all__`` before the rollout core moved into ``hermes_async.agent``.
ROOT_NAMES_BEFORE = [
    "JSON",
    "AgentResult",
    "AtroposGenerateClient",
    "BudgetConfig",
    "ChatClient",
    "ChatServer",
    "ConfigError",
    "ExecResult",
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
    "RetryPolicy",
    "SGLangGenerateClient",
    "SamplingParams",
    "Sandbox",
    "SandboxError",
    "SandboxManager",
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
    "sample_toolsets_from_distribution",
    "tune_gc_for_rollouts",
    "use_sandbox_manager",
]


@pytest.mark.parametrize("shim", sorted(SHIMS))
def test_shim_has_no_code_only_re_exports(shim: str) -> None:
    module = importlib.import_module(shim)
    tree = ast.parse(inspect.getsource(module))
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom):
            assert node.module == "__future__" or (node.module or "").startswith(
                "hermes_async.agent"
            ), ast.dump(node)
            continue
        assert isinstance(node, ast.Assign), f"{shim} holds code: {ast.unparse(node)}"
        assert [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]
    assert isinstance(module.__all__, tuple) and module.__all__
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.split(".")[:2] == ["hermes_async", "agent"], (
                name,
                value.__module__,
            )


def test_reference_names_are_the_agent_objects() -> None:
    from hermes_async import agent
    from hermes_async.agent_loop import AgentResult, HermesAgentLoop, ToolError
    from hermes_async.tool_context import ToolContext

    assert (HermesAgentLoop, AgentResult, ToolError) == (
        agent.HermesAgentLoop,
        agent.AgentResult,
        agent.ToolError,
    )
    assert ToolContext is agent.ToolContext


def test_every_root_name_of_before_is_still_exported() -> None:
    assert [n for n in ROOT_NAMES_BEFORE if not hasattr(hermes_async, n)] == []
    assert [n for n in ROOT_NAMES_BEFORE if n not in hermes_async.__all__] == []
    for name in ("run_group", "run_rollout", "ScoredGroup", "ScoredRollout", "AgentOptions"):
        assert name in hermes_async.__all__


def test_envs_keeps_its_names() -> None:
    import hermes_async.envs as envs
    from hermes_async.errors import AsyncBackendError

    for name in envs.__all__:
        assert getattr(envs, name) is not None
    assert envs.AsyncBackendError is AsyncBackendError
    assert envs.HermesAgentEnvConfig.__module__ == "hermes_async.envs.config"
