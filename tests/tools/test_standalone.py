"""A standalone ``ToolContext(task_id)`` on Docker (``TERMINAL_ENV=docker``).

Kept out of ``tests/agent/`` on purpose: the blocking-call detector runs there, and the Docker
backend's start-up (``resolve_docker_host``'s socket check) is not the subject of this test.
"""

from __future__ import annotations

import pytest

from hermes_async.tool_context import ToolContext

pytestmark = pytest.mark.anyio


@pytest.mark.docker
@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {}), id="asyncio")])
async def test_standalone_docker_context(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.tools.sandbox.test_docker import TEST_IMAGE, _engine_url, _our_containers, _request

    try:
        status, _ = _request(_engine_url(), "/_ping", timeout=3)
    except OSError:
        status = 0
    if status != 200:
        pytest.skip("no Docker engine answers")
    monkeypatch.setenv("TERMINAL_ENV", "docker")
    monkeypatch.setenv("TERMINAL_DOCKER_IMAGE", TEST_IMAGE)
    ctx = ToolContext("solo-docker", sandbox_options={"image": TEST_IMAGE, "pull_missing": False})
    try:
        await ctx.write_file("/root/a.txt", "in a container\n")
        assert (await ctx.terminal("cat /root/a.txt"))["output"] == "in a container\n"
        assert len(_our_containers(_engine_url())) == 1
    finally:
        await ctx.cleanup()
    assert _our_containers(_engine_url()) == []
