"""The ``terminal`` tool: run a shell command in the rollout's sandbox.

Results keep the reference's shape. Each command runs in a fresh shell; the working
directory carries over, environment variables do not (why, and the timeout rules:
docs/decisions/003-terminal-session-state.md).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import weakref
from dataclasses import replace

from hermes_async.errors import SandboxError
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.registry import Tool, ToolRuntime, current_tool_defaults
from hermes_async.tools.sandbox.base import TIMEOUT_EXIT_CODE, ExecResult, Sandbox

__all__ = (
    "DEFAULT_TERMINAL_TIMEOUT_SECONDS",
    "MAX_FOREGROUND_TIMEOUT_SECONDS",
    "MAX_OUTPUT_CHARS",
    "TERMINAL_TOOL",
    "TOOLS",
    "default_command_timeout",
    "exit_code_meaning",
    "format_seconds",
    "get_sandbox",
    "max_foreground_timeout",
    "run_in_session",
    "session_cwd",
    "strip_ansi",
    "terminal_timeout",
    "truncate_output",
)

#: Default command timeout when ``TERMINAL_TIMEOUT`` is unset (the reference's default).
DEFAULT_TERMINAL_TIMEOUT_SECONDS = 180

#: Largest foreground timeout when ``TERMINAL_MAX_FOREGROUND_TIMEOUT`` is unset.
MAX_FOREGROUND_TIMEOUT_SECONDS = 600

#: Characters of output shown to the model (the reference's cap); longer output keeps 40 % head
#: and 60 % tail: the end of a build log is where the error is, the start says what ran.
MAX_OUTPUT_CHARS = 50_000

#: Bytes the sandbox keeps per stream: a little over what the model can see (4 bytes per char
#: worst case), so truncation happens here, in characters, with the reference's marker.
_EXEC_OUTPUT_LIMIT_BYTES = 4 * MAX_OUTPUT_CHARS + 8192

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")

TERMINAL_DESCRIPTION = (
    "Run a shell command in this task's Linux sandbox and return its output and exit code. "
    "Files and the working directory persist between calls (`cd dir` carries over to the next "
    "command); environment variables do not: each command runs in a fresh shell, so set them "
    "on the same line (`FOO=1 make`). `workdir` runs one command elsewhere.\n\n"
    "Prefer the file tools for file work: read_file instead of cat/head/tail, search_files "
    "instead of grep/find/ls, patch instead of sed/awk, write_file instead of echo or "
    "heredocs. Use terminal for builds, installs, git, running programs and tests, and "
    "anything else that needs a shell.\n\n"
    "Foreground (default): returns as soon as the command finishes; raise `timeout` for "
    "long builds (the command is killed after it, exit code 124). "
    "Background: set background=true for servers and long jobs; you get a session_id to use "
    "with the `process` tool (poll, log, wait, kill, write). Do not use '&', nohup or setsid "
    "in foreground commands: leftover processes are killed when the command returns."
)

TERMINAL_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The command to execute on the VM"},
        "background": {
            "type": "boolean",
            "description": "Run the command in the background and return a session_id "
            "(for servers and long-running jobs).",
            "default": False,
        },
        "timeout": {
            "type": "integer",
            "description": "Seconds before a foreground command is killed (default: the "
            "environment's terminal timeout; maximum 600 in the foreground).",
            "minimum": 1,
        },
        "workdir": {
            "type": "string",
            "description": "Working directory for this command only (absolute, or relative to "
            "the sandbox's working directory); the session's directory stays as it was.",
        },
        "pty": {
            "type": "boolean",
            "description": "Accepted for compatibility; commands run without a PTY here.",
            "default": False,
        },
        "notify_on_complete": {
            "type": "boolean",
            "description": "Background only; accepted for compatibility (poll with `process`).",
            "default": False,
        },
        "watch_patterns": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Background only; accepted for compatibility (use process log).",
        },
    },
    "required": ["command"],
}

# (command, exit code) -> meaning; "*" matches any exit code of that command.
_MEANINGS: dict[tuple[str, int], str] = {
    ("grep", 1): "No matches found (not an error)",
    ("egrep", 1): "No matches found (not an error)",
    ("fgrep", 1): "No matches found (not an error)",
    ("rg", 1): "No matches found (not an error)",
    ("ag", 1): "No matches found (not an error)",
    ("diff", 1): "Files differ (expected, not an error)",
    ("cmp", 1): "Files differ (expected, not an error)",
    ("find", 1): "Some directories were inaccessible (partial results may still be valid)",
    ("test", 1): "Condition evaluated to false (expected, not an error)",
    ("[", 1): "Condition evaluated to false (expected, not an error)",
    ("[[", 1): "Condition evaluated to false (expected, not an error)",
    ("curl", 6): "Could not resolve host",
    ("curl", 7): "Failed to connect to host",
    ("curl", 22): "HTTP response code indicated error (e.g. 404, 500)",
    ("curl", 28): "Operation timed out",
    ("git", 1): "Non-zero exit (often normal — e.g. 'git diff' returns 1 when files differ)",
}
_GENERIC_MEANINGS: dict[int, str] = {
    126: "Command found but not executable (permission denied)",
    127: "Command not found",
    130: "Interrupted (SIGINT)",
    137: "Killed (SIGKILL; possibly out of memory)",
    143: "Terminated (SIGTERM)",
}
_SEGMENT_SPLIT = re.compile(r"\|\||&&|[|;\n]")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (colors, cursor moves, OSC titles)."""
    return _ANSI.sub("", text)


