"""``MyEnv.cli()``: atroposlib's command line, checked before it starts and quiet when it fails.

An unknown ``--env.*`` / ``--openai.*`` flag or YAML key is one line naming the closest
field, exit status 2 (argparse took any prefix and atroposlib dropped the value). A
``HermesAsyncError`` is one line, status 1. ``--verbose`` shows dumps and tracebacks.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hermes_async._checks import check_names
from hermes_async._startup import failure_line, validation_summary
from hermes_async.errors import ConfigError, HermesAsyncError

__all__ = ("check_cli_names", "chosen_use_wandb", "flag_names", "run_cli")

logger = logging.getLogger("hermes_async.envs.base")

_COMMANDS = ("serve", "process", "evaluate")

#: ``use_wandb`` for the environment being built by this command (``None``: as configured).
_USE_WANDB: ContextVar[bool | None] = ContextVar("hermes_async_cli_use_wandb", default=None)


def chosen_use_wandb() -> bool | None:
    """``config_init``'s ``use_wandb`` while ``process`` / ``evaluate`` builds its environment and nothing set it; else ``None``."""
    return _USE_WANDB.get()


def flag_names(argv: Sequence[str]) -> list[str]:
    """The ``--env.*`` / ``--openai.*`` flags in ``argv``, as written (``--env.x=1`` -> ``env.x``)."""
    return [arg[2:].split("=", 1)[0] for arg in argv if arg.startswith(("--env.", "--openai."))]


def _config_path(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _yaml(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    import yaml  # type: ignore[import-untyped]  # atroposlib's dependency (its --config)

    try:
        with open(path, encoding="utf-8") as f:
            loaded = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"--config {path}: cannot read it: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"--config {path}: cannot read it: nested too deeply") from None
    if loaded is None:  # an empty file
        return {}
    for where, value in (("the file", loaded), *_sections(loaded)):
        if not isinstance(value, dict):
            raise ConfigError(
                f"--config {path}: {where} must be a mapping of names to values, got "
                f"{type(value).__name__}"
            )
    return loaded  # type: ignore[no-any-return]


def _sections(loaded: object) -> list[tuple[str, object]]:
    """The ``env`` and ``openai`` sections atroposlib reads (``openai`` may be a list)."""
    if not isinstance(loaded, dict):
        return []
    found: list[tuple[str, object]] = []
    for section in ("env", "openai"):
        value = loaded.get(section)
        if value is None:
            continue
        for item in value if section == "openai" and isinstance(value, list) else [value]:
            found.append((f"the {section} section", item))
    return found


def _yaml_keys(section: object) -> list[str]:
    sections = section if isinstance(section, list) else [section]
    return [str(k) for s in sections if isinstance(s, dict) for k in s]


def _config_types(env_cls: Any) -> tuple[Any, Any, Any]:
    """``(config_init()[0], its type, the server config type)``, as atroposlib's CLI sees them."""
    from hermes_async.envs._atropos import APIServerConfig

    config, servers = env_cls.config_init()
    first = servers[0] if isinstance(servers, list) and servers else servers
    server_type = type(first) if isinstance(first, APIServerConfig) else APIServerConfig
    return config, type(config), server_type


def check_cli_names(env_cls: Any, argv: Sequence[str]) -> None:
    """Raise a :class:`ConfigError` for a flag or YAML key that is not a field.

    Raises:
        ConfigError: The first unknown name, with the closest valid one.
    """
    _, config_type, server_type = _config_types(env_cls)
    valid = [f"env.{name}" for name in config_type.model_fields]
    valid += [f"openai.{name}" for name in server_type.model_fields]
    check_names(
        [f"--{name}" for name in flag_names(argv)],
        [f"--{name}" for name in valid],
        kind="flag",
        otherwise="run with --help for the flags",
    )
    path = _config_path(argv)
    yaml_config = _yaml(path)
    for section, fields in (
        ("env", config_type.model_fields),
        ("openai", server_type.model_fields),
    ):
        check_names(
            _yaml_keys(yaml_config.get(section, {})),
            fields,
            kind=f"key in the {section} section of {path}",
        )


def _wandb_choice(env_cls: Any, argv: Sequence[str]) -> bool | None:
    """``config_init``'s ``use_wandb`` unless the command line or the YAML sets it."""
    if "env.use_wandb" in flag_names(argv):
        return None
    if "use_wandb" in _yaml_keys(_yaml(_config_path(argv)).get("env", {})):
        return None
    config, _, _ = _config_types(env_cls)
    return bool(config.use_wandb)


@contextlib.contextmanager
def _quiet_atroposlib(verbose: bool) -> Iterator[None]:
    """Without ``verbose``: no config dump, no warning about a local base URL."""
    if verbose:
        yield
        return
    import atroposlib.envs.base as atropos_base

    def dump(*objects: object) -> None:
        logger.debug("config: %s", " ".join(map(repr, objects)))

    printer = atropos_base.rprint
    atropos_base.rprint = dump
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You are using a local Base URL")
            yield
    finally:
        atropos_base.rprint = printer


def run_cli(env_cls: Any, atropos_cli: Callable[[], None]) -> None:
    """Run ``atropos_cli()`` (atroposlib's ``cli``) for ``env_cls`` with the checks above.

    Raises:
        SystemExit: 2 for an unknown name, 1 for a ``HermesAsyncError``; else as atroposlib's.
    """
    argv = sys.argv[1:]
    verbose = "--verbose" in argv
    if verbose:
        argv = [a for a in argv if a != "--verbose"]
        sys.argv[1:] = argv
    command = next((a for a in argv if a in _COMMANDS), None)
    prog = " ".join(filter(None, (Path(sys.argv[0]).name, command)))
    if command is None and not {"-h", "--help"} & set(argv):
        print(
            f"{prog}: give a command: {', '.join(_COMMANDS)} (--help shows them)", file=sys.stderr
        )
        raise SystemExit(2)
    try:
        check_cli_names(env_cls, argv)
        choice = _wandb_choice(env_cls, argv) if command in ("process", "evaluate") else None
    except ConfigError as exc:
        print(failure_line(prog, exc), file=sys.stderr)
        raise SystemExit(2) from None
    token = _USE_WANDB.set(choice)
    try:
        with _quiet_atroposlib(verbose):
            atropos_cli()
    except ValidationError as exc:  # a flag's or a YAML key's value, as atroposlib built it
        if verbose:
            raise
        print(f"{prog}: bad config value: {validation_summary(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    except (HermesAsyncError, OSError) as exc:  # OSError: e.g. a tokenizer that cannot load
        if verbose:
            raise
        print(failure_line(prog, exc), file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        _USE_WANDB.reset(token)
