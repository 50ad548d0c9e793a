"""Tools: schema + async handler, the registry that holds them, and the dispatcher.

:func:`dispatch` is the one path every tool call takes, from the agent loop and from
``ToolContext.call_tool``. Its contract: what the model did wrong is returned, never raised.
Each failure becomes ``{"error": ...}`` text for the model and a short ``error`` on the
:class:`ToolOutcome`. Only cancellation propagates.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import anyio

from hermes_async._current import Current
from hermes_async._json import scrub_text
from hermes_async.errors import (
    ConfigError,
    SandboxError,
    ToolArgumentsError,
    ToolExecutionError,
    ToolTimeoutError,
)
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.tools._arguments import (
    coerce_arguments,
    decode_arguments,
    parameters_validator,
    validate_arguments,
)
from hermes_async.tools._todo_store import TodoStore
from hermes_async.tools._web_settings import WebSettings
from hermes_async.tools.sandbox.base import SandboxProvider
from hermes_async.tools.toolsets import (
    TOOLSETS,
    expand_toolsets,
    resolve_toolsets,
    validate_toolset,
)

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

    from hermes_async.tools.browser.manager import BrowserManager

__all__ = (
    "NOT_AVAILABLE_IN_RL",
    "Tool",
    "ToolDefaults",
    "ToolDefinitions",
    "ToolHandler",
    "ToolOutcome",
    "ToolRegistry",
    "ToolRuntime",
    "builtin_registry",
    "current_tool_defaults",
    "dispatch",
    "get_tool_definitions",
    "use_tool_defaults",
)

logger = logging.getLogger(__name__)

#: Default per-result threshold before a result is persisted into the sandbox (reference value).
DEFAULT_MAX_RESULT_SIZE_CHARS = 100_000

#: Tools the reference's RL loop answered itself with a fixed error.
NOT_AVAILABLE_IN_RL: Mapping[str, str] = {
    "memory": "Memory is not available in RL environments.",
    "session_search": "Session search is not available in RL environments.",
    "delegate_task": "Delegation is not available in RL environments.",
    "clarify": "Clarify is not available in RL environments.",
}


@dataclass(frozen=True, slots=True)
class ToolDefaults:
    """Run-wide defaults for tool settings a runtime leaves unset (:func:`use_tool_defaults`)."""

    terminal_timeout: float | None = None
    skills_dir: str | None = None


_NO_DEFAULTS = ToolDefaults()
_DEFAULTS: Current[ToolDefaults | None] = Current("hermes_async_tool_defaults", None)


def current_tool_defaults() -> ToolDefaults:
    """The defaults set by :func:`use_tool_defaults` in this context (empty outside one)."""
    return _DEFAULTS.get() or _NO_DEFAULTS


@contextlib.contextmanager
def use_tool_defaults(
    *, terminal_timeout: float | None = None, skills_dir: str | None = None
) -> Iterator[ToolDefaults]:
    """Make these the defaults of every tool runtime in this context (and tasks started in it).

    An environment sets them from its config, so a ``ToolContext`` that reference-style code builds
    inside the run gets the configured values too. A runtime's own setting wins.
    """
    defaults = ToolDefaults(terminal_timeout=terminal_timeout, skills_dir=skills_dir)
    with _DEFAULTS.use(defaults):
        yield defaults


@dataclass(slots=True)
class ToolRuntime:
    """What a tool handler can reach: the rollout's identity, limiters and per-rollout state.

    One runtime per rollout. Later layers add their state here rather than in module globals.

    Attributes:
        task_id: The rollout's id; tools that touch a sandbox use the sandbox of this id.
        sandboxes: The ``SandboxManager``; ``None``: sandbox tools report an error.
        terminal_timeout, skills_dir: The rollout's ``AgentOptions`` fields (``None``:
            :func:`current_tool_defaults`, then the reference's defaults).
        on_sandbox_lost: Called by :func:`dispatch` with the ``SandboxError`` a tool raised,
            after the model was told; the rollout core records an ``infra`` failure.
    """

    task_id: str
    limits: Limits = field(default_factory=Limits)
    todo: TodoStore = field(default_factory=TodoStore)
    user_task: str | None = None
    sandboxes: SandboxProvider | None = None
    web: WebSettings | None = None
    browsers: BrowserManager | None = None
    terminal_timeout: float | None = None
    skills_dir: str | None = None
    on_sandbox_lost: Callable[[SandboxError], object] | None = None


#: The signature of a tool handler.
ToolHandler = Callable[[JSONObject, ToolRuntime], Awaitable[str | JSONObject]]


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool the model can call.

    Attributes:
        handler: ``async (args, runtime) -> str | dict``.
        max_result_size_chars: Longer results are persisted into the sandbox and replaced by a
            preview; ``None`` exempts the tool.
        available: Optional check; an unavailable tool is not offered to the model.

    Raises:
        ConfigError: A malformed field. ``parameters`` is checked by :meth:`ToolRegistry.register`.
    """

    name: str
    description: str
    parameters: JSONObject
    handler: ToolHandler
    toolset: str
    max_result_size_chars: int | None = DEFAULT_MAX_RESULT_SIZE_CHARS
    available: Callable[[], bool] | None = None

    @property
    def schema(self) -> JSONObject:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name or name != name.strip() or not name.isprintable():
            raise ConfigError(
                f"a tool name must be a non-empty string without surrounding whitespace or "
                f"control characters (the model writes it back), got {name!r}"
            )
        if not isinstance(self.toolset, str) or not self.toolset:
            raise ConfigError(
                f"tool {name!r}: toolset must be a non-empty string, got {self.toolset!r}"
            )
        if not callable(self.handler):
            raise ConfigError(
                f"tool {name!r}: handler must be an async function (args, runtime) -> str | dict, "
                f"got {type(self.handler).__name__}"
            )
        limit = self.max_result_size_chars
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int | float) or not limit >= 0
        ):
            raise ConfigError(
                f"tool {name!r}: max_result_size_chars must be a number >= 0 or None (exempt), "
                f"got {limit!r}"
            )

    def is_available(self) -> bool:
        """Whether the tool should be offered (its ``available`` check passes, if any)."""
        return self.available is None or bool(self.available())


