"""Start-up checks: a run whose configuration or infrastructure is broken fails before rollout one.

Parser, toolsets, sandbox backend and model servers; each failure names the setting and
the fix, within seconds. The checks and their reasons: docs/decisions/007-start-up-checks.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from hermes_async.errors import ConfigError
from hermes_async.parsers import get_parser
from hermes_async.tools.registry import ToolRegistry, builtin_registry
from hermes_async.tools.sandbox.backends import preflight_backend
from hermes_async.tools.toolsets import (
    TOOLSETS,
    expand_toolsets,
    resolve_toolsets,
    validate_distribution,
    validate_toolset,
)

__all__ = ("check_offered", "check_parser", "check_toolsets", "preflight")

#: What a tool needs when its availability check fails, by name prefix (the message's fix).
_NEEDS = (
    (
        "browser_",
        "the browser tools need Playwright (pip install 'hermes-async[browser]') and a Chromium "
        "(apt-get install chromium, or HERMES_BROWSER_EXECUTABLE)",
    ),
    (
        "web_",
        "the web tools need a search provider key (FIRECRAWL_API_KEY, FIRECRAWL_API_URL, "
        "TAVILY_API_KEY or EXA_API_KEY; web_extract also runs with HERMES_WEB_DIRECT_EXTRACT=1)",
    ),
)


def check_parser(name: str) -> None:
    """Raise a :class:`ConfigError` naming ``tool_call_parser`` if ``name`` is not registered."""
    try:
        get_parser(name)
    except KeyError as exc:  # also UnknownParserError (a ConfigError that is a KeyError)
        reason = exc.args[0] if exc.args else str(exc)
        raise ConfigError(
            f"--env.tool_call_parser={name!r} is not a tool-call parser: {reason}; pick one of "
            "those, or register yours with register_parser before the environment starts"
        ) from exc


def check_toolsets(
    enabled: Iterable[str] | None,
    disabled: Iterable[str] | None,
    distribution: str | None,
    registry: ToolRegistry | None = None,
) -> None:
    """Raise a :class:`ConfigError` naming the setting for an unknown toolset or distribution."""
    custom = {t.toolset for t in (registry or builtin_registry())} - set(TOOLSETS)
    for setting, names in (("enabled_toolsets", enabled), ("disabled_toolsets", disabled)):
        for name in names or ():
            if name in custom:
                continue
            try:
                validate_toolset(name)
            except ValueError as exc:
                raise ConfigError(f"--env.{setting}: {exc}") from exc
    if distribution:
        try:
            validate_distribution(distribution)
        except ValueError as exc:
            raise ConfigError(f"--env.distribution: {exc}") from exc


def check_offered(
    enabled: Iterable[str] | None,
    disabled: Iterable[str] | None,
    registry: ToolRegistry | None = None,
) -> None:
    """Raise a :class:`ConfigError` if an explicitly enabled toolset would lose tools.

    Tools this project does not register do not count; distributions keep the reference's
    rule (a sampled toolset offers what is available).
    """
    if enabled is None:
        return
    reg = registry or builtin_registry()
    known = {tool.name: tool for tool in reg}
    off = set(expand_toolsets(disabled or ()))
    for name in enabled:
        if name in off:
            continue
        try:
            tool_names = resolve_toolsets([name], disabled)
        except ValueError:  # a custom toolset: the registry's tools that name it
            tool_names = [tool.name for tool in reg if tool.toolset == name]
        missing = [t for t in tool_names if t in known and not known[t].is_available()]
        if not missing:
            continue
        needs = [hint for prefix, hint in _NEEDS if any(t.startswith(prefix) for t in missing)]
        raise ConfigError(
            f"--env.enabled_toolsets: toolset {name!r} is enabled but {', '.join(missing)} "
            f"cannot run here ({'; '.join(needs) or 'their availability checks fail'}); fix "
            f"that, or remove {name!r} from enabled_toolsets (or add it to disabled_toolsets)"
        )


async def preflight(
    config: Any,
    *,
    backend_options: Mapping[str, Any],
    registry: ToolRegistry | None,
    check_servers: Callable[[], Awaitable[None]],
) -> None:
    """Run every start-up check for an environment's ``config``.

    Args:
        registry: The environment's tool registry (custom toolsets count as valid).
        check_servers: Prove every model server answers (bounded).

    Raises:
        ConfigError: A bad parser, toolset, distribution or backend name or option.
        SandboxError: The sandbox backend is unreachable or unauthenticated.
        ServerUnreachableError: A model server did not answer in time.

    **Cancellation**: whatever a check opened is closed.
    """
    check_parser(config.tool_call_parser)
    check_toolsets(config.enabled_toolsets, config.disabled_toolsets, config.distribution, registry)
    if not config.distribution:  # a distribution wins over enabled_toolsets (reference rule)
        check_offered(config.enabled_toolsets, config.disabled_toolsets, registry)
    await preflight_backend(config.terminal_backend, **dict(backend_options))
    await check_servers()