def truncate_output(text: str, max_chars: int = MAX_OUTPUT_CHARS) -> str:
    """Cut ``text`` to 40 % head + 60 % tail of ``max_chars`` with the reference's marker."""
    if len(text) <= max_chars:
        return text
    head = int(max_chars * 0.4)
    tail = max_chars - head
    omitted = len(text) - head - tail
    marker = (
        f"\n\n... [OUTPUT TRUNCATED - {omitted} chars omitted out of {len(text)} total] ...\n\n"
    )
    return text[:head] + marker + text[-tail:]


def exit_code_meaning(command: str, exit_code: int) -> str | None:
    """A short explanation of a non-zero exit code that is often not an error.

    Looks at the last command of a pipeline or list (``a | grep x`` -> ``grep``).
    """
    if exit_code == 0:
        return None
    segments = [s.strip() for s in _SEGMENT_SPLIT.split(command) if s.strip()]
    if segments:
        try:
            words = shlex.split(segments[-1])
        except ValueError:
            words = segments[-1].split()
        words = [w for w in words if not _ASSIGNMENT.match(w)]
        while words and words[0] in ("sudo", "env", "time", "command", "exec", "nice"):
            words = words[1:]
        if words:
            name = os.path.basename(words[0])
            meaning = _MEANINGS.get((name, exit_code))
            if meaning is not None:
                return meaning
    return _GENERIC_MEANINGS.get(exit_code)


