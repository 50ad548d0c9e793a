"""`hermes-async serve-gym` as a process: a /run over loopback against the scripted model."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from hermes_async.cli import main

from .test_nemo_gym import BODY, nemo_rl_turns

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "trainers"
sys.path.insert(0, str(EXAMPLES))

from hermes_tasks import scripted_model  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_healthy(http: httpx.AsyncClient, process: anyio.abc.Process) -> None:
    with anyio.fail_after(60):
        while True:
            assert process.returncode is None, "serve-gym exited during startup"
            try:
                if (await http.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await anyio.sleep(0.2)


async def test_serve_gym_answers_run_with_the_wire_ids() -> None:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLES)])}
    async with scripted_model() as (server, url):
        command = [
            sys.executable,
            "-m",
            "hermes_async.cli",
            "serve-gym",
            "--tasks",
            "hermes_tasks:task",
            "--model-url",
            url + "/v1",
            "--port",
            str(port),
        ]
        async with (
            await anyio.open_process(command, env=env) as process,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http,
        ):
            try:
                await _wait_healthy(http, process)
                answer = await http.post("/run", json=BODY)
                refused = await http.post(
                    "/run", json={"responses_create_params": {"input": "x", "top_logprobs": 2}}
                )
            finally:
                process.send_signal(signal.SIGINT)
                with anyio.move_on_after(30, shield=True) as waited:
                    await process.wait()
                if waited.cancelled_caught:
                    process.kill()
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["reward"] == 1.0 and result["mask_sample"] is False
    turns = nemo_rl_turns(result["response"])
    assert len(turns) == 3
    for prompt, completion, logprobs in turns:
        assert any(
            r.prompt_ids == prompt and r.completion_ids == completion and r.logprobs == logprobs
            for r in server.requests
        )
    assert refused.status_code == 422 and "top_logprobs" in refused.json()["detail"]


def test_serve_gym_names_a_task_source_that_does_not_load(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["serve-gym", "--tasks", "no_such_module:x", "--model-url", "http://127.0.0.1:9"])
    assert code == 2
    assert "no_such_module:x" in capsys.readouterr().err
