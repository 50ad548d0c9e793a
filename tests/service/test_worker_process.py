"""``hermes-async worker`` as a process: serving, SIGTERM drains, and the exit it reports."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from anyio.abc import Process

from hermes_async.service.wire import GroupRequest, GroupResult
from hermes_async.testing import ScriptedModelServer, open_loopback_server
from hermes_async.tools.sandbox.leftovers import count_sandboxes
from tests.service.test_worker import SERVER

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def worker_process(
    tmp_path: Path, *args: str, server: ScriptedModelServer = SERVER
) -> AsyncIterator[tuple[Process, str]]:
    """``hermes-async worker`` on the scripted server; yields the process and its URL."""
    async with open_loopback_server(server) as model_url:
        command = [
            sys.executable,
            "-m",
            "hermes_async.cli",
            "worker",
            "--env",
            "echo=hermes_async.testing.worker_tasks:echo_task",
            "--server",
            model_url,
            "--port",
            "0",
            "--name",
            "w-proc",
            "--sandbox-root",
            str(tmp_path / "roots"),
            "--isolation",
            "process",
            *args,
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        async with await anyio.open_process(command, env=env, stderr=None) as proc:
            assert proc.stdout is not None
            with anyio.fail_after(60):
                line = (await proc.stdout.receive()).decode()
            assert "serving on http://127.0.0.1:" in line, line
            try:
                yield proc, line.split("serving on ")[1].strip()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


async def wait_running(client: httpx.AsyncClient, groups: int) -> None:
    with anyio.fail_after(30):
        while (await client.get("/statistics")).json()["groups_running"] < groups:
            await anyio.sleep(0.05)


async def post(client: httpx.AsyncClient, item: dict[str, Any], into: list[httpx.Response]) -> None:
    request = GroupRequest.within(60, "echo", item, 2)
    into.append(await client.post("/groups", content=request.to_bytes()))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the client's loop; the worker's varies
@pytest.mark.parametrize("worker_loop", [[], ["--trio"]], ids=["worker-asyncio", "worker-trio"])
async def test_sigterm_lets_running_groups_finish_and_refuses_new_ones(
    tmp_path: Path, worker_loop: list[str]
) -> None:
    async with (
        worker_process(tmp_path, "--drain-timeout", "30", *worker_loop) as (proc, url),
        httpx.AsyncClient(base_url=url, timeout=60) as client,
    ):
        answers: list[httpx.Response] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(post, client, {"label": "a", "sleep": 1.5}, answers)
            await wait_running(client, 1)
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(10):
                while (await client.get("/health")).status_code != 503:
                    await anyio.sleep(0.05)
            late: list[httpx.Response] = []
            await post(client, {"label": "b"}, late)
            assert late[0].status_code == 503
            assert "takes no new groups" in late[0].json()["error"]
        with anyio.fail_after(30):
            assert await proc.wait() == 0
    [answer] = answers
    assert answer.status_code == 200
    result = GroupResult.from_bytes(answer.content)
    assert result.outcome == "ok" and result.rewards == [1.0, 1.0]
    assert count_sandboxes(str(tmp_path / "roots")) == 0


async def test_sigterm_past_the_drain_timeout_answers_running_groups_as_failed(
    tmp_path: Path,
) -> None:
    async with (
        worker_process(tmp_path, "--drain-timeout", "1") as (proc, url),
        httpx.AsyncClient(base_url=url, timeout=60) as client,
    ):
        answers: list[httpx.Response] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(post, client, {"label": "a", "sleep": 120}, answers)
            await wait_running(client, 1)
            proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await proc.wait() == 3  # the drain had to cancel a group
    [answer] = answers
    result = GroupResult.from_bytes(answer.content)
    assert result.outcome == "failed" and result.failure is not None
    assert result.failure.category == "infra"
    assert "shut down before the group finished" in result.failure.message
    assert count_sandboxes(str(tmp_path / "roots")) == 0


async def test_a_bad_command_line_is_a_clear_error(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "hermes_async.cli",
        "worker",
        "--env",
        "echo=no_such_module:make",
        "--server",
        "http://127.0.0.1:9",
        "--sandbox-root",
        str(tmp_path),
    ]
    done = await anyio.run_process(
        command, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 2
    assert b"no module named 'no_such_module'" in done.stderr
