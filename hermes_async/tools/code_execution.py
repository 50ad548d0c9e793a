"""The ``code_execution`` toolset: ``execute_code`` runs a Python program in the rollout's sandbox.

The code goes to ``python3 -`` on stdin and runs as a ``terminal`` command does, with its
limits. ``tool_calls_made`` is always 0 (no RPC channel in an RL sandbox). Result shapes:
docs/architecture.md, "``execute_code``".
"""

from __future__ import annotations

import anyio

from hermes_async.errors import SandboxError
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.registry import Tool, ToolRuntime
from hermes_async.tools.sandbox.base import TIMEOUT_EXIT_CODE
from hermes_async.tools.terminal import (
    _EXEC_OUTPUT_LIMIT_BYTES,
    _NoSandbox,
    default_command_timeout,
    format_seconds,
    get_sandbox,
    max_foreground_timeout,
    run_in_session,
    strip_ansi,
    truncate_output,
)

__all__ = ("EXECUTE_CODE_TOOL", "TOOLS")

#: The command that runs the program read from standard input.
_PYTHON_LAUNCHER = (
    '__py=$(command -v python3 || command -v python) || { echo "execute_code: this sandbox '
    'has no python3 or python" >&2; exit 127; }\n"$__py" -'
)


def _result(
    status: str, output: str, exit_code: int, error: str | None, seconds: float
) -> JSONObject:
    return {
        "status": status,
        "output": output,
        "exit_code": exit_code,
        "error": error,
        "duration_seconds": round(seconds, 3),
        "tool_calls_made": 0,
    }


async def _execute_code(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    code = args["code"]
    if not isinstance(code, str) or not code.strip():
        return _result("error", "", -1, "code must be a non-empty string", 0.0)
    requested = args.get("timeout")
    ceiling = max_foreground_timeout()
    if requested is not None and requested > ceiling:
        return _result(
            "error",
            "",
            -1,
            f"timeout {requested}s exceeds the maximum of {ceiling}s; split the work or use "
            "terminal(background=true)",
            0.0,
        )
    timeout = float(requested) if requested is not None else default_command_timeout(runtime)
    try:
        sandbox = await get_sandbox(runtime)
    except _NoSandbox as exc:
        return _result("error", "", -1, str(exc.result.get("error")), 0.0)
    start = anyio.current_time()
    try:
        res = await run_in_session(
            sandbox,
            _PYTHON_LAUNCHER,
            timeout=timeout,
            output_limit=_EXEC_OUTPUT_LIMIT_BYTES,
            stdin=code.encode(),
        )
    except (SandboxError, OSError) as exc:
        message = exc.message if isinstance(exc, SandboxError) else str(exc)
        return _result("error", "", -1, f"Code execution failed: {message}", 0.0)
    seconds = anyio.current_time() - start
    output = truncate_output(strip_ansi(res.output))
    if res.timed_out:
        error = f"Code timed out after {format_seconds(timeout)} seconds"
        return _result("timeout", output, TIMEOUT_EXIT_CODE, error, seconds)
    if res.exit_code != 0:
        error = f"Python exited with status {res.exit_code}"
        return _result("error", output, res.exit_code, error, seconds)
    return _result("success", output, 0, None, seconds)


EXECUTE_CODE_TOOL = Tool(
    name="execute_code",
    description=(
        "Run a Python 3 program in this task's sandbox and return what it printed. The program "
        "runs in the terminal's current directory with the same timeout; files it writes stay "
        "in the sandbox. Print the results you need: only output comes back."
    ),
    parameters={
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "The Python program to run."},
            "timeout": {
                "type": "integer",
                "description": "Seconds before the program is killed (default: the terminal's "
                "timeout; at most 600).",
                "minimum": 1,
            },
        },
        "required": ["code"],
    },
    handler=_execute_code,
    toolset="code_execution",
)

TOOLS: tuple[Tool, ...] = (EXECUTE_CODE_TOOL,)
