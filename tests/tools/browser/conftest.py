"""Fixtures of the browser tests: the engine check, a loopback site, a fake resolver.

Tests that drive the real browser use the ``browser_engine`` fixture (directly or through
``manager``): it skips when Playwright or a Chromium executable is missing, and *fails* instead
when ``HERMES_ASYNC_REQUIRE_BROWSER=1`` (CI, after ``scripts/browser/install.sh``).

Playwright is asyncio-only, so these tests run on asyncio (debug mode); the trio behaviour (a
clear ``AsyncBackendError``) has its own tests in ``test_trio.py``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import anyio
import anyio.lowlevel
import pytest

from hermes_async.errors import ConfigError
from hermes_async.tools.browser import BrowserManager, BrowserSettings, find_chromium
from tests.tools.browser.site import Site


def _engine_problem() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is not installed: pip install 'hermes-async[browser]'"
    try:
        find_chromium()
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="session")
def browser_engine() -> str:
    """The Chromium executable; skips (or fails under HERMES_ASYNC_REQUIRE_BROWSER=1)."""
    problem = _engine_problem()
    if problem is not None:
        if os.environ.get("HERMES_ASYNC_REQUIRE_BROWSER") == "1":
            pytest.fail(f"HERMES_ASYNC_REQUIRE_BROWSER=1 but {problem}")
        pytest.skip(problem)
    return find_chromium()


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"debug": True})


def fake_resolver(
    names: Mapping[str, Sequence[str]],
) -> Callable[[str, int], object]:
    """A resolver for the SSRF guard that knows only ``names`` (no real DNS query)."""

    async def resolve(host: str, port: int) -> list[str]:
        await anyio.lowlevel.checkpoint()
        try:
            return list(names[host.lower()])
        except KeyError:
            raise OSError(f"[fake resolver] unknown host {host!r}") from None

    return resolve


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    """A loopback site (empty; tests fill ``site.pages``)."""
    s = Site({})
    async with anyio.create_task_group() as tg:
        await tg.start(s.serve)
        yield s
        tg.cancel_scope.cancel("test over")


@pytest.fixture
async def counting() -> AsyncIterator[Site]:
    """A second loopback server that nothing may reach (the guard tests count its connections)."""
    s = Site({})
    async with anyio.create_task_group() as tg:
        await tg.start(s.serve)
        yield s
        tg.cancel_scope.cancel("test over")


def settings_for_tests(**overrides: object) -> BrowserSettings:
    """Short deadlines, and the loopback site allowed (tests that check the default guard pass
    ``allow=()``)."""
    values: dict[str, object] = {
        "allow": ("127.0.0.1",),
        "launch_timeout": 60.0,
        "action_timeout": 10.0,
        "navigation_timeout": 20.0,
        "fetch_timeout": 10.0,
        "idle_timeout": None,
    }
    values.update(overrides)
    return BrowserSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
async def manager(browser_engine: str) -> AsyncIterator[BrowserManager]:
    async with BrowserManager(settings_for_tests()) as m:
        yield m
