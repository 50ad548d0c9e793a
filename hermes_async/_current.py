"""A context-local "current" value (the current sandbox manager, browser manager, pool session).

``use(value)`` makes ``value`` current for a block and every task started inside it, then
restores the previous one; ``get()`` reads it. One :class:`contextvars.ContextVar` underneath,
so asyncio and trio tasks each see their own (a task inherits its parent's at start).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ("Current",)

T = TypeVar("T")


class Current(Generic[T]):
    """The current ``T`` of this context, ``default`` when none was set.

    Args:
        name: The context variable's name (``hermes_async_...``).
        default: What :meth:`get` returns outside every :meth:`use` block.
    """

    __slots__ = ("_var",)

    def __init__(self, name: str, default: T) -> None:
        self._var: contextvars.ContextVar[T] = contextvars.ContextVar(name, default=default)

    def get(self) -> T:
        """The current value."""
        return self._var.get()

    @contextlib.contextmanager
    def use(self, value: T) -> Iterator[T]:
        """Make ``value`` current for the block (and tasks started inside it)."""
        token = self._var.set(value)
        try:
            yield value
        finally:
            self._var.reset(token)
