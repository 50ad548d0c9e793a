"""Environment tests run on asyncio only: atroposlib (and so every env) is asyncio-only.

``test_trio.py`` overrides this fixture to assert the clear error under trio.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"debug": True})
