"""The one async-library detector and the asyncio-only guard."""

from __future__ import annotations

import anyio
import pytest

from hermes_async._asynclib import current_async_library, require_asyncio
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