def _env_number(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        return default
    return value if value > 0 else default


def terminal_timeout() -> int:
    """The reference's default command timeout: ``TERMINAL_TIMEOUT`` or 180 seconds.

    Only outside an environment; see :func:`default_command_timeout`.
    """
    return _env_number("TERMINAL_TIMEOUT", DEFAULT_TERMINAL_TIMEOUT_SECONDS)


def default_command_timeout(runtime: ToolRuntime) -> float:
    """A command's default timeout: the runtime's, else the run's, else :func:`terminal_timeout`."""
    if runtime.terminal_timeout is not None:
        return float(runtime.terminal_timeout)
    ambient = current_tool_defaults().terminal_timeout
    if ambient is not None:
        return float(ambient)
    return float(terminal_timeout())


def format_seconds(seconds: float) -> str:
    """``2`` for 2.0, ``2.5`` for 2.5 (the numbers in timeout messages)."""
    return f"{seconds:g}"


def max_foreground_timeout() -> int:
    """The foreground timeout ceiling: ``TERMINAL_MAX_FOREGROUND_TIMEOUT`` or 600 seconds."""
    return _env_number("TERMINAL_MAX_FOREGROUND_TIMEOUT", MAX_FOREGROUND_TIMEOUT_SECONDS)


def _failure(error: str, *, status: str | None = None) -> JSONObject:
    result: JSONObject = {"output": "", "exit_code": -1, "error": error}
    if status is not None:
        result["status"] = status
    return result


class _NoSandbox(Exception):
    def __init__(self, result: JSONObject) -> None:
        super().__init__(result.get("error"))
        self.result = result


async def get_sandbox(runtime: ToolRuntime) -> Sandbox:
    """The rollout's sandbox, or raise an internal error carrying the model-visible result.

    **Cancellation**: as ``SandboxManager.get``.
    """
    if runtime.sandboxes is None:
        raise _NoSandbox(
            _failure(
                "Terminal tool disabled: no sandbox is configured for this rollout",
                status="disabled",
            )
        )
    try:
        return await runtime.sandboxes.get(runtime.task_id)
    except SandboxError as exc:
        raise _NoSandbox(
            _failure(
                f"Terminal tool disabled: environment creation failed ({exc.message})",
                status="disabled",
            )
        ) from exc


_WORKDIR_OK = re.compile(r"^[^\x00-\x1f`$;|&<>]*$")

# --------------------------------------------------------------------------------------------
# Session state: the working directory, per sandbox

# The backend sandbox object -> the directory its last command ended in. Weak keys: the entry
# goes with the sandbox; there is nothing to clean up and no task behind it.
_SESSION_CWD: weakref.WeakKeyDictionary[Sandbox, str] = weakref.WeakKeyDictionary()


def _session_key(sandbox: Sandbox) -> Sandbox:
    # ``SandboxManager.get`` returns a fresh ``ManagedSandbox`` wrapper per call (and the
    # rollout core wraps that again to watch it); the backend object behind the wrappers
    # (each one's ``inner``) is the one that lives as long as the sandbox.
    while isinstance(inner := getattr(sandbox, "inner", None), Sandbox):
        sandbox = inner
    return sandbox


def _tracks_cwd(sandbox: Sandbox) -> bool:
    # A backend that is no shell (the in-memory FakeSandbox answers commands by exact text)
    # sets ``terminal_tracks_cwd = False``: its commands are sent unwrapped.
    return bool(getattr(_session_key(sandbox), "terminal_tracks_cwd", True))


def session_cwd(sandbox: Sandbox) -> str | None:
    """The directory the sandbox's last command ended in (``None``: not known yet)."""
    return _SESSION_CWD.get(_session_key(sandbox))


def _wrap(command: str, cwd: str | None, marker: str) -> str:
    """The command under the session wrapper (see docs/decisions/003-terminal-session-state.md)."""
    lines = []
    if cwd is not None:
        lines.append(
            f"cd -- {shlex.quote(cwd)} 2>/dev/null || echo "
            '"note: the previous working directory is gone; running in $PWD" >&2'
        )
    lines.append(f"eval {shlex.quote(command)}")
    lines.append("__hermes_rc=$?")
    lines.append(f"printf '%s%s\\n' {shlex.quote(marker)} \"$PWD\"")
    lines.append('exit "$__hermes_rc"')
    return "\n".join(lines)


def _unwrap(stdout: str, marker: str) -> tuple[str, str | None]:
    """``(stdout without the trailer, the final directory or None)``."""
    at = stdout.rfind(marker)
    if at < 0:
        return stdout, None
    tail = stdout[at + len(marker) :]
    cwd = tail[:-1] if tail.endswith("\n") else tail
    if not cwd.startswith("/") or "\n" in cwd:
        return stdout, None
    return stdout[:at], cwd


async def run_in_session(
    sandbox: Sandbox,
    command: str,
    *,
    timeout: float,
    output_limit: int,
    workdir: str | None = None,
    stdin: bytes | None = None,
) -> ExecResult:
    """Run ``command`` in the session's directory, which it then updates.

    With ``workdir`` it runs there and the session's directory is left alone. ``stdin`` is
    fed to the command (``execute_code`` sends its program that way).

    Raises:
        SandboxError: The sandbox cannot be reached.

    **Cancellation**: the process group is killed; the session's directory is unchanged.
    """
    if workdir or not _tracks_cwd(sandbox):
        return await sandbox.exec(
            command, cwd=workdir or None, timeout=timeout, stdin=stdin, output_limit=output_limit
        )
    key = _session_key(sandbox)
    marker = f"__HERMES_ASYNC_CWD_{secrets.token_hex(8)}__"
    res = await sandbox.exec(
        _wrap(command, _SESSION_CWD.get(key), marker),
        timeout=timeout,
        stdin=stdin,
        output_limit=output_limit,
    )
    stdout, cwd = _unwrap(res.stdout, marker)
    if cwd is not None:
        _SESSION_CWD[key] = cwd
    return replace(res, stdout=stdout)


async def _terminal(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    command = args["command"]
    background = bool(args.get("background", False))
    workdir = args.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not _WORKDIR_OK.match(workdir)):
        return _failure(
            f"Blocked: workdir contains disallowed characters: {workdir!r}", status="blocked"
        )
    requested = args.get("timeout")
    ceiling = max_foreground_timeout()
    if requested is None:
        timeout = default_command_timeout(runtime)
    elif not background and requested > ceiling:
        return {
            "error": f"Foreground timeout {requested}s exceeds the maximum of {ceiling}s. "
            "Use background=true for long-running commands and check on them with the "
            "process tool, or lower the timeout."
        }
    else:
        timeout = float(requested)
    if not isinstance(command, str) or not command.strip():
        return _failure("command must be a non-empty string")
    if "\0" in command:
        return _failure("command contains a NUL byte, which no shell command can hold")
    try:
        sandbox = await get_sandbox(runtime)
    except _NoSandbox as exc:
        return exc.result
    try:
        if background:
            cwd = workdir or session_cwd(sandbox)
            proc = await sandbox.start_background(command, cwd=cwd or None)
            result: JSONObject = {
                "output": "Background process started",
                "session_id": proc.session_id,
                "pid": proc.pid,
                "exit_code": 0,
                "error": None,
                "hint": f"Use process(action='poll'|'log'|'wait'|'kill', "
                f"session_id='{proc.session_id}') to manage it.",
            }
            if args.get("notify_on_complete"):
                result["notify_on_complete"] = True
            if args.get("watch_patterns"):
                result["watch_patterns"] = args["watch_patterns"]
            return result
        res = await run_in_session(
            sandbox,
            command,
            timeout=timeout,
            output_limit=_EXEC_OUTPUT_LIMIT_BYTES,
            workdir=workdir or None,
        )
    except SandboxError as exc:
        return _failure(f"Command execution failed: {type(exc).__name__}: {exc.message}")
    except OSError as exc:
        return _failure(f"Command execution failed: {type(exc).__name__}: {exc}")
    output = truncate_output(strip_ansi(res.output))
    if res.timed_out:
        return {
            "output": output,
            "exit_code": TIMEOUT_EXIT_CODE,
            "error": f"Command timed out after {format_seconds(timeout)} seconds",
        }
    result = {"output": output, "exit_code": res.exit_code, "error": None}
    meaning = exit_code_meaning(command, res.exit_code)
    if meaning is not None:
        result["exit_code_meaning"] = meaning
    return result


TERMINAL_TOOL = Tool(
    name="terminal",
    description=TERMINAL_DESCRIPTION,
    parameters=TERMINAL_PARAMETERS,
    handler=_terminal,
    toolset="terminal",
)

TOOLS: tuple[Tool, ...] = (TERMINAL_TOOL,)
