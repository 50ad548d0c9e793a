"""Acceptance (issue #14): the reference's documented example environment, ported with only
``await`` added (``tests/envs/reference_port_env.py``), runs in ``process``, ``evaluate`` and
``serve`` as a program, against the scripted model on loopback.

``--env.terminal_backend local`` replaces the example's ``modal`` and ``--openai.base_url`` its
OpenRouter URL on the command line, as a user without Modal credentials would run it; the
``evaluate`` run uses ``--env.eval_size``, a field the example's config class never declares.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from hermes_async.testing.scripted_server import PolicyRequest
from tests.envs.helpers import serve_policy
from tests.envs.test_serve import BIN, free_port, running, wait_until_up
from tests.support import tool_call

pytestmark = pytest.mark.anyio

PORT = Path(__file__).with_name("reference_port_env.py")
ROOT = Path(__file__).resolve().parents[2]
_TASK = re.compile(r"prints (\d+) \+ (\d+)")


def solver(request: PolicyRequest) -> str:
    """The scripted model: writes solution.py with the file tool, then answers."""
    match = _TASK.search(request.last_user_text)
    if match is None:
        return "I do not know this task."
    if not any(m.get("role") == "tool" for m in request.messages):
        a, b = match.groups()
        return "Writing it.\n" + tool_call(
            "write_file", {"path": "solution.py", "content": f"print({a} + {b})\n"}
        )
    return "Done: solution.py prints the sum."


def port_command(mode: str, url: str, *args: str) -> list[str]:
    return [
        sys.executable,
        str(PORT),
        mode,
        "--env.terminal_backend",
        "local",
        "--env.use_wandb",
        "false",
        "--openai.base_url",
        url + "/v1",
        "--openai.model_name",
        "scripted",
        "--openai.api_key",
        "x",
        "--openai.health_check",
        "false",
        *args,
    ]


def env_vars(tmp_path: Path) -> dict[str, str]:
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir(exist_ok=True)
    # Process isolation: the example runs `python solution.py`, and the host's `python` (a
    # pyenv shim on these machines) is not inside a namespaced world (system paths only).
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(sandboxes),
        "HERMES_SANDBOX_ISOLATION": "process",
    }


def leftovers(tmp_path: Path) -> list[str]:
    return [p.name for p in (tmp_path / "sandboxes").iterdir() if p.name.startswith("hermes-sbx-")]


async def run(command: list[str], tmp_path: Path) -> str:
    with anyio.fail_after(180):
        done = await anyio.run_process(command, env=env_vars(tmp_path), check=False)
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, out[-4000:]
    return out


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("server_type", ["openai", "vllm"], ids=["chat-server", "token-server"])
async def test_process_mode(tmp_path: Path, server_type: str) -> None:
    groups_path = tmp_path / "groups.jsonl"
    async with serve_policy(solver) as (url, _):
        await run(
            port_command(
                "process",
                url,
                "--openai.server_type",
                server_type,
                "--env.total_steps",
                "2",
                "--env.group_size",
                "2",
                "--env.data_path_to_save_groups",
                str(groups_path),
            ),
            tmp_path,
        )
    groups = [json.loads(line) for line in groups_path.read_text().splitlines()]
    assert len(groups) == 2 and all(g["scores"] == [1.0, 1.0] for g in groups)
    assert groups_path.with_suffix(".html").is_file()
    assert leftovers(tmp_path) == []


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_evaluate_mode(tmp_path: Path) -> None:
    evals = tmp_path / "evals"
    async with serve_policy(solver) as (url, server):
        await run(
            port_command(
                "evaluate",
                url,
                "--env.eval_size",
                "2",
                "--env.data_dir_to_save_evals",
                str(evals),
            ),
            tmp_path,
        )
    metrics = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert metrics == {"eval/mean_reward": 1.0}
    samples = [json.loads(line) for line in (evals / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(s["reward"] == 1.0 for s in samples)
    # The guide's evaluate drives self.server (atroposlib's manager): chat completions.
    assert {r.protocol for r in server.requests} == {"chat"} and len(server.requests) == 4
    assert leftovers(tmp_path) == []


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_serve_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    async with (
        serve_policy(solver) as (url, _),
        running(
            [str(BIN / "run-api"), "--host", "127.0.0.1", "--port", str(api_port)],
            tmp_path / "api.log",
        ),
        httpx.AsyncClient(base_url=api, timeout=10) as client,
    ):
        await wait_until_up(client, "/", 40)
        registration = {
            "wandb_group": "port",
            "wandb_project": "port",
            "batch_size": 2,
            "max_token_len": 16384,
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "save_checkpoint_interval": -1,
            "starting_step": 0,
            "num_steps": 100,
        }
        assert "uuid" in (await client.post("/register", json=registration)).json()
        await client.get("/batch")  # the trainer has started: envs may register now
        command = port_command(
            "serve",
            url,
            "--openai.server_type",
            "vllm",
            "--env.rollout_server_url",
            api,
            "--env.group_size",
            "2",
            "--env.max_num_workers",
            "1",
            "--env.total_steps",
            "100",
            "--env.ensure_scores_are_not_same",
            "false",
        )
        monkeypatch.setenv("PYTHONPATH", str(ROOT))  # `running` passes os.environ on
        monkeypatch.setenv("HERMES_SANDBOX_ISOLATION", "process")  # see env_vars
        async with running(command, tmp_path / "env.log", tmp_path / "sandboxes") as env:
            with anyio.fail_after(120):
                while True:
                    batch = (await client.get("/batch")).json().get("batch")
                    if batch:
                        break
                    await anyio.sleep(0.2)
        assert env.returncode == 143, (tmp_path / "env.log").read_text()[-3000:]
    assert sum(len(g["tokens"]) for g in batch) == 2
    assert all(g["scores"] == [1.0, 1.0] for g in batch)
    assert all(g["inference_logprobs"] is not None for g in batch)
    assert leftovers(tmp_path) == []
