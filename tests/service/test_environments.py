"""Environments a worker serves: specs, plain functions, and a HermesAgentBaseEnv subclass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes_async.errors import ConfigError
from hermes_async.service.environments import (
    FunctionEnvironment,
    load_environment,
    open_environments,
    parse_spec,
)
from hermes_async.testing.worker_tasks import echo_task


def test_specs_name_an_environment() -> None:
    assert parse_spec("pkg.mod:make") == ("make", "pkg.mod:make")
    assert parse_spec("echo=pkg.mod:make") == ("echo", "pkg.mod:make")
    assert parse_spec("e=dir/tasks.py:make") == ("e", "dir/tasks.py:make")
    for bad in ("pkg.mod", ":make", "pkg.mod:", "a b=pkg:make", "pkg:not-a-name"):
        with pytest.raises(ConfigError, match="environment spec"):
            parse_spec(bad)


def test_load_environment_finds_functions_and_says_what_is_missing(tmp_path: Path) -> None:
    name, source = load_environment("hermes_async.testing.worker_tasks:echo_task")
    assert name == "echo_task" and source == FunctionEnvironment(echo_task)
    tasks = tmp_path / "my_tasks.py"
    tasks.write_text("from hermes_async.testing.worker_tasks import echo_task as make\nVALUE = 3\n")
    assert load_environment(f"mine={tasks}:make")[0] == "mine"
    with pytest.raises(ConfigError, match=r"no module named 'no_such\.mod'"):
        load_environment("no_such.mod:make")
    with pytest.raises(ConfigError, match="has no 'nope'"):
        load_environment("hermes_async.testing.worker_tasks:nope")
    with pytest.raises(ConfigError, match="is 3: expected a function"):
        load_environment(f"{tasks}:VALUE")
    with pytest.raises(ConfigError, match="no such file"):
        load_environment(f"{tmp_path}/missing.py:make")


@pytest.mark.parametrize(
    "content", [b"def make(:\n", b"x = '\xff\xfe'\n"], ids=["syntax", "not-utf8"]
)
def test_a_file_that_does_not_compile_is_one_config_error_and_can_be_fixed(
    tmp_path: Path, content: bytes
) -> None:
    tasks = tmp_path / "broken_tasks.py"
    tasks.write_bytes(content)
    with pytest.raises(ConfigError, match=r"cannot import .*broken_tasks\.py.*fix the file"):
        load_environment(f"{tasks}:make")  # was a SyntaxError traceback
    tasks.write_text("from hermes_async.testing.worker_tasks import echo_task as make\n")
    assert load_environment(f"{tasks}:make")[1] == FunctionEnvironment(echo_task)  # not cached


@pytest.fixture
def terminal_test() -> Any:
    """The module, imported off the event loop (its import loads atroposlib)."""
    pytest.importorskip("atroposlib")
    import hermes_async.envs.terminal_test as module

    return module


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # atroposlib: asyncio only
async def test_a_hermes_agent_env_class_is_built_and_serves_tasks(terminal_test: Any) -> None:
    from hermes_async.tools.sandbox.manager import SandboxManager

    TRAIN_TASKS, TerminalTestEnv = terminal_test.TRAIN_TASKS, terminal_test.TerminalTestEnv

    with pytest.raises(ConfigError, match="two environments named"):
        spec = "hermes_async.testing.worker_tasks:echo_task"
        async with open_environments([f"a={spec}", f"a={spec}"]):
            pass
    async with (
        open_environments({"tt": TerminalTestEnv}, base_url="http://127.0.0.1:9") as envs,
        SandboxManager() as manager,
    ):
        env = envs["tt"]
        assert env.asyncio_only
        task = await env.task(TRAIN_TASKS[0], token_server=True, sandboxes=manager)
    assert task.setup.sandboxes is manager and task.setup.tokenizer is not None
    assert task.messages[-1]["content"] == TRAIN_TASKS[0]["prompt"]
