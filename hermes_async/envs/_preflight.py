"""Start-up checks: a run whose configuration or infrastructure is broken fails before rollout one.

Without them a broken run looks like a bad policy: an unknown ``tool_call_parser`` failed at the
first rollout, a stopped Docker engine turned every tool call into an error and every reward
into 0.0, a dead model server hung (atroposlib's health check) or scored zeros. The entry points
(``serve`` / ``process`` / ``evaluate``) run :func:`preflight` first; each check raises an error
that names the setting and the fix:

=================================  ==================================================  ==========
what                               how                                                 raises
=================================  ==================================================  ==========
``tool_call_parser``               the parser registry knows the name                  ConfigError
``enabled_toolsets`` /             every name is a toolset (or a registered tool's     ConfigError
``disabled_toolsets``              toolset); ``distribution`` is a distribution
``terminal_backend``               registered; its preflight hook passes (Docker       ConfigError /
                                   engine answers a ping, Modal credentials exist)     SandboxError
the model servers                  each answers HTTP within ``server_connect_timeout``  ServerUnreachableError
=================================  ==================================================  ==========

The configuration checks are pure; the backend and server checks are bounded (the Docker ping by
~10 s, the servers by ``server_connect_timeout``, 10 s by default), so a run against a stopped
engine or a dead server exits non-zero within seconds, before atroposlib writes a single group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from hermes_async.errors import ConfigError
from hermes_async.parsers import get_parser
from hermes_async.tools.registry import ToolRegistry, builtin_registry
from hermes_async.tools.sandbox.backends import preflight_backend
from hermes_async.tools.toolsets import TOOLSETS, validate_distribution, validate_toolset

__all__ = ("check_parser", "check_toolsets", "preflight")


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


async def preflight(
    config: Any,
    *,
    backend_options: Mapping[str, Any],
    registry: ToolRegistry | None,
    check_servers: Callable[[], Awaitable[None]],
) -> None:
    """Run every start-up check for an environment's ``config`` (see the module docstring).

    Args:
        config: The :class:`~hermes_async.envs.config.HermesAgentEnvConfig`.
        backend_options: The options the sandbox factory is built with.
        registry: The environment's tool registry (custom toolsets count as valid).
        check_servers: Proves every model server answers (bounded).

    Raises:
        ConfigError: A bad parser, toolset, distribution or backend name/option.
        SandboxError: The sandbox backend is unreachable or unauthenticated.
        ServerUnreachableError: A model server did not answer in time.

    **Cancellation**: whatever a check opened is closed.
    """
    check_parser(config.tool_call_parser)
    check_toolsets(config.enabled_toolsets, config.disabled_toolsets, config.distribution, registry)
    await preflight_backend(config.terminal_backend, **dict(backend_options))
    await check_servers()
