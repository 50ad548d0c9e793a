"""The ``process`` tool: manage background processes started with ``terminal(background=true)``.

A rollout sees only its own sandbox's processes. Results keep the reference's shapes
(docs/architecture.md, "The process tool's results"); cancelling ``wait`` leaves the
process running.
"""

from __future__ import annotations

import datetime
import time

import anyio

from hermes_async.errors import SandboxError
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.registry import Tool, ToolRuntime
from hermes_async.tools.sandbox.base import BackgroundStatus, Sandbox
from hermes_async.tools.terminal import _NoSandbox, get_sandbox, strip_ansi, terminal_timeout

__all__ = (
    "PROCESS_TOOL",
    "TOOLS",
)

ACTIONS = ("list", "poll", "log", "wait", "kill", "write", "submit", "close")

PROCESS_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": list(ACTIONS),
            "description": "list: all background processes; poll: status and recent output; "
            "log: output lines (offset/limit); wait: block until it exits or the timeout; "
            "kill: terminate it; write: send data to stdin; submit: send data plus Enter; "
            "close: close stdin (end of input).",
        },
        "session_id": {
            "type": "string",
            "description": "The process id from terminal(background=true) (not needed for list).",
        },
        "data": {"type": "string", "description": "Text to send (write/submit)."},
        "timeout": {
            "type": "integer",
            "minimum": 1,
            "description": "Seconds to wait (wait); capped at the terminal timeout.",
        },
        "offset": {
            "type": "integer",
            "minimum": 0,
            "description": "First line to show (log); default: the last `limit` lines.",
        },
        "limit": {"type": "integer", "minimum": 1, "description": "Lines to show (log, 200)."},
    },
    "required": ["action"],
}

PROCESS_DESCRIPTION = (
    "Manage background processes started with terminal(background=true): list them, poll "
    "status and recent output, read the log, wait for completion, kill, or write to stdin."
)

_LIST_PREVIEW_CHARS = 200
_POLL_PREVIEW_CHARS = 1000
_DEFAULT_LOG_LINES = 200


def _not_found(session_id: str) -> JSONObject:
    return {"status": "not_found", "error": f"No process with ID {session_id}"}


def _now() -> float:
    return time.time()


def _status_fields(status: BackgroundStatus) -> JSONObject:
    proc = status.process
    fields: JSONObject = {
        "status": "running" if status.running else "exited",
        "pid": proc.pid,
        "uptime_seconds": max(0, int(_now() - proc.started_at)),
    }
    if not status.running:
        fields["exit_code"] = proc.exit_code
    if status.dropped_bytes:
        # The log is bounded on disk (a ring): say how much of the beginning is gone.
        fields["output_dropped_bytes"] = status.dropped_bytes
    return fields


async def _list(sandbox: Sandbox) -> JSONObject:
    rows = []
    for proc in sandbox.background_processes():
        status = await sandbox.background_status(proc.session_id, tail_chars=_LIST_PREVIEW_CHARS)
        row: JSONObject = {
            "session_id": proc.session_id,
            "command": proc.command[:200],
            "cwd": proc.cwd,
            "started_at": datetime.datetime.fromtimestamp(proc.started_at).isoformat(
                timespec="seconds"
            ),
            "output_preview": strip_ansi(status.output),
        }
        row.update(_status_fields(status))
        rows.append(row)
    return {"processes": rows}


