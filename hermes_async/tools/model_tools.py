"""The reference's ``model_tools`` entry points: ``get_tool_definitions``,
``handle_function_call`` and ``resize_tool_pool``, with the reference's call spelling.

* :func:`~hermes_async.tools.registry.get_tool_definitions` ``(enabled, disabled,
  quiet_mode=...)`` -- re-exported from the registry; it returns ``(schemas, valid_names)``
  (``.schemas`` is the reference's list).
* :func:`handle_function_call` ``(name, args, task_id=..., user_task=...)`` -- **async** here
  (``await`` it); returns the JSON string the model would see, like the reference. It runs on the
  sandbox of ``task_id`` in the current :class:`~hermes_async.tools.sandbox.manager.SandboxManager`
  (inside an environment's run, or a ``use_sandbox_manager`` block). Outside one, the call owns a
  private sandbox on the configured backend (``TERMINAL_ENV``, default ``local``) that is released
  when it returns -- open a manager to keep state between calls.

The reference's ``agent_loop.resize_tool_pool`` is
:func:`hermes_async.agent.loop.resize_tool_pool` (also ``hermes_async.agent_loop``).
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

    Args:
        function_name: The tool's name.
        function_args: Its arguments (a mapping or JSON text).
        task_id: Whose sandbox (default ``"default"``, the reference's key).
        user_task: The task text, for tools that use it.
        registry: Where tools come from (default: the built-in tools).
        timeout: Seconds before the call is cancelled and reported as timed out.

    Returns:
        A JSON string. Every failure of the call itself is inside it (``{"error": ...}``), as in
        the reference.

    Raises:
        ConfigError: Outside a run, and ``TERMINAL_ENV`` names an unknown backend.

    **Cancellation**: the tool is cancelled (its process group killed); a private sandbox is
    released, shielded and bounded.
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
