"""The browser tools' error: the rollout's browser is gone.

Defined here because ``hermes_async.errors`` has no sandbox-unavailable class yet; it derives
from :class:`~hermes_async.errors.SandboxError`, so code that handles "the rollout's sandbox
failed" handles it too, and can be re-parented onto a ``SandboxUnavailableError`` later without
changing callers.
"""

from __future__ import annotations

from hermes_async.errors import SandboxError

__all__ = ("BrowserUnavailableError", "target_closed")


class BrowserUnavailableError(SandboxError):
    """The rollout's browser session cannot be used: the browser crashed, the page crashed,
    the manager is closed, or a context could not be opened.

    The session's state (page, cookies, history) is lost. The manager keeps answering this error
    for the same ``task_id`` until the session is released, so a rollout never continues
    silently on a blank page; the next session gets a fresh browser.
    """


def target_closed(exc: BaseException) -> bool:
    """Whether a Playwright error means its page, context, browser or driver is gone."""
    return type(exc).__name__ == "TargetClosedError" or "has been closed" in str(exc)
