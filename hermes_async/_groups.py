"""Exception groups at API boundaries: the one helper that unwraps a task group's lone error.

A task group wraps what its tasks raise in an ``ExceptionGroup``; nested groups (a sandbox
manager's, then a batch of rollouts) wrap it twice. Where an API documents that it re-raises
"the exception itself", it does so through :func:`single_errors`: a lone exception (at any
depth) comes out unwrapped; several concurrent failures stay an ``ExceptionGroup``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ("single_errors", "unwrap_group")


def unwrap_group(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The single exception inside ``group`` (through nested groups), or the group itself."""
    while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
        inner = group.exceptions[0]
        if not isinstance(inner, BaseExceptionGroup):
            return inner
        group = inner
    return group


@contextmanager
def single_errors() -> Iterator[None]:
    """Re-raise a task group's lone exception as itself (nested groups included)."""
    try:
        yield
    except BaseExceptionGroup as group:
        raise unwrap_group(group) from None
