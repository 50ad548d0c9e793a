"""A context-local "current" value (the current sandbox manager, browser manager, pool session).

One :class:`contextvars.ContextVar` underneath, so each asyncio or trio task sees its own
and inherits its parent's at start.
"""

from __future__ import annotations

import contextvars
from typing import Generic, TypeVar

__all__ = ("Current", "Using")

T = TypeVar("T")


class Current(Generic[T]):
    """The current ``T`` of this context, ``default`` when none was set."""

    __slots__ = ("_var",)

    def __init__(self, name: str, default: T) -> None:
        self._var: contextvars.ContextVar[T] = contextvars.ContextVar(name, default=default)

    def get(self) -> T:
        """The current value."""
        return self._var.get()

    def use(self, value: T) -> Using[T]:
        """Make ``value`` current for the block (and tasks started inside it)."""
        return Using(self._var, value)


class Using(Generic[T]):
    """The context manager of :meth:`Current.use`: a slotted object, not a generator.

    One is held for every rollout's whole run; a ``contextmanager`` would keep a frame alive.
    """

    __slots__ = ("_token", "_value", "_var")

    def __init__(self, var: contextvars.ContextVar[T], value: T) -> None:
        self._var = var
        self._value = value
        self._token: contextvars.Token[T] | None = None

    def __enter__(self) -> T:
        self._token = self._var.set(self._value)
        return self._value

    def __exit__(self, *exc_info: object) -> None:
        assert self._token is not None
        self._var.reset(self._token)
        self._token = None
