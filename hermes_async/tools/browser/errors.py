"""The browser tools' error: the rollout's browser is gone.

A ``SandboxUnavailableError``, so code that handles a lost sandbox, and the rollout
core's infra classification, handle a dead browser too.
"""

from __future__ import annotations

from hermes_async.tools.sandbox.errors import SandboxUnavailableError

__all__ = ("BrowserUnavailableError", "target_closed")


class BrowserUnavailableError(SandboxUnavailableError):
    """The rollout's browser session cannot be used; its page, cookies and history are lost.

    The manager answers this for the same ``task_id`` until the session is released, so a
    rollout never goes on silently on a blank page. ``reason`` is ``"exited"``, ``backend``
    ``"browser"``.
    """

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message, reason="exited", backend="browser", task_id=task_id)
        # The browser's own message, as before (not the sandbox wording around it).
        self.message = message


def target_closed(exc: BaseException) -> bool:
    """Whether a Playwright error means its page, context, browser or driver is gone."""
    return type(exc).__name__ == "TargetClosedError" or "has been closed" in str(exc)
