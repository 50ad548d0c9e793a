"""The ``todo`` tool: a task list the model keeps for itself during one rollout.

Each rollout's ``ToolRuntime`` holds its own list. Calling without ``todos`` reads it.
The result is always ``{"todos": [...], "summary": {"total", "pending", ...}}``.
"""

from __future__ import annotations

from hermes_async._exports import fixup_module_metadata
from hermes_async.jsontypes import JSONObject
from hermes_async.tools._todo_store import TODO_STATUSES, TodoStore
from hermes_async.tools.registry import Tool, ToolRuntime

__all__ = (
    "TODO_TOOL",
    "TOOLS",
    "TodoStore",
)

TODO_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "todos": {
            "type": "array",
            "description": "Task items to write. Omit to read the current list.",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "Unique item identifier"},
                    "content": {"type": "string", "description": "Task description"},
                    "status": {"type": "string", "enum": list(TODO_STATUSES)},
                },
                "required": ["id", "content", "status"],
            },
        },
        "merge": {
            "type": "boolean",
            "description": "true: update existing items by id and append new ones. "
            "false (default): replace the whole list.",
            "default": False,
        },
    },
    "required": [],
}


async def _todo(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    todos = args.get("todos")
    if todos is not None:
        runtime.todo.write(todos, merge=bool(args.get("merge", False)))
    return runtime.todo.result()


TODO_TOOL = Tool(
    name="todo",
    description=(
        "Manage your task list for the current task. Call with no arguments to read it. "
        "Write items with `todos` (each with id, content, status: pending, in_progress, "
        "completed or cancelled); `merge=true` updates items by id instead of replacing "
        "the list. Use it to plan multi-step work and track progress."
    ),
    parameters=TODO_PARAMETERS,
    handler=_todo,
    toolset="todo",
)

TOOLS: tuple[Tool, ...] = (TODO_TOOL,)


fixup_module_metadata(__name__, globals())
