"""The pytest plugin for environment authors, and docs/testing.md's "Test your environment" example.

The example is written to a fresh directory and run by pytest in a subprocess, as an
author's test file would be: its environment tests pass under asyncio and assert the clear error
under trio; its rollout-core test passes under both.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import sys

import anyio
import pytest

from hermes_async.testing.pytest_plugin import (
    EnvRun,
    ScriptedEndpoint,
    normalize_call_ids,
    open_scripted_endpoint,
    run_env_item,
)
from hermes_async.testing.scripted_server import ScriptedModelServer
from hermes_async.tools.sandbox.manager import SandboxManager, current_sandbox_manager

pytestmark = pytest.mark.anyio

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "testing.md"


def readme_example() -> str:
    match = re.search(
        r"<!-- test-env-example:start -->\n```python\n(.*?)```\n<!-- test-env-example:end -->",
        GUIDE.read_text(),
        re.S,
    )
    assert match, "docs/testing.md's test-env example markers are missing"
    return match.group(1)


def plugin_args() -> list[str]:
    installed = any(
        ep.value == "hermes_async.testing.pytest_plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )
    return [] if installed else ["-p", "hermes_async.testing.pytest_plugin"]


def test_entry_point_is_declared() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert (
        '[project.entry-points.pytest11]\nhermes_async = "hermes_async.testing.pytest_plugin"'
        in (text)
    )


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {}), id="asyncio")])
async def test_readme_example_runs_on_asyncio_and_trio(tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_my_env.py").write_text(readme_example())
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with anyio.fail_after(240):
        done = await anyio.run_process(
            [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *plugin_args()],
            cwd=tmp_path,
            env=env,
            check=False,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, out[-4000:] + done.stderr.decode()[-2000:]
    assert "6 passed" in out
    for test in (
        "test_the_oracle_solves_the_task[asyncio]",
        "test_two_runs_give_identical_groups[asyncio]",
        "test_evaluate_one_item[asyncio]",
        "test_environments_say_they_need_asyncio[trio]",
        "test_the_reward_on_the_rollout_core[asyncio]",
        "test_the_reward_on_the_rollout_core[trio]",
    ):
        assert f"{test} PASSED" in out, test


def test_normalize_call_ids() -> None:
    messages = [
        [
            {"role": "assistant", "tool_calls": [{"id": "call_x"}, {"id": "call_y"}]},
            {"role": "tool", "tool_call_id": "call_x", "content": "1"},
            {"role": "tool", "tool_call_id": "call_y", "content": "2"},
            {"role": "assistant", "tool_calls": [{"id": "call_z"}]},
            {"role": "tool", "tool_call_id": "call_z", "content": "3"},
        ]
    ]
    out = normalize_call_ids(messages)
    assert [c["id"] for c in out[0][0]["tool_calls"]] == ["call_0", "call_1"]
    assert [m.get("tool_call_id") for m in out[0][1:3]] == ["call_0", "call_1"]
    assert out[0][4]["tool_call_id"] == "call_2"
    assert messages[0][0]["tool_calls"][0]["id"] == "call_x"  # a copy


async def test_prompt_keyed_randomness_ignores_arrival_order() -> None:
    async def logprobs(order: list[str]) -> dict[str, list[float]]:
        from hermes_async.inference.generate import SamplingParams, VLLMGenerateClient
        from hermes_async.inference.tokenizer import load_tokenizer
        from hermes_async.testing import open_app_endpoint

        tok = load_tokenizer()
        server = ScriptedModelServer(lambda r: "reply " + r.last_user_text, rng_key="prompt")
        seen: dict[str, list[float]] = {}
        async with (
            open_app_endpoint(server, loopback=False) as (url, transport),
            VLLMGenerateClient(url, transport=transport) as client,
        ):
            for text in order:
                ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
                got: list[float] = []
                async with client.stream(ids, SamplingParams(max_tokens=16)) as deltas:
                    async for delta in deltas:
                        got.extend(delta.logprobs)
                seen[text] = got
        return seen

    assert await logprobs(["a", "b"]) == await logprobs(["b", "a"])
    with pytest.raises(ValueError, match="rng_key"):
        ScriptedModelServer(lambda r: "", rng_key="time")  # type: ignore[arg-type]


@pytest.mark.parametrize("hermes_sandbox_backend", ["fake"])
async def test_fixtures_fake_sandboxes_are_current(hermes_sandboxes: SandboxManager) -> None:
    assert current_sandbox_manager() is hermes_sandboxes
    sandbox = await hermes_sandboxes.get("t")
    assert type(sandbox.inner).__name__ == "FakeSandbox"


async def test_default_policy_and_endpoint(hermes_model_server: ScriptedEndpoint) -> None:
    assert hermes_model_server.openai_url.endswith("/v1")
    assert hermes_model_server.server.rng_key == "prompt"
    async with open_scripted_endpoint(lambda r: "x", loopback=False) as inproc:
        assert inproc.transport is not None


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {}), id="asyncio")])
async def test_run_env_item_argument_errors(hermes_model_server: ScriptedEndpoint) -> None:
    from hermes_async.envs.terminal_test import TRAIN_TASKS, TerminalTestEnv

    with pytest.raises(ValueError, match="mode must be"):
        await run_env_item(
            TerminalTestEnv,
            TRAIN_TASKS[0],
            endpoint=hermes_model_server,
            mode="serve",  # type: ignore[arg-type]
        )
    run = EnvRun(env=None)
    assert run.scores == []
    base, _ = TerminalTestEnv.config_init()
    env = TerminalTestEnv(base, [hermes_model_server.server_config()])
    with pytest.raises(TypeError, match="with an environment class"):
        await run_env_item(env, TRAIN_TASKS[0], endpoint=hermes_model_server, group_size=2)
