"""The browser tools' error: the rollout's browser is gone.

It derives from :class:`~hermes_async.tools.sandbox.errors.SandboxUnavailableError` (and so
from :class:`~hermes_async.errors.SandboxError`): code that handles "the rollout's sandbox is
gone" handles a dead browser too, and a rollout core that classifies that error as an
infrastructure failure classifies this one the same way.
"""

from __future__ import annotations

from hermes_async.tools.sandbox.errors import SandboxUnavailableError

__all__ = ("BrowserUnavailableError", "target_closed")


class BrowserUnavailableError(SandboxUnavailableError):
    """The rollout's browser session cannot be used: the browser crashed, the page crashed,
    the manager is closed, or a context could not be opened.

    The session's state (page, cookies, history) is lost. The manager keeps answering this error
    for the same ``task_id`` until the session is released, so a rollout never continues
    silently on a blank page; the next session gets a fresh browser.

    Constructed like a :class:`~hermes_async.errors.SandboxError` (``message``, ``task_id``);
    its ``str()`` is that message, ``reason`` is ``"exited"``, ``backend`` ``"browser"``.
    """

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message, reason="exited", backend="browser", task_id=task_id)
        # The browser's own message, as before (not the sandbox wording around it).
        self.message = message


def target_closed(exc: BaseException) -> bool:
    """Whether a Playwright error means its page, context, browser or driver is gone."""
    return type(exc).__name__ == "TargetClosedError" or "has been closed" in str(exc)
