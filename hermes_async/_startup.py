"""What a command prints when it cannot start: one line with what failed, the value and the fix.

The error messages already say all three (:class:`~hermes_async.errors.HermesAsyncError`); a
command prints ``"<prog>: <message>"`` on stderr and exits non-zero, with no traceback and no
config dump (those are for ``--verbose``). The entry points mark a failed start-up check with
the note :data:`STARTUP_FAILED`, and the line says so.
"""

from __future__ import annotations

from typing import Any

__all__ = ("STARTUP_FAILED", "failure_line", "validation_summary")

#: The note an entry point adds to the error of a failed start-up check.
STARTUP_FAILED = "start-up check failed, no rollout was run"


def failure_line(prog: str, exc: BaseException) -> str:
    """``"<prog>: [start-up check failed, no rollout was run: ]<exc>"`` on one line."""
    started = STARTUP_FAILED in getattr(exc, "__notes__", ())
    text = " ".join(str(exc).split())  # one line, whatever the message holds
    return f"{prog}: {STARTUP_FAILED + ': ' if started else ''}{text}"


def validation_summary(exc: Any, prefix: str = "") -> str:
    """A pydantic ``ValidationError`` as one line: ``<prefix><field>: <why> (got <value>)``
    for each bad field, joined by ``; ``."""
    return "; ".join(
        f"{prefix}{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e['input']!r})"
        for e in exc.errors()
    )
