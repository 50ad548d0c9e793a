"""Terminal-Bench tests: the loader and the contract are pure and anyio-native, so they run on
asyncio and trio (``tests/envs/conftest.py`` pins the atroposlib environments to asyncio).

Docker-marked tests need an engine (``DOCKER_HOST``) and build ``hermes-async-base:bookworm``
once per session through ``scripts/docker/base_image.sh`` (cached: seconds when the image or
its rootfs tarball exists). They skip without an engine, or fail under
``HERMES_ASYNC_REQUIRE_DOCKER=1``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BASE_IMAGE_SCRIPT = REPO / "scripts" / "docker" / "base_image.sh"
#: debootstrap from a cold cache takes about a minute on the reference box; allow for load.
BASE_IMAGE_BUILD_SECONDS = 1500


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"debug": True}), id="asyncio"),
        pytest.param(("trio", {}), id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    return request.param  # type: ignore[no-any-return]


def _unavailable(reason: str) -> None:
    if os.environ.get("HERMES_ASYNC_REQUIRE_DOCKER") == "1":
        pytest.fail(f"HERMES_ASYNC_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """The engine's version; skips (or fails in CI) when no engine answers."""
    try:
        done = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"no docker CLI or engine ({exc})")
    if done.returncode != 0:
        _unavailable(
            f"no Docker engine answers (DOCKER_HOST={os.environ.get('DOCKER_HOST')!r}): "
            f"{done.stderr.strip()[-300:]}"
        )
    return done.stdout.strip()


@pytest.fixture(scope="session")
def base_image(docker_engine: str) -> Iterator[str]:
    """``hermes-async-base:bookworm`` on the engine, built by the project script (cached)."""
    from hermes_async.envs.terminalbench import BASE_IMAGE

    try:
        done = subprocess.run(
            [str(BASE_IMAGE_SCRIPT), "build"],
            capture_output=True,
            text=True,
            timeout=BASE_IMAGE_BUILD_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        _unavailable(f"{BASE_IMAGE_SCRIPT.name} build took more than {BASE_IMAGE_BUILD_SECONDS} s")
    if done.returncode != 0:
        _unavailable(f"{BASE_IMAGE_SCRIPT.name} build failed: {done.stderr.strip()[-800:]}")
    yield BASE_IMAGE
