"""Under trio the browser tools refuse clearly: Playwright's async API is asyncio-only."""

from __future__ import annotations

import json

import pytest

from hermes_async.errors import AsyncBackendError
from hermes_async.tools.browser import (
    BrowserManager,
    BrowserSettings,
    context_browser_navigate,
    context_browser_snapshot,
)
from hermes_async.tools.registry import ToolRuntime, dispatch

pytestmark = pytest.mark.anyio

TRIO_MESSAGE = r"needs asyncio, but this code runs under 'trio'.*playwright is asyncio-only"


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("trio", {})


async def test_opening_a_manager_under_trio_is_a_clear_error() -> None:
    with pytest.raises(AsyncBackendError, match=TRIO_MESSAGE) as info:
        async with BrowserManager(BrowserSettings(executable_path="/nonexistent")):
            pass  # pragma: no cover
    assert info.value.library == "trio"


async def test_the_tools_report_the_backend_error_to_the_model() -> None:
    runtime = ToolRuntime(task_id="t")
    for name, args in (
        ("browser_navigate", {"url": "https://example.com"}),
        ("browser_vision", {"question": "?"}),
    ):
        outcome = await dispatch(name, args, runtime)
        error = json.loads(outcome.content)["error"]
        assert "AsyncBackendError" in error and "needs asyncio" in error
        assert outcome.error is not None


async def test_the_tool_context_functions_raise_it() -> None:
    with pytest.raises(AsyncBackendError, match=TRIO_MESSAGE):
        await context_browser_navigate("t", "https://example.com")
    with pytest.raises(AsyncBackendError, match=TRIO_MESSAGE):
        await context_browser_snapshot("t")


async def test_a_standalone_tool_context_raises_it_and_starts_nothing() -> None:
    from hermes_async.agent import ToolContext

    ctx = ToolContext("t")
    with pytest.raises(AsyncBackendError, match=TRIO_MESSAGE):
        await ctx.browser_navigate("https://example.com")
    assert ctx._standalone_browser is not None and not ctx._standalone_browser.open
    await ctx.cleanup()
