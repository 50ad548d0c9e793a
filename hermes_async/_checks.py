"""One check of a config object's fields, for the ``__post_init__`` of the config dataclasses.

``check_fields(self, ("cpus",), POSITIVE_FINITE)`` raises
``ConfigError("ModalSandboxConfig.cpus must be > 0 and finite, got inf")``: class, field,
requirement and bad value, as every config error does.
"""

from __future__ import annotations

import difflib
import math
import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hermes_async.errors import ConfigError

__all__ = (
    "ABSOLUTE_PATH",
    "AT_LEAST_ONE",
    "INTEGER_AT_LEAST_ONE",
    "NON_EMPTY_STRING",
    "NON_NEGATIVE_FINITE",
    "POSITIVE",
    "POSITIVE_FINITE",
    "POSITIVE_SECONDS",
    "Requirement",
    "check_fields",
    "check_names",
    "check_value",
)


@dataclass(frozen=True, slots=True)
class Requirement:
    """What a field must be: ``test(value)``, and ``words`` for the message (``"> 0"``)."""

    test: Callable[[object], bool]
    words: str

    def or_none(self) -> Requirement:
        """The same requirement with ``None`` allowed too (the message says so)."""
        return Requirement(lambda v: v is None or self.test(v), f"{self.words} or None")

    def unless_none(self) -> Requirement:
        """``None`` passes without the message mentioning it (an optional override)."""
        return Requirement(lambda v: v is None or self.test(v), self.words)


def _positive(value: object) -> bool:
    try:
        return bool(value > 0)  # type: ignore[operator]
    except TypeError:  # not a number: fails like any other bad value
        return False


def _positive_finite(value: object) -> bool:
    return _positive(value) and math.isfinite(value)  # type: ignore[arg-type]


def _non_negative_finite(value: object) -> bool:
    try:
        return bool(value >= 0) and math.isfinite(value)  # type: ignore[operator,arg-type]
    except TypeError:
        return False


def _non_empty_string(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _absolute(value: object) -> bool:
    return isinstance(value, str) and posixpath.isabs(value)


def _at_least_one(value: object) -> bool:
    try:
        return bool(value >= 1)  # type: ignore[operator]
    except TypeError:
        return False


def _integer_at_least_one(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


#: ``> 0`` (NaN fails).
POSITIVE = Requirement(_positive, "> 0")
#: ``> 0`` in seconds (NaN fails; infinity passes: "no deadline").
POSITIVE_SECONDS = Requirement(_positive, "> 0 seconds")
#: A finite number ``> 0`` (a deadline or a rate that must end).
POSITIVE_FINITE = Requirement(_positive_finite, "> 0 and finite")
#: A finite number ``>= 0`` (a grace period or a back-off: zero means none).
NON_NEGATIVE_FINITE = Requirement(_non_negative_finite, ">= 0 and finite")
#: ``>= 1``.
AT_LEAST_ONE = Requirement(_at_least_one, ">= 1")
#: An ``int`` (not a ``bool``) ``>= 1``.
INTEGER_AT_LEAST_ONE = Requirement(_integer_at_least_one, "an integer >= 1")
#: A string with something besides whitespace (an image or template name).
NON_EMPTY_STRING = Requirement(_non_empty_string, "a non-empty string")
#: An absolute POSIX path.
ABSOLUTE_PATH = Requirement(_absolute, "absolute")


def check_fields(
    owner: object,
    names: Iterable[str],
    requirement: Requirement,
    *,
    error: Callable[[str], Exception] = ConfigError,
) -> None:
    """Raise ``error("Owner.name must be <words>, got value")`` for the first failing field.

    Args:
        error: ``ConfigError`` for user configuration; ``ValueError`` for programmers' options.
    """
    for name in names:
        check_value(
            f"{type(owner).__name__}.{name}", getattr(owner, name), requirement, error=error
        )


def check_value(
    where: str,
    value: object,
    requirement: Requirement,
    *,
    error: Callable[[str], Exception] = ConfigError,
) -> None:
    """Raise ``error("<where> must be <words>, got value")`` unless ``value`` passes."""
    if not requirement.test(value):
        raise error(f"{where} must be {requirement.words}, got {value!r}")


def check_names(
    given: Iterable[str], valid: Iterable[str], *, kind: str, otherwise: str | None = None
) -> None:
    """Raise a ``ConfigError`` for the first of ``given`` that is not in ``valid``.

    The message names the closest valid name (``did you mean '--env.max_agent_turns'?``), else
    ``otherwise`` (default: the valid names).

    Args:
        kind: What a name is, for the message (``"flag"``, ``"MyEnvConfig field"``).
    """
    names = list(valid)
    known = set(names)
    for name in given:
        if name in known:
            continue
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = (
            f"did you mean {close[0]!r}?"
            if close
            else otherwise or f"valid: {', '.join(sorted(names))}"
        )
        raise ConfigError(f"unknown {kind}: {name!r}; {hint}")
