"""Serve mode for real: atroposlib's ``run-api``, a small trainer, two environment processes.

The test process hosts the scripted oracle model on loopback and plays the trainer
(``POST /register``, then ``GET /batch`` until batches from both environments arrived). The
two environments are separate ``python -m hermes_async.envs.terminal_test serve`` processes,
exactly how users scale past one box. Every received group must carry tokens, masks and
``inference_logprobs`` aligned one to one (Phase 2 over the vLLM token protocol).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from anyio.abc import Process

from hermes_async.envs.terminal_test import terminal_test_oracle
from tests.envs.helpers import serve_policy

pytestmark = pytest.mark.anyio

BIN = Path(sys.executable).parent
BATCH_SIZE = 4
GROUP_SIZE = 2
#: How long an environment may take to stop after SIGTERM before it is killed. Alone it takes
#: ~0.7 s (cancel, release sandboxes, close clients, interpreter exit); on a loaded shared
#: machine (load average ~8 on 2 cores) that stretched past the former 5 s and the process was
#: killed (-9), failing the 143 check below although nothing hung.
TERM_GRACE_SECONDS = 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def running(
    command: list[str], log: Path, tmpdir: Path | None = None
) -> AsyncIterator[Process]:
    """Start a process; terminate it (then kill) on exit, bounded."""
    env = dict(os.environ)
    if tmpdir is not None:
        tmpdir.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmpdir)  # where its local sandboxes are created
    with log.open("wb") as sink:
        process = await anyio.open_process(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            yield process
        finally:
            with anyio.move_on_after(TERM_GRACE_SECONDS + 15, shield=True):
                # SIGTERM, as an orchestrator sends it: the environment cancels its run and
                # releases its sandboxes (Python's default would skip every `finally`).
                for stop, grace in ((process.terminate, TERM_GRACE_SECONDS), (process.kill, 5)):
                    if process.returncode is None:
                        stop()
                        with anyio.move_on_after(grace):
                            await process.wait()
                if process.returncode is None:
                    await process.wait()
            await process.aclose()


async def wait_until_up(client: httpx.AsyncClient, url: str, timeout: float) -> None:
    with anyio.fail_after(timeout):
        while True:
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await anyio.sleep(0.2)


def check_group(group: dict[str, Any]) -> None:
    tokens, masks, logprobs = group["tokens"], group["masks"], group["inference_logprobs"]
    assert logprobs is not None and len(tokens) == len(masks) == len(logprobs) == GROUP_SIZE
    for tok_row, mask_row, lp_row in zip(tokens, masks, logprobs, strict=True):
        assert len(tok_row) == len(mask_row) == len(lp_row) > 0
        sampled = 0
        for tok, mask, lp in zip(tok_row, mask_row, lp_row, strict=True):
            if mask == -100:
                assert lp == 1.0
            else:
                assert mask == tok and lp <= 0.0
                sampled += 1
        assert sampled > 0
    assert group["scores"] == [1.0] * GROUP_SIZE
    assert len(group["messages"]) == GROUP_SIZE


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_two_env_processes_feed_a_trainer_through_run_api(tmp_path: Path) -> None:
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    async with (
        serve_policy(terminal_test_oracle()) as (model_url, _),
        running(
            [str(BIN / "run-api"), "--host", "127.0.0.1", "--port", str(api_port)],
            tmp_path / "api.log",
        ),
        httpx.AsyncClient(base_url=api, timeout=10) as client,
    ):
        await wait_until_up(client, "/", 40)
        registration = {
            "wandb_group": "test",
            "wandb_project": "test",
            "batch_size": BATCH_SIZE,
            "max_token_len": 16384,
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "save_checkpoint_interval": -1,
            "starting_step": 0,
            "num_steps": 100,
        }
        assert "uuid" in (await client.post("/register", json=registration)).json()
        await client.get("/batch")  # the trainer has started: envs may register now

        def env_command(name: str) -> list[str]:
            return [
                sys.executable,
                "-m",
                "hermes_async.envs.terminal_test",
                "serve",
                "--env.rollout_server_url",
                api,
                "--env.wandb_name",
                name,
                "--env.use_wandb",
                "false",
                "--env.group_size",
                str(GROUP_SIZE),
                "--env.max_num_workers",
                "2",
                "--env.total_steps",
                "100",
                "--env.ensure_scores_are_not_same",
                "false",
                "--openai.base_url",
                model_url + "/v1",
                "--openai.server_type",
                "vllm",
            ]

        async with (
            running(env_command("env-a"), tmp_path / "env-a.log", tmp_path / "tmp-a") as env_a,
            running(env_command("env-b"), tmp_path / "env-b.log", tmp_path / "tmp-b") as env_b,
        ):
            env_ids: set[int] = set()
            batches = 0
            with anyio.fail_after(90):
                while len(env_ids) < 2 or batches < 2:
                    batch = (await client.get("/batch")).json().get("batch")
                    if not batch:
                        await anyio.sleep(0.2)
                        continue
                    batches += 1
                    assert sum(len(g["tokens"]) for g in batch) == BATCH_SIZE
                    for group in batch:
                        check_group(group)
                        env_ids.add(group["env_id"])
            assert env_ids == {0, 1}
    # Both environments were stopped by SIGTERM mid-run: they exited through their own
    # cleanup (status 143, not killed by the signal) and released their sandboxes.
    assert (env_a.returncode, env_b.returncode) == (143, 143)
    for name in ("tmp-a", "tmp-b"):
        leftovers = [
            p.name for p in (tmp_path / name).iterdir() if p.name.startswith("hermes-sbx-")
        ]
        log = (tmp_path / name.replace("tmp", "env")).with_suffix(".log")
        assert leftovers == [], log.read_text(errors="replace")[-4000:]
