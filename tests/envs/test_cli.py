"""``MyEnv.cli()`` as a user meets it: unknown names, a failed start-up, a dead server, wandb.

Issue #34: ``--env.max_agent_turn 5`` and ``--openai.server_typ vllm`` ran with the defaults
(argparse took the prefix, atroposlib dropped the value); a failed start-up printed the whole
config and a traceback; a refused server gave 10 s of silence; ``process`` crashed on a
missing wandb login although ``config_init`` had ``use_wandb=False``.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from hermes_async.envs import HermesAgentEnvConfig
from hermes_async.envs._cli import _wandb_choice
from hermes_async.envs.terminal_test import TerminalTestEnv, terminal_test_oracle
from hermes_async.errors import ConfigError
from tests.envs.helpers import serve_policy
from tests.timed_output import Run, run_timed

pytestmark = pytest.mark.anyio

ENV = [sys.executable, "-m", "hermes_async.envs.terminal_test"]


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


class KnobConfig(HermesAgentEnvConfig):
    my_knob: int = 1


def test_a_config_keyword_that_is_not_a_field_names_the_closest() -> None:
    with pytest.raises(ConfigError) as raised:
        HermesAgentEnvConfig(max_agent_turn=5)
    assert str(raised.value) == (
        "unknown HermesAgentEnvConfig field: 'max_agent_turn'; did you mean 'max_agent_turns'?"
    )
    assert KnobConfig(my_knob=3, max_agent_turns=4).my_knob == 3  # a subclass's field is valid
    with pytest.raises(ConfigError, match=r"unknown KnobConfig field: 'my_knb'.*'my_knob'"):
        KnobConfig(my_knb=3)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--env.max_agent_turn", "5"],
            "'--env.max_agent_turn'; did you mean '--env.max_agent_turns'?",
        ),
        (
            ["--openai.server_typ=vllm"],
            "'--openai.server_typ'; did you mean '--openai.server_type'?",
        ),
        (
            ["--env.server_type", "vllm"],
            "'--env.server_type'; did you mean '--openai.server_type'?",
        ),
        (["--env.zzzzzz", "1"], "'--env.zzzzzz'; run with --help for the flags"),
    ],
)
def test_an_unknown_flag_fails_before_anything_starts(
    argv: list[str],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "argv", ["my_env.py", "process", *argv])
    with pytest.raises(SystemExit) as exited:
        TerminalTestEnv.cli()
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"my_env.py process: unknown flag: {expected}\n"


def test_an_unknown_yaml_key_fails_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text("env:\n  group_size: 2\n  max_agent_turn: 5\nopenai:\n  - base_url: x\n")
    monkeypatch.setattr(sys, "argv", ["my_env.py", "evaluate", "--config", str(config)])
    with pytest.raises(SystemExit) as exited:
        TerminalTestEnv.cli()
    assert exited.value.code == 2
    assert f"unknown key in the env section of {config}: 'max_agent_turn'; did you mean " in (
        capsys.readouterr().err
    )
    config.write_text("openai:\n  - base_url: x\n    model_nam: y\n")
    with pytest.raises(SystemExit):
        TerminalTestEnv.cli()
    assert "'model_nam'; did you mean 'model_name'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "yaml", "expected"),
    [
        (["--env.max_agent_turns", "0"], None, "bad config value: max_agent_turns: Input should "),
        (["--openai.timeout", "abc"], None, "bad config value: openai.timeout: Input should be "),
        ([], b"env: \xff\n", "cannot read it: 'utf-8' codec can't decode byte 0xff"),
        ([], b"- 1\n", "the file must be a mapping of names to values, got list"),
        ([], b"env: 3\n", "the env section must be a mapping of names to values, got int"),
        ([], b"openai: [1]\n", "the openai section must be a mapping of names to values"),
        ([], b"a: " + b"[" * 5000 + b"]" * 5000, "cannot read it: nested too deeply"),
        (["--env.tokenizer_name", "/no/such/tokenizer"], None, "'/no/such/tokenizer'"),
    ],
)
def test_a_bad_value_or_config_file_is_one_line(
    argv: list[str],
    yaml: bytes | None,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if yaml is not None:
        (tmp_path / "cfg.yaml").write_bytes(yaml)
        argv = [*argv, "--config", str(tmp_path / "cfg.yaml")]
    monkeypatch.setattr(sys, "argv", ["my_env.py", "evaluate", *argv])
    with pytest.raises(SystemExit) as exited:
        TerminalTestEnv.cli()  # was a traceback: ValidationError, UnicodeDecodeError, ...
    assert exited.value.code in (1, 2)
    err = capsys.readouterr().err
    assert err.startswith("my_env.py evaluate: ") and expected in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_no_command_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["my_env.py", "--env.group_size", "2"])
    with pytest.raises(SystemExit) as exited:
        TerminalTestEnv.cli()  # was AttributeError: 'Namespace' object has no attribute 'cmd'
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "my_env.py: give a command: serve, process, evaluate (--help shows them)\n"
    )


def test_group_size_below_one_is_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"group_size\n.*must be >= 1"):
        HermesAgentEnvConfig(group_size=0)  # was a ValueError from run_group mid-run
    assert HermesAgentEnvConfig(group_size=1).group_size == 1


def test_process_keeps_config_inits_use_wandb_unless_told(tmp_path: Path) -> None:
    assert TerminalTestEnv.config_init()[0].use_wandb is False
    assert _wandb_choice(TerminalTestEnv, ["process"]) is False
    assert _wandb_choice(TerminalTestEnv, ["process", "--env.use_wandb", "true"]) is None
    config = tmp_path / "cfg.yaml"
    config.write_text("env:\n  use_wandb: true\n")
    assert _wandb_choice(TerminalTestEnv, ["process", "--config", str(config)]) is None


# ---------------------------------------------------------------- as a program


async def test_an_unknown_flag_is_one_line_from_the_program() -> None:
    run = await run_timed(
        [*ENV, "process", "--env.max_agent_turn", "5"], env=os.environ, deadline=120
    )
    assert run.returncode == 2
    assert [line.text for line in run.lines] == [
        "terminal_test.py process: unknown flag: '--env.max_agent_turn'; did you mean "
        "'--env.max_agent_turns'?"
    ]


async def test_a_failed_start_up_check_is_one_line(tmp_path: Path) -> None:
    async with serve_policy(terminal_test_oracle()) as (url, server):
        argv = [
            *ENV,
            "evaluate",
            "--env.tool_call_parser",
            "hermez",
            "--openai.base_url",
            url + "/v1",
        ]
        run = await run_timed(argv, env=os.environ, deadline=120)
        verbose = await run_timed([*argv, "--verbose"], env=os.environ, deadline=120)
        assert server.requests == []
    assert run.returncode == 1
    assert len(run.lines) == 1, run.text()  # no config dump, no traceback, no import notice
    assert run.lines[0].text.startswith(
        "terminal_test.py evaluate: start-up check failed, no rollout was run: "
        "--env.tool_call_parser='hermez' is not a tool-call parser"
    )
    assert verbose.returncode == 1
    assert "TerminalTestEnvConfig(" in verbose.text() and "Traceback" in verbose.text()


async def test_a_refused_server_is_named_at_once_with_the_wait() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    argv = [*ENV, "evaluate", "--openai.base_url", url, "--env.server_connect_timeout", "5"]
    run: Run = await run_timed(argv, env=os.environ, deadline=120)
    assert run.returncode == 1
    waiting = run.first("waiting up to 5 s for the model server")
    assert url in waiting.text and "cannot connect" in waiting.text
    failed = run.first("start-up check failed")
    assert "did not answer within 5 s" in failed.text
    # Said at the first refusal, not at the end of the wait.
    assert failed.seconds - waiting.seconds >= 4.0, (waiting, failed)
    assert len(run.lines) == 2, run.text()


async def test_process_runs_without_a_wandb_login_when_config_init_says_no(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env["HOME"] = str(tmp_path)  # no ~/.netrc: no wandb login
    groups = tmp_path / "groups.jsonl"
    async with serve_policy(terminal_test_oracle()) as (url, _):
        argv = [
            *ENV,
            "process",
            "--env.total_steps",
            "1",
            "--env.data_path_to_save_groups",
            str(groups),
            "--openai.base_url",
            url + "/v1",
        ]
        run = await run_timed(argv, env=env, deadline=180)
    assert run.returncode == 0, run.text()[-3000:]
    assert len(groups.read_text().splitlines()) == 1
    assert not (tmp_path / "wandb").exists()
