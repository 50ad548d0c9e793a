"""The trainer tests: each drives an adapter through a trainer's own package.

They run in that trainer's venv (`make test-trainers`, scripts/trainers/run_tests.sh); elsewhere
the package is missing and they skip, unless HERMES_ASYNC_REQUIRE_TRAINERS=1 (what
`make test-trainers` sets), which makes a missing package a failure.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str) -> ModuleType:
    """Import ``module`` or skip (fail under HERMES_ASYNC_REQUIRE_TRAINERS=1)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("HERMES_ASYNC_REQUIRE_TRAINERS") == "1":
            pytest.fail(f"HERMES_ASYNC_REQUIRE_TRAINERS=1 but {module} does not import: {exc}")
        pytest.skip(f"{module} is not installed here (make test-trainers builds its venv)")
