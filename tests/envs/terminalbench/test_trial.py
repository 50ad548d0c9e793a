"""run_trial over a scripted in-memory sandbox: the order of the contract's steps, hygiene,
timeouts and failures (asyncio and trio)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from hermes_async.envs.terminalbench import format_pass_table, load_task, run_trial
from hermes_async.envs.terminalbench.contract import ExecSpec
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.envs.terminalbench.trial import ExecResult, TrialResult, TrialSandbox
from hermes_async.errors import ConfigError
from tests.envs.terminalbench.helpers import make_task

pytestmark = pytest.mark.anyio

Files = dict[str, bytes]


@dataclass
class FakeSandbox:
    """A container as a dict of files; the scripts' effects are Python callbacks."""

    solve: Callable[[Files, ExecSpec], int] = lambda files, spec: 0
    test: Callable[[Files, ExecSpec], int] = lambda files, spec: 0
    hang: set[str] = field(default_factory=set)  # spec.what values that time out
    fail: set[str] = field(default_factory=set)  # spec.what values that exit 1
    files: Files = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    specs: dict[str, ExecSpec] = field(default_factory=dict)

    @property
    def image_workdir(self) -> str | None:
        return "/app"

    def _drop(self, *prefixes: str) -> None:
        for name in list(self.files):
            if name.startswith(prefixes):
                del self.files[name]

    async def exec(self, spec: ExecSpec) -> ExecResult:
        await anyio.lowlevel.checkpoint()
        self.log.append(spec.what)
        self.specs[spec.what] = spec
        if spec.what in self.hang:
            return ExecResult(exit_code=None, timed_out=True)
        if spec.what in self.fail:
            return ExecResult(exit_code=1, output="boom")
        if spec.what == "empty /solution":
            self._drop("/solution/")
        elif spec.what == "empty /tests and /logs/verifier":
            self._drop("/tests/", "/logs/verifier/")
        elif spec.what == "solution/solve.sh":
            return ExecResult(exit_code=self.solve(self.files, spec))
        elif spec.what == "tests/test.sh":
            self.files["/logs/verifier/test-stdout.txt"] = b"ran the tests\n"
            return ExecResult(exit_code=self.test(self.files, spec))
        return ExecResult(exit_code=0)

    async def upload_dir(self, source: Path, target: str) -> None:
        await anyio.lowlevel.checkpoint()
        self.log.append(f"upload {target}")
        for path in source.rglob("*"):
            if path.is_file():
                self.files[f"{target}/{path.relative_to(source).as_posix()}"] = path.read_bytes()

    async def read_file(self, path: str, *, max_bytes: int, tail: bool = False) -> bytes | None:
        await anyio.lowlevel.checkpoint()
        data = self.files.get(path)
        if data is None:
            return None
        return data[-max_bytes:] if tail else data[:max_bytes]


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


def answer_42(files: Files, spec: ExecSpec) -> int:
    files["/app/answer.txt"] = b"42"
    return 0


def grade(files: Files, spec: ExecSpec) -> int:
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
        "verifier.collect[0]",
        "empty /tests and /logs/verifier",
        "upload /tests",
        "chmod /tests",
        "tests/test.sh",
    ]
    solve, test = sandbox.specs["solution/solve.sh"], sandbox.specs["tests/test.sh"]
    assert (solve.user, solve.cwd, dict(solve.env), solve.timeout) == (
        "agent",
        "/app",
        {"S": "1"},
        30.0,
    )
    assert (test.user, test.cwd, test.timeout) == ("root", "/app", 20.0)
    assert dict(test.env) == {"TEST_DIR": "/tests", "K": "v"}
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
    def cheat(files: Files, spec: ExecSpec) -> int:
        files["/logs/verifier/reward.txt"] = b"1"
        files["/tests/test.sh"] = b"echo 1 > /logs/verifier/reward.txt"
        files["/tests/extra.py"] = b"planted"
        return 0

    seen: dict[str, bytes] = {}

    def snapshot_then_grade(files: Files, spec: ExecSpec) -> int:
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
    assert result.error == "the agent ran past 60 s"


async def test_a_failing_collect_hook_does_not_stop_grading(task: HarborTask) -> None:
    sandbox = FakeSandbox(solve=answer_42, test=grade, fail={"verifier.collect[0]"})
    assert (await run_trial(task, sandbox, agent="oracle")).reward == 1.0


async def test_a_failing_bookkeeping_step_is_infra(task: HarborTask) -> None:
    sandbox = FakeSandbox(fail={"empty /tests and /logs/verifier"})
    result = await run_trial(task, sandbox, agent="null")
    assert (result.status, result.reward) == ("infra", None)
    assert result.error is not None and "empty /tests and /logs/verifier exited 1" in result.error
    assert "tests/test.sh" not in sandbox.log


async def test_agent_fn_runs_in_the_agents_place_with_its_deadline(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "quick", "[agent]\ntimeout_sec = 0.05\n"))

    async def slow_agent(task: HarborTask, sandbox: TrialSandbox) -> None:
        await anyio.sleep(30)

    result = await run_trial(task, FakeSandbox(test=grade), agent="model", agent_fn=slow_agent)
    assert (result.status, result.reward, result.agent) == ("agent_timeout", 0.0, "model")
    assert result.agent_seconds < 5

    async def good_agent(task: HarborTask, sandbox: TrialSandbox) -> None:
        assert isinstance(sandbox, FakeSandbox)
        sandbox.files["/app/answer.txt"] = b"42"

    result = await run_trial(task, FakeSandbox(test=grade), agent="model", agent_fn=good_agent)
    assert (result.status, result.reward) == ("ok", 1.0)


async def test_oracle_without_solution_is_a_config_error(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "nosol", solve_sh=None))
    with pytest.raises(ConfigError, match=r"task 'nosol' has no solution/solve.sh"):
        await run_trial(task, FakeSandbox(), agent="oracle")


async def test_partial_credit_from_reward_json(task: HarborTask) -> None:
    def half(files: Files, spec: ExecSpec) -> int:
        files["/logs/verifier/reward.json"] = b'{"reward": 0.5, "a": 1, "b": 0}'
        return 1

    result = await run_trial(task, FakeSandbox(test=half), agent="null")
    assert (result.status, result.reward) == ("ok", 0.5)
    assert result.metrics == {"reward": 0.5, "a": 1.0, "b": 0.0}


def test_pass_table() -> None:
    results = [
        TrialResult("a", "c", "oracle", "ok", 1.0, agent_seconds=1.25, verifier_seconds=2.0),
        TrialResult("b", "c", "oracle", "verifier", None, error="the verifier wrote no reward"),
        TrialResult("a", "c", "null", "ok", 0.0),
    ]
    table = format_pass_table(results).splitlines()
    assert table[0].split() == [
        "task",
        "agent",
        "status",
        "reward",
        "agent",
        "s",
        "verifier",
        "s",
        "note",
    ]
    assert table[1].split() == ["a", "oracle", "ok", "1", "1.2", "2.0"]
    assert table[2].split()[:4] == ["b", "oracle", "verifier", "null"]
    assert (
        table[-2] == "oracle: 1/2 passed (reward 1.0, status ok), mean reward 1, 1 without a reward"
    )
    assert (
        table[-1] == "null: 0/1 passed (reward 1.0, status ok), mean reward 0, 0 without a reward"
    )
