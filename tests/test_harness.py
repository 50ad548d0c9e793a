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
