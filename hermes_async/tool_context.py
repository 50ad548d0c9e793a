"""The reference's import path of ``ToolContext``: re-exports from :mod:`hermes_async.agent`.

``from hermes_async.tool_context import ToolContext`` keeps working; the code lives in
:mod:`hermes_async.agent.context`.
"""

from __future__ import annotations

from hermes_async.agent.context import ToolContext
from hermes_async.agent.options import DEFAULT_TOOL_TIMEOUT_SECONDS

__all__ = ("DEFAULT_TOOL_TIMEOUT_SECONDS", "ToolContext")
