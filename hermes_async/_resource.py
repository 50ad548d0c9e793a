"""The async-context-manager protocol for objects with an ``aclose()``, written once.

Resources with a lifecycle (sandboxes, connection pools, managers, contexts) are opened with
``async with X(...) as x:`` and closed by ``aclose()``. :class:`AsyncResource` supplies the two
dunder methods so each class documents and implements only ``aclose`` (and, where entering does
work, its own ``__aenter__``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ("AsyncResource",)


class AsyncResource(ABC):
    """Mixin: ``async with`` enters by returning ``self`` and exits with ``await self.aclose()``.

    Subclasses implement :meth:`aclose` (idempotent, shielded and bounded where it waits);
    override :meth:`_close_on_exit` to close differently when the block raised.
    """

    __slots__ = ()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close_on_exit(exc)

    async def _close_on_exit(self, exc: BaseException | None) -> None:
        """What leaving the block does: ``aclose()``. Override (not ``__aexit__``) to close
        differently when the block raised or was cancelled (``exc`` is not ``None``)."""
        await self.aclose()

    @abstractmethod
    async def aclose(self) -> None:
        """Release what this object holds; safe to call more than once."""
