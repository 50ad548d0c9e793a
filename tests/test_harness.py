from __future__ import annotations

import os

import pytest
import sniffio

pytestmark = pytest.mark.anyio


async def test_backend_matches_id(request: pytest.FixtureRequest) -> None:
    backend_id = request.node.callspec.id
    assert sniffio.current_async_library() == backend_id


def test_offline_environment() -> None:
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["WANDB_MODE"] in {"offline", "disabled"}


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {}), id="asyncio")])
async def test_asyncio_runs_on_the_loop_asked_for(request: pytest.FixtureRequest) -> None:
    """``--uvloop`` (tests/conftest.py) puts every asyncio test on uvloop; without it, asyncio's
    own loop runs them."""
    import asyncio

    from tests.conftest import on_uvloop

    loop_module = type(asyncio.get_running_loop()).__module__
    assert loop_module.startswith("uvloop") == on_uvloop(request.config), loop_module
