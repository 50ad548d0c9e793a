"""A watchdog for the entry points: when nothing finishes for a while, say what the run waits on.

Some waits cannot have a deadline (mostly atroposlib's), and a hang there used to be
silent: peers lost 29 hours to one. The watchdog logs every registered wait, the limiters
and the sandboxes after ``interval`` seconds without progress. It never cancels anything.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
from anyio.abc import TaskStatus

__all__ = ("Watchdog",)

logger = logging.getLogger("hermes_async.envs.base")


class Watchdog:
    """Tracks named waits and progress; :meth:`run` logs a stall.

    Args:
        interval: Seconds without progress before a warning (and between warnings).
        describe: Extra state for the warning (limiters, sandboxes), called when it is logged.
    """

    def __init__(self, interval: float, describe: Callable[[], str] | None = None) -> None:
        if not interval > 0:
            raise ValueError(f"watchdog interval must be > 0 seconds, got {interval!r}")
        self.interval = interval
        self.describe = describe
        self._waits: dict[int, tuple[str, float]] = {}
        self._ids = itertools.count()
        self._last_progress = 0.0  # set when run() starts (no event loop yet here)
        #: How many stall warnings were logged.
        self.warnings = 0

    def progress(self) -> None:
        """Something finished (a rollout, a group, an eval item)."""
        self._last_progress = anyio.current_time()

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Register ``what`` as waited on for the block."""
        wait_id = next(self._ids)
        self._waits[wait_id] = (what, anyio.current_time())
        try:
            yield
        finally:
            del self._waits[wait_id]

    def report(self) -> str:
        """What the run waits on now, oldest first."""
        now = anyio.current_time()
        waits = sorted(self._waits.values(), key=lambda w: w[1])
        lines = [f"{what} (for {now - since:.0f} s)" for what, since in waits[:20]]
        if len(waits) > 20:
            lines.append(f"... and {len(waits) - 20} more")
        text = "; ".join(lines) or "nothing registered"
        if self.describe is not None:
            try:
                text += f" | {self.describe()}"
            except Exception:  # the report must never break the run
                logger.debug("watchdog describe() failed", exc_info=True)
        return text

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Log a warning per ``interval`` without progress; runs until cancelled.

        **Cancellation**: nothing to clean up.
        """
        task_status.started()
        self._last_progress = anyio.current_time()
        warned_at = -math.inf
        tick = min(self.interval / 4, 10.0)
        while True:
            await anyio.sleep(tick)
            now = anyio.current_time()
            idle = now - self._last_progress
            if idle >= self.interval and now - warned_at >= self.interval:
                warned_at = now
                self.warnings += 1
                logger.warning(
                    "watchdog: nothing finished for %.0f s; waiting on: %s", idle, self.report()
                )
