"""The reference's ``model_tools`` entry points, with the reference's call spelling.

``get_tool_definitions`` is the registry's; :func:`handle_function_call` is async here and runs
on ``task_id``'s sandbox in the current ``SandboxManager``, else on a private sandbox released
when it returns. ``resize_tool_pool`` is in :mod:`hermes_async.agent.loop`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from hermes_async.tools.registry import (
    ToolDefinitions,
    ToolRegistry,
    ToolRuntime,
    dispatch,
    get_tool_definitions,
)
from hermes_async.tools.sandbox.manager import (
    SandboxManager,
    current_sandbox_manager,
    open_sandbox_manager,
)
from hermes_async.tools.standalone import standalone_factory

__all__ = ("ToolDefinitions", "get_tool_definitions", "handle_function_call")

#: Tools only the agent loop can run (they need the rollout's own state); the reference's
#: ``handle_function_call`` refused them the same way.
_AGENT_LOOP_TOOLS: frozenset[str] = frozenset({"todo"})


async def handle_function_call(
    function_name: str,
    function_args: Mapping[str, object] | str | None,
    task_id: str | None = None,
    user_task: str | None = None,
    *,
    registry: ToolRegistry | None = None,
    timeout: float | None = None,
) -> str:
    """Run one tool call by name; return the result JSON string the model would see.

    ``function_args`` is a mapping or JSON text; ``task_id`` defaults to the reference's
    ``"default"``; past ``timeout`` the call is cancelled and reported as timed out.

    Raises:
        ConfigError: Outside a run, and ``TERMINAL_ENV`` names an unknown backend.

    **Cancellation**: the tool is cancelled; a private sandbox is released, shielded and bounded.
    """
    if function_name in _AGENT_LOOP_TOOLS:
        return json.dumps({"error": f"{function_name} must be handled by the agent loop"})
    key = task_id or "default"

    async def call(manager: SandboxManager) -> str:
        runtime = ToolRuntime(
            task_id=key, limits=manager.limits, sandboxes=manager, user_task=user_task
        )
        outcome = await dispatch(
            function_name, function_args, runtime, registry=registry, timeout=timeout
        )
        return outcome.content

    current = current_sandbox_manager()
    if current is not None:
        return await call(current)
    async with open_sandbox_manager(standalone_factory()[1], idle_timeout=None) as private:
        return await call(private)
