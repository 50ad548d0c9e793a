"""The contract's pure decisions: reward files, statuses, the commands."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from hermes_async.envs.terminalbench.contract import (
    DEFAULT_AGENT_TIMEOUT_SECONDS,
    RewardReading,
    agent_timeout,
    oracle_spec,
    prepare_verifier_spec,
    read_reward,
    trial_status,
    verifier_spec,
    workdir_for,
)
from hermes_async.envs.terminalbench.task import load_task
from tests.envs.terminalbench.helpers import make_task


@pytest.mark.parametrize(
    ("txt", "reward"),
    [(b"1", 1.0), (b"0", 0.0), (b"1\n", 1.0), (b"  0.25 \n", 0.25), (b"1e0", 1.0), (b"-0", 0.0)],
)
def test_reward_txt(txt: bytes, reward: float) -> None:
    assert read_reward(txt, None) == RewardReading(reward, {"reward": reward}, "reward.txt")


@pytest.mark.parametrize(
    ("txt", "error"),
    [
        (b"", "reward.txt is empty"),
        (b" \n", "reward.txt is empty"),
        (b"pass", "reward.txt is not a number: 'pass'"),
        (b"nan", "reward.txt is not a finite number: 'nan'"),
        (b"inf", "reward.txt is not a finite number"),
        (b"1\n0\n", "reward.txt is not a number"),
        # T5: Harbor's range is 0..1; outside is an error reading, never a score.
        (b"-0.5", "reward.txt is -0.5, outside the reward range 0..1"),
        (b"1e308", "reward.txt is 1e+308, outside the reward range 0..1"),
        (b"9" * 400, "reward.txt is not a finite number"),
    ],
)
def test_bad_reward_txt_is_no_reward(txt: bytes, error: str) -> None:
    reading = read_reward(txt, None)
    assert reading.reward is None
    assert reading.error is not None and reading.error.startswith(error)


def test_no_reward_file() -> None:
    reading = read_reward(None, None)
    assert reading.reward is None and reading.source is None
    assert (
        reading.error
        == "the verifier wrote no /logs/verifier/reward.txt or /logs/verifier/reward.json"
    )


def test_reward_json_rules() -> None:
    # The reward key; the other numeric fields are metrics; non-numbers and bools are dropped.
    reading = read_reward(None, b'{"tests": 0.5, "reward": 0.75, "name": "x", "ok": true}')
    assert reading == RewardReading(0.75, {"tests": 0.5, "reward": 0.75}, "reward.json")
    # No reward key: reward.txt's scalar ...
    assert read_reward(b"1", b'{"a": 0.5}').reward == 1.0
    # ... else the first numeric value.
    assert read_reward(None, b'{"label": "x", "a": 0.5, "b": 1}').reward == 0.5
    # A reward.txt that is there but not a reward is an error, not a reason to guess.
    assert read_reward(b"junk", b'{"a": 0.5}').error == "reward.txt is not a number: 'junk'"
    # reward.json wins over reward.txt when both exist.
    assert read_reward(b"0", b'{"reward": 1}').reward == 1.0


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "reward.json is empty"),
        (b"{", "reward.json is not JSON"),
        (b"[1]", "reward.json is not an object"),
        (b'{"reward": "1"}', "reward.json's reward is not a number a float can hold"),
        (b"[" * 100_000, "reward.json is not"),
        (b'{"a": "x"}', "reward.json has no numeric value"),
        # T7: a reward present but not finite is an error, not "the first other number".
        (b'{"reward": NaN, "tests_total": 5}', "reward.json's reward is not a finite number"),
        (b'{"reward": Infinity, "duration_sec": 12.5}', "reward.json's reward is not a finite"),
        # T4: a 400-digit integer does not fit a float: an error reading, nothing raised.
        (b'{"reward": ' + b"9" * 400 + b"}", "reward.json's reward is not a number a float"),
        # T5: out of range.
        (b'{"reward": 1e308}', "reward.json's reward is 1e+308, outside the reward range"),
        (b'{"reward": -1e308}', "reward.json's reward is -1e+308, outside"),
        (b'{"score": 2}', "reward.json's first value ('score') is 2, outside"),
    ],
)
def test_bad_reward_json_is_no_reward(data: bytes, error: str) -> None:
    # reward.json exists, so a good reward.txt does not rescue a broken one (it is only
    # consulted when the reward key is absent).
    has_key = b'"reward"' in data
    reading = read_reward(b"1" if has_key or not data.startswith(b"{") else None, data)
    assert reading.reward is None
    assert reading.error is not None and reading.error.startswith(error)


def test_trial_status_never_uses_the_exit_code() -> None:
    ok = RewardReading(1.0, {"reward": 1.0}, "reward.txt")
    assert trial_status(agent="ok", verifier_timed_out=False, verifier_timeout=60, reading=ok) == (
        "ok",
        1.0,
        None,
    )
    missing = read_reward(None, None)
    assert trial_status(
        agent="ok", verifier_timed_out=False, verifier_timeout=60, reading=missing
    ) == (
        "verifier",
        None,
        missing.error,
    )
    assert trial_status(
        agent="ok", verifier_timed_out=True, verifier_timeout=2.5, reading=None
    ) == (
        "verifier",
        None,
        "tests/test.sh timed out after 2.5 s",
    )
    # An agent timeout is still graded; the status keeps the timeout.
    assert trial_status(
        agent="agent_timeout", verifier_timed_out=False, verifier_timeout=60, reading=ok
    ) == (
        "agent_timeout",
        1.0,
        None,
    )
    # No reward outranks the agent's timeout.
    assert (
        trial_status(
            agent="agent_timeout", verifier_timed_out=False, verifier_timeout=60, reading=missing
        )[0]
        == "verifier"
    )


def test_specs_follow_the_task(tmp_path: Path) -> None:
    toml = """
