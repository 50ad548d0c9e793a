"""The one async-library detector and the asyncio-only guard."""

from __future__ import annotations

import anyio
import pytest

from hermes_async._asynclib import current_async_library, loop_options, require_asyncio
from hermes_async.errors import AsyncBackendError, ConfigError

pytestmark = pytest.mark.anyio


async def test_detects_the_running_library(anyio_backend_name: str) -> None:
    assert current_async_library() == anyio_backend_name


async def test_guard_passes_on_asyncio_and_names_component_and_library_elsewhere(
    anyio_backend_name: str,
) -> None:
    if anyio_backend_name == "asyncio":
        require_asyncio("the widget", "widgetlib", remedy="use the gadget")
        return
    with pytest.raises(AsyncBackendError, match=r"the widget needs asyncio.*widgetlib.*gadget"):
        require_asyncio("the widget", "widgetlib", remedy="use the gadget")
    try:
        require_asyncio("the widget", "widgetlib", remedy="x")
    except ConfigError as exc:  # an operator mistake, caught as a config error too
        assert isinstance(exc, AsyncBackendError) and exc.library == "trio"


def test_outside_any_loop_is_none() -> None:
    assert current_async_library() is None
    require_asyncio("x", "y", remedy="z")  # nothing running yet: allowed
    anyio.run(anyio.sleep, 0)


def test_loop_options_name_the_backend_and_uvloop() -> None:
    assert loop_options("asyncio") == {
        "backend": "asyncio",
        "backend_options": {"use_uvloop": False},
    }
    assert loop_options("uvloop") == {"backend": "asyncio", "backend_options": {"use_uvloop": True}}
    assert loop_options("trio") == {"backend": "trio"}
    with pytest.raises(ConfigError, match=r"unknown event loop 'uv'; choose one of asyncio"):
        loop_options("uv")


def test_uvloop_runs_the_loop_on_uvloop() -> None:
    async def loop_type() -> str:
        import asyncio

        return type(asyncio.get_running_loop()).__module__

    assert anyio.run(loop_type, **loop_options("uvloop")).startswith("uvloop")
    assert not anyio.run(loop_type, **loop_options("asyncio")).startswith("uvloop")


def test_uvloop_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'hermes-async\[uvloop\]'"):
        loop_options("uvloop")