async def _wait(sandbox: Sandbox, session_id: str, timeout: int | None) -> JSONObject:
    limit = terminal_timeout()
    note = None
    if timeout is None:
        timeout = limit
    elif timeout > limit:
        note = f"Requested wait of {timeout}s was clamped to the terminal timeout of {limit}s."
        timeout = limit
    interval = 0.1
    with anyio.move_on_after(timeout):
        while True:
            status = await sandbox.background_status(session_id, tail_chars=_POLL_PREVIEW_CHARS)
            if not status.running:
                return {
                    "status": "exited",
                    "exit_code": status.process.exit_code,
                    "output": strip_ansi(status.output),
                }
            await anyio.sleep(interval)
            interval = min(1.0, interval * 2)
    status = await sandbox.background_status(session_id, tail_chars=_POLL_PREVIEW_CHARS)
    result: JSONObject = {
        "status": "timeout",
        "output": strip_ansi(status.output),
        "timeout_note": note
        or f"Process still running after {timeout}s; wait again, poll, or kill it.",
    }
    if not status.running:
        result.update(status="exited", exit_code=status.process.exit_code)
        result.pop("timeout_note")
    return result


def _log(session_id: str, status: BackgroundStatus, offset: int | None, limit: int) -> JSONObject:
    lines = strip_ansi(status.output).splitlines()
    total = len(lines)
    if offset is None:
        selected = lines[-limit:] if limit else []
        first = total - len(selected)
    else:
        selected = lines[offset : offset + limit]
        first = offset
    result: JSONObject = {
        "session_id": session_id,
        "status": "running" if status.running else "exited",
        "output": "\n".join(selected),
        "total_lines": total,
        "showing": f"{len(selected)} lines" + (f" from line {first}" if selected else ""),
    }
    if status.dropped_bytes:
        result["output_dropped_bytes"] = status.dropped_bytes
    return result


async def _process(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    action = args["action"]
    session_id = args.get("session_id")
    if action != "list" and not session_id:
        return {"error": f"session_id is required for {action}"}
    try:
        sandbox = await get_sandbox(runtime)
    except _NoSandbox as exc:
        return {"error": exc.result["error"]}
    if action == "list":
        return await _list(sandbox)
    assert isinstance(session_id, str)
    if sandbox.get_background(session_id) is None:
        return _not_found(session_id)
    try:
        if action == "poll":
            status = await sandbox.background_status(session_id, tail_chars=_POLL_PREVIEW_CHARS)
            result: JSONObject = {
                "session_id": session_id,
                "command": status.process.command,
                "output_preview": strip_ansi(status.output),
            }
            result.update(_status_fields(status))
            return result
        if action == "log":
            status = await sandbox.background_status(session_id)
            limit = int(args.get("limit") or _DEFAULT_LOG_LINES)
            offset = args.get("offset")
            return _log(session_id, status, None if offset is None else int(offset), limit)
        if action == "wait":
            timeout = args.get("timeout")
            return await _wait(sandbox, session_id, None if timeout is None else int(timeout))
        if action == "kill":
            if await sandbox.kill_background(session_id):
                return {"status": "killed", "session_id": session_id}
            proc = sandbox.get_background(session_id)
            return {
                "status": "already_exited",
                "session_id": session_id,
                "exit_code": None if proc is None else proc.exit_code,
            }
        if action in ("write", "submit"):
            data = args.get("data")
            if data is None:
                return {"error": f"data is required for {action}"}
            text = str(data) + ("\n" if action == "submit" else "")
            status = await sandbox.background_status(session_id, tail_chars=0)
            if not status.running:
                return {
                    "status": "already_exited",
                    "error": f"Process {session_id} has exited; cannot write to its stdin",
                }
            written = await sandbox.write_background_stdin(session_id, text.encode())
            return {"status": "ok", "bytes_written": written}
        if action == "close":
            await sandbox.close_background_stdin(session_id)
            return {"status": "ok", "message": "stdin closed"}
    except KeyError:
        return _not_found(session_id)
    except (SandboxError, OSError) as exc:
        return {"status": "error", "error": f"{action} failed: {exc}"}
    return {"error": f"Unknown action {action!r}; use one of {', '.join(ACTIONS)}"}


PROCESS_TOOL = Tool(
    name="process",
    description=PROCESS_DESCRIPTION,
    parameters=PROCESS_PARAMETERS,
    handler=_process,
    toolset="terminal",
)

TOOLS: tuple[Tool, ...] = (PROCESS_TOOL,)