schema_version = "1.4"
[agent]
user = "agent"
[verifier]
user = "checker"
timeout_sec = 42.0
[verifier.env]
TEST_DIR = "/elsewhere"
MODE = "strict"
[solution.env]
HINT = "x"
"""
    task = load_task(make_task(tmp_path, "t", toml))
    spec = verifier_spec(task, workdir="/app").request
    assert spec.command == "bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"
    assert (spec.user, spec.cwd, spec.timeout) == ("checker", "/app", 42.0)
    assert dict(spec.env or {}) == {"TEST_DIR": "/elsewhere", "MODE": "strict"}  # task's wins
    oracle = oracle_spec(task, workdir="/app").request
    assert oracle.user == "agent" and dict(oracle.env or {}) == {"HINT": "x"}
    assert oracle.timeout == DEFAULT_AGENT_TIMEOUT_SECONDS  # the task sets no agent timeout
    assert agent_timeout(task, 2.0) == 2 * DEFAULT_AGENT_TIMEOUT_SECONDS
    with pytest.raises(ValueError, match="multiplier must be > 0"):
        agent_timeout(task, 0)
    assert workdir_for(task, "/image-workdir") == "/image-workdir"
    assert workdir_for(task, None) == "/"


def test_workdir_from_the_task_wins(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "t", '[environment]\nworkdir = "/srv"\n'))
    assert workdir_for(task, "/app") == "/srv"


def test_prepare_script_is_valid_posix_sh() -> None:
    # dash is Debian's /bin/sh: the script must parse there (-n: syntax only, runs nothing).
    for step in (prepare_verifier_spec(), prepare_verifier_spec(stop_agent_processes=False)):
        assert step.request.user == "root"
        done = subprocess.run(
            ["sh", "-n", "-c", step.request.command], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
    assert "kill -s" in prepare_verifier_spec().request.command
    assert "kill" not in prepare_verifier_spec(stop_agent_processes=False).request.command
    assert "rm -rf /tests /logs/verifier" in prepare_verifier_spec().request.command


def test_the_contracts_own_steps_run_as_root() -> None:
    from hermes_async.envs.terminalbench.contract import (
        prepare_solution_spec,
        read_spec,
        readable_spec,
        setup_spec,
    )

    for step in (
        setup_spec(),
        prepare_solution_spec(),
        readable_spec("/tests"),
        prepare_verifier_spec(),
        read_spec("/logs/verifier/reward.txt", max_bytes=10, tail=False),
    ):
        assert step.request.user == "root", step.what


def test_nan_is_not_a_metric() -> None:
    reading = read_reward(None, b'{"reward": 0.5, "x": NaN}')
    assert reading.metrics == {"reward": 0.5}
    assert not any(math.isnan(v) for v in reading.metrics.values())


def test_processes_from_before_the_agent_survive_the_hygiene() -> None:
    # An image's entrypoint service (started before the agent) is kept; what the agent
    # started is stopped. The snapshot comes from setup_spec's output.
    from hermes_async.envs.terminalbench.contract import parse_pids, setup_spec

    assert "/proc/[0-9]*" in setup_spec().request.command
    keep = parse_pids("1\n7\n12\nnot-a-pid\n")
    assert keep == frozenset({1, 7, 12})
    # The snapshot is the sandbox's output: "²" passes isdigit() and raised ValueError in int().
    assert parse_pids("1\n\u00b2\n-3\n" + "9" * 5000 + "\n") == frozenset({1})
    command = prepare_verifier_spec(keep=keep).request.command
    assert command.startswith("HERMES_KEEP_PIDS='1 7 12'\n")
    assert 'keep=" 1 $$ $idle $HERMES_KEEP_PIDS "' in command
    done = subprocess.run(["sh", "-n", "-c", command], capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
