"""run_trial over a scripted in-memory sandbox: the order of the contract's steps, users,
hygiene, timeouts and failures (asyncio and trio)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from hermes_async.envs.terminalbench import format_pass_table, load_task, run_trial
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.envs.terminalbench.trial import TrialResult
from hermes_async.tools.sandbox.base import ExecRequest, Sandbox
from tests.envs.terminalbench.fakes import ContractSandbox as FakeSandbox, Files
from tests.envs.terminalbench.helpers import make_task

pytestmark = pytest.mark.anyio


TOML = """
schema_version = "1.4"
[metadata]
category = "demo"
[agent]
user = "agent"
timeout_sec = 30.0
[verifier]
user = "root"
timeout_sec = 20.0
[[verifier.collect]]
command = "cp /var/log/x /logs/artifacts/"
[verifier.env]
K = "v"
[solution.env]
S = "1"
"""


@pytest.fixture
def task(tmp_path: Path) -> HarborTask:
    folder = make_task(tmp_path, "demo", TOML)
    (folder / "tests" / "helper.py").write_text("print('hi')\n")
    return load_task(folder)


def answer_42(files: Files, spec: ExecRequest) -> int:
    files["/app/answer.txt"] = b"42"
    return 0


def grade(files: Files, spec: ExecRequest) -> int:
    files["/logs/verifier/reward.txt"] = b"1" if files.get("/app/answer.txt") == b"42" else b"0"
    return 0


async def test_oracle_trial_follows_the_contract(task: HarborTask) -> None:
    sandbox = FakeSandbox(solve=answer_42, test=grade)
    result = await run_trial(task, sandbox, agent="oracle")
    assert sandbox.log == [
        "create /logs",
        "empty /solution",
        "upload /solution",
        "chmod /solution",
        "solution/solve.sh",
        "cp /var/log/x /logs/artifacts/",
        "empty /tests and /logs/verifier",
        "upload /tests",
        "chmod /tests",
        "tests/test.sh",
    ]
    solve, test = sandbox.requests["solution/solve.sh"], sandbox.requests["tests/test.sh"]
    for step in ("create /logs", "empty /solution", "empty /tests and /logs/verifier"):
        assert sandbox.requests[step].user == "root"  # whatever the image's USER
    assert (solve.user, solve.cwd, dict(solve.env or {}), solve.timeout) == (
        "agent",
        "/app",
        {"S": "1"},
        30.0,
    )
    assert (test.user, test.cwd, test.timeout) == ("root", "/app", 20.0)
    assert dict(test.env or {}) == {"TEST_DIR": "/tests", "K": "v"}
    assert (result.status, result.reward, result.error) == ("ok", 1.0, None)
    assert result.metrics == {"reward": 1.0}
    assert result.verifier_stdout == "ran the tests\n"
    assert (result.task, result.category, result.agent) == ("demo", "demo", "oracle")


async def test_null_trial_uploads_no_solution(task: HarborTask) -> None:
    sandbox = FakeSandbox(test=grade)
    result = await run_trial(task, sandbox, agent="null")
    assert "upload /solution" not in sandbox.log and "solution/solve.sh" not in sandbox.log
    assert (result.status, result.reward) == ("ok", 0.0)


async def test_planted_reward_and_tests_are_wiped_before_grading(task: HarborTask) -> None:
    def cheat(files: Files, spec: ExecRequest) -> int:
        files["/logs/verifier/reward.txt"] = b"1"
        files["/tests/test.sh"] = b"echo 1 > /logs/verifier/reward.txt"
        files["/tests/extra.py"] = b"planted"
        return 0

    seen: dict[str, bytes] = {}

    def snapshot_then_grade(files: Files, spec: ExecRequest) -> int:
        seen.update(files)
        return grade(files, spec)

    sandbox = FakeSandbox(solve=cheat, test=snapshot_then_grade)
    result = await run_trial(task, sandbox, agent="oracle")
    assert result.reward == 0.0
    assert "/tests/extra.py" not in seen
    assert seen["/tests/test.sh"] == (task.tests_dir / "test.sh").read_bytes()


async def test_no_reward_file_is_a_verifier_failure_whatever_the_exit_code(
    task: HarborTask,
) -> None:
    for exit_code in (0, 1):
        sandbox = FakeSandbox(test=lambda files, spec, code=exit_code: code)
        result = await run_trial(task, sandbox, agent="null")
        assert (result.status, result.reward) == ("verifier", None)
        assert result.verifier_exit_code == exit_code
        assert (
            result.error
            == "the verifier wrote no /logs/verifier/reward.txt or /logs/verifier/reward.json"
        )


async def test_verifier_timeout(task: HarborTask) -> None:
    sandbox = FakeSandbox(hang={"tests/test.sh"})
    result = await run_trial(task, sandbox, agent="null")
    assert (result.status, result.reward, result.error) == (
        "verifier",
        None,
        "tests/test.sh timed out after 20 s",
    )


async def test_agent_timeout_is_still_graded(task: HarborTask) -> None:
    sandbox = FakeSandbox(hang={"solution/solve.sh"}, test=grade)
    result = await run_trial(task, sandbox, agent="oracle", timeout_multiplier=2.0)
    assert "tests/test.sh" in sandbox.log
    assert (result.status, result.reward) == ("agent_timeout", 0.0)
    assert sandbox.requests["solution/solve.sh"].timeout == 60.0
    assert result.error == "the agent ran past 60 s"


async def test_a_failing_collect_hook_does_not_stop_grading(task: HarborTask) -> None:
    sandbox = FakeSandbox(solve=answer_42, test=grade, fail={"cp /var/log/x /logs/artifacts/"})
    assert (await run_trial(task, sandbox, agent="oracle")).reward == 1.0


async def test_a_failing_bookkeeping_step_is_infra(task: HarborTask) -> None:
    sandbox = FakeSandbox(fail={"empty /tests and /logs/verifier"})
    result = await run_trial(task, sandbox, agent="null")
    assert (result.status, result.reward) == ("infra", None)
    assert result.error is not None and "empty /tests and /logs/verifier exited 1" in result.error
    assert "tests/test.sh" not in sandbox.log


async def test_agent_fn_runs_in_the_agents_place_with_its_deadline(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "quick", "[agent]\ntimeout_sec = 0.05\n"))

    async def slow_agent(task: HarborTask, sandbox: Sandbox) -> None:
        await anyio.sleep(30)

    result = await run_trial(task, FakeSandbox(test=grade), agent="model", agent_fn=slow_agent)
    assert (result.status, result.reward, result.agent) == ("agent_timeout", 0.0, "model")
    assert result.agent_seconds < 5

    async def good_agent(task: HarborTask, sandbox: Sandbox) -> None:
        assert isinstance(sandbox, FakeSandbox)
        sandbox.files["/app/answer.txt"] = b"42"

    result = await run_trial(task, FakeSandbox(test=grade), agent="model", agent_fn=good_agent)
    assert (result.status, result.reward) == ("ok", 1.0)


async def test_oracle_without_solution_is_task_invalid_not_an_error(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "nosol", solve_sh=None))
    sandbox = FakeSandbox()
    result = await run_trial(task, sandbox, agent="oracle")
    assert (result.status, result.reward) == ("task_invalid", None)
    assert result.error == "no solution/solve.sh: it cannot run as oracle"
    assert sandbox.log == []  # decided before anything ran


async def test_partial_credit_from_reward_json(task: HarborTask) -> None:
    def half(files: Files, spec: ExecRequest) -> int:
        files["/logs/verifier/reward.json"] = b'{"reward": 0.5, "a": 1, "b": 0}'
        return 1

    result = await run_trial(task, FakeSandbox(test=half), agent="null")
    assert (result.status, result.reward) == ("ok", 0.5)
    assert result.metrics == {"reward": 0.5, "a": 1.0, "b": 0.0}


def test_pass_table_says_what_metrics_say() -> None:
    from hermes_async.envs.terminalbench import pass_metrics

    results = [
        TrialResult("a", "c", "oracle", "ok", 1.0, agent_seconds=1.25, verifier_seconds=2.0),
        TrialResult("b", "c", "oracle", "verifier", None, error="the verifier wrote no reward"),
        TrialResult("a", "c", "null", "ok", 0.0),
    ]
    table = format_pass_table(results).splitlines()
    assert table[0].split() == [
        "task", "agent", "try", "status", "reward", "agent", "s", "verifier", "s", "note"
    ]  # fmt: skip
    assert table[1].split() == ["a", "oracle", "0", "ok", "1", "1.2", "2.0"]
    assert table[2].split()[:5] == ["b", "oracle", "0", "verifier", "-"]
    assert table[-2] == (
        "oracle: 1/2 passed (reward 1.0, status ok), mean reward 0.500 (no reward counts 0), "
        "1 without a reward"
    )
    assert pass_metrics(results[:2])["eval/mean_reward"] == 0.5
    # Nothing rewarded: the table and the metrics both say 0, neither says nan.
    none = [TrialResult("x", "c", "oracle", "infra", None, error="boom")]
    assert "mean reward 0.000" in format_pass_table(none)
    assert pass_metrics(none)["eval/mean_reward"] == 0.0
    assert "nan" not in format_pass_table(none)