class ToolDefinitions(NamedTuple):
    """Tool schemas to offer the model, and the names the loop accepts."""

    schemas: list[JSONObject]
    valid_names: set[str]


class ToolRegistry:
    """A set of tools by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        # Built once, at registration: a call's arguments are validated without looking the
        # schema up again (its canonical JSON cost ~8 us per call).
        self._validators: dict[str, Draft202012Validator] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        """Add ``tool``.

        Raises:
            ConfigError: The name is taken, or ``parameters`` is not a valid JSON Schema of an
                object (the message names the tool and where).
        """
        if tool.name in self._tools:
            raise ConfigError(f"tool {tool.name!r} is already registered")
        self._validators[tool.name] = parameters_validator(tool.name, tool.parameters)
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def validator(self, name: str) -> Draft202012Validator:
        """The validator of a registered tool's ``parameters``.

        Raises:
            KeyError: No tool ``name``.
        """
        return self._validators[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def names(self) -> list[str]:
        return sorted(self._tools)

    def definitions(
        self,
        enabled_toolsets: Iterable[str] | None = None,
        disabled_toolsets: Iterable[str] | None = None,
    ) -> ToolDefinitions:
        """Resolve toolsets to the registered, available tools' schemas and names.

        Raises:
            ValueError: An unknown toolset name.
        """
        # Toolsets are the reference's static ones plus any a registered tool declares, so a
        # custom tool in toolset "terminal" (or "my_tools") is offered with it.
        custom = {t.toolset for t in self._tools.values()} - set(TOOLSETS)
        enabled = None if enabled_toolsets is None else list(enabled_toolsets)
        disabled = list(disabled_toolsets or ())
        for name in [*(enabled or ()), *disabled]:
            if name not in custom:
                validate_toolset(name)
        static_enabled = None if enabled is None else [n for n in enabled if n not in custom]
        static_disabled = [n for n in disabled if n not in custom]
        wanted = resolve_toolsets(static_enabled, static_disabled)
        on = expand_toolsets(static_enabled if static_enabled is not None else TOOLSETS)
        on |= custom if enabled is None else {n for n in enabled if n in custom}
        off = expand_toolsets(static_disabled) | {n for n in disabled if n in custom}
        names = dict.fromkeys(wanted)
        for tool in self._tools.values():
            if tool.toolset in on and tool.toolset not in off:
                names.setdefault(tool.name)
        tools = [t for n in names if (t := self._tools.get(n)) is not None and t.is_available()]
        return ToolDefinitions([t.schema for t in tools], {t.name for t in tools})


#: Modules that define built-in tools (each exposes ``TOOLS: tuple[Tool, ...]``). Modules that
#: are not importable yet (a later layer) are skipped, never stubbed.
_BUILTIN_TOOL_MODULES: tuple[str, ...] = (
    "hermes_async.tools.terminal",
    "hermes_async.tools.process",
    "hermes_async.tools.files",
    "hermes_async.tools.web",
    "hermes_async.tools.todo",
    "hermes_async.tools.browser",
    "hermes_async.tools.skills",
    "hermes_async.tools.code_execution",
)

_BUILTIN: ToolRegistry | None = None


def builtin_registry() -> ToolRegistry:
    """The registry of every built-in tool (built once, then shared)."""
    global _BUILTIN
    if _BUILTIN is None:
        registry = ToolRegistry()
        for module_name in _BUILTIN_TOOL_MODULES:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name != module_name:
                    raise
                continue
            for tool in getattr(module, "TOOLS", ()):
                registry.register(tool)
        _BUILTIN = registry
    return _BUILTIN


def get_tool_definitions(
    enabled_toolsets: Iterable[str] | None = None,
    disabled_toolsets: Iterable[str] | None = None,
    quiet_mode: bool = False,
    *,
    registry: ToolRegistry | None = None,
) -> ToolDefinitions:
    """Return ``(schemas, valid_names)`` for the given toolsets.

    Takes the reference's arguments (``quiet_mode`` prints nothing either way). The reference
    returned the schemas alone; this returns the pair (``.schemas`` is that list), because every
    caller needs the names too.

    Raises:
        ValueError: An unknown toolset name.
    """
    return (registry or builtin_registry()).definitions(enabled_toolsets, disabled_toolsets)


# --------------------------------------------------------------------------------------------
# Dispatch


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """The result of one dispatched tool call.

    Attributes:
        content: Exactly what the model is shown.
        duration_seconds: Time spent, including ``wait_seconds`` for a ``tool_calls`` slot.
        malformed: The call itself was wrong: the model's mistake, not the tool's failure.
    """

    content: str
    error: str | None = None
    duration_seconds: float = 0.0
    wait_seconds: float = 0.0
    malformed: bool = False


def _error_json(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


def _serialize(result: str | JSONObject) -> str:
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False)


def _result_error(content: str) -> str | None:
    """The error a tool result reports, if it is a JSON object with a truthy ``error``.

    The reference counted only a negative ``exit_code`` and missed timeouts (exit 124).
    """
    stripped = content.lstrip()
    if not stripped.startswith("{"):
        return None
    try:
        value = json.loads(content)
    except json.JSONDecodeError:
        return None
    if isinstance(value, dict) and value.get("error"):
        return str(value["error"])
    return None


async def dispatch(
    name: str,
    arguments: str | Mapping[str, object] | None,
    runtime: ToolRuntime,
    *,
    registry: ToolRegistry | None = None,
    valid_names: Iterable[str] | None = None,
    timeout: float | None = None,
) -> ToolOutcome:
    """Run one tool call and return what the model should see.

    Args:
        arguments: The raw arguments (JSON object text, or a mapping).
        valid_names: Names the model was offered; others are "unknown" even if registered.

    Returns:
        A :class:`ToolOutcome`. A ``SandboxError`` also goes to ``runtime.on_sandbox_lost``.

    **Cancellation**: the handler is cancelled (its own cleanup runs) and the cancellation
    propagates; no outcome is produced.
    """
    registry = registry or builtin_registry()
    start = anyio.current_time()

    def done(
        content: str, error: str | None, waited: float = 0.0, *, malformed: bool = False
    ) -> ToolOutcome:
        # What the model sees goes into the next request: it must encode as UTF-8 even when a
        # name, an argument or a handler's text echoes a lone surrogate ("Unknown tool '\ud800'").
        content = scrub_text(content)
        error = scrub_text(error) if error is not None else None
        return ToolOutcome(content, error, anyio.current_time() - start, waited, malformed)

    if name in NOT_AVAILABLE_IN_RL:
        msg = NOT_AVAILABLE_IN_RL[name]
        return done(_error_json(msg), msg, malformed=True)
    # A set given is used as is: a copy per call would be held for the call's whole duration.
    allowed: AbstractSet[str]
    if valid_names is None:
        allowed = set(registry.names())
    elif isinstance(valid_names, AbstractSet):
        allowed = valid_names
    else:
        allowed = set(valid_names)
    tool = registry.get(name)
    if tool is None or name not in allowed:
        msg = f"Unknown tool '{name}'. Available tools: {sorted(allowed)}"
        return done(_error_json(msg), f"Unknown tool '{name}'", malformed=True)
    try:
        args = decode_arguments(arguments)
        args = coerce_arguments(tool.parameters, args)
        validate_arguments(name, registry.validator(name), args)
    except ToolArgumentsError as exc:
        return done(_error_json(exc.message), exc.message, malformed=True)

    waited = 0.0
    try:
        async with runtime.limits.tool_calls as waited:
            if timeout is None:
                result = await tool.handler(args, runtime)
            else:
                # A bare scope and a check, not ``fail_after`` (two generator context managers
                # around the same scope, held for the call's whole duration).
                with anyio.move_on_after(timeout) as deadline:
                    result = await tool.handler(args, runtime)
                if deadline.cancelled_caught:
                    raise TimeoutError
    except TimeoutError:
        if timeout is None:
            msg = f"Tool execution failed: TimeoutError in '{name}'"
        else:
            msg = str(ToolTimeoutError(name, timeout))
        return done(_error_json(msg), msg, waited)
    except ToolExecutionError as exc:
        return done(_error_json(exc.message), exc.message, waited)
    except SandboxError as exc:  # the sandbox (or browser) is gone, not the tool's bug
        msg = f"Tool execution failed: {type(exc).__name__}: {exc}"[:2000]
        if runtime.on_sandbox_lost is not None:
            runtime.on_sandbox_lost(exc)
        return done(_error_json(msg), msg, waited)
    except Exception as exc:  # a handler bug must not kill the rollout's group
        logger.warning("tool %r raised %s", name, type(exc).__name__, exc_info=True)
        msg = f"Tool execution failed: {type(exc).__name__}: {exc}"[:2000]
        return done(_error_json(msg), msg, waited)
    content = _serialize(result)
    return done(content, _result_error(content), waited)
