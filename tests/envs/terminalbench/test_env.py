"""TerminalBench2EvalEnv: selection, the oracle/null pass over the env on Docker, the row
format, per-item sandboxes (built once, cpus/memory inside), model rollouts scored by the
verifier (Phase 1 eval rows, Phase 2 groups) against the scripted model server."""

from __future__ import annotations

import json
import shlex
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from hermes_async.envs.terminalbench import (
    BUNDLED_FIXTURES,
    BUNDLED_ROWS,
    BUNDLED_TASKS,
    HarborTask,
    load_dataset,
)
from hermes_async.envs.terminalbench.env import (
    TerminalBench2EvalEnv,
    TerminalBench2EvalEnvConfig,
)
from hermes_async.envs.terminalbench.expect import expectation_for, mismatch
from hermes_async.envs.terminalbench.job import JobWriter
from hermes_async.envs.terminalbench.report import pass_metrics
from hermes_async.envs.terminalbench.trial import TrialResult
from hermes_async.tools.sandbox.docker import DockerBackend
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.sandbox.spec import SandboxSpec
from tests.envs.helpers import serve_policy, server_config
from tests.support import tool_call

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    # atroposlib and aiodocker are asyncio-only.
    return ("asyncio", {"debug": True})


def make_env(
    tmp_path: Path, url: str = "http://127.0.0.1:9", server_type: str = "openai", **overrides: Any
) -> TerminalBench2EvalEnv:
    config, _ = TerminalBench2EvalEnv.config_init()
    values = config.model_dump()
    values.update(
        use_wandb=False,
        data_path_to_save_groups=None,
        data_dir_to_save_evals=str(tmp_path / "evals"),
        server_connect_timeout=5.0,
        rows_cache_dir=str(tmp_path / "rows"),
    )
    values.update(overrides)
    return TerminalBench2EvalEnv(
        TerminalBench2EvalEnvConfig(**values), [server_config(url, server_type)]
    )


def test_task_filter_and_skip_tasks_select_exactly(tmp_path: Path) -> None:
    env = make_env(
        tmp_path, task_filter="git-recover,log-summary,no-such-task", skip_tasks="log-summary"
    )
    assert [t.name for t in env.load_tasks()] == ["git-recover"]
    env = make_env(tmp_path, skip_tasks="git-recover,slow-verifier")
    every = [t.name for t in load_dataset(BUNDLED_TASKS).tasks]
    assert [t.name for t in env.load_tasks()] == [
        n for n in every if n not in ("git-recover", "slow-verifier")
    ]
    with pytest.raises(Exception, match="no task to run"):
        make_env(tmp_path, task_filter="no-such-task").load_tasks()


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {}), id="trio")])
async def test_run_tasks_under_trio_is_a_clear_error(tmp_path: Path, anyio_backend: object) -> None:
    from hermes_async.errors import AsyncBackendError

    env = make_env(tmp_path, agent="oracle")
    with pytest.raises(AsyncBackendError, match="asyncio"):
        await env.run_tasks(ALL_TASKS[:1])


def _check(trials: list[TrialResult], agent: str) -> None:
    problems = []
    for trial in trials:
        task = next(t for t in ALL_TASKS if t.name == trial.task)
        expected = expectation_for(task, agent)  # type: ignore[arg-type]
        if expected is not None and (why := mismatch(trial, expected)):
            problems.append(f"{task.name}: {why}")
    assert problems == []


ALL_TASKS: list[HarborTask] = [
    *load_dataset(BUNDLED_TASKS).tasks,
    *load_dataset(BUNDLED_FIXTURES).tasks,
]


@pytest.mark.docker
@pytest.mark.usefixtures("base_image")
async def test_oracle_and_null_through_the_env_on_docker(tmp_path: Path) -> None:
    env = make_env(tmp_path, agent="oracle", max_concurrent_tasks=4)
    root = tmp_path / "evals"
    writer = JobWriter(root, config={"agent": "oracle"}, resume=False)
    with anyio.fail_after(900):
        async with env.open_sandboxes():
            oracle = await env.run_tasks(ALL_TASKS, writer=writer)
    writer.close()
    _check(oracle, "oracle")
    bundled_names = {t.name for t in load_dataset(BUNDLED_TASKS).tasks}
    bundled = [t for t in oracle if t.task in bundled_names]
    assert len(bundled) == len(bundled_names) and all(t.reward == 1.0 for t in bundled)
    by_name = {t.task: t for t in oracle}
    assert by_name["no-reward"].status == "verifier" and by_name["no-reward"].reward is None
    assert by_name["verifier-timeout"].status == "verifier"
    assert by_name["hygiene-plant"].reward == 0.0 and by_name["hygiene-daemon"].reward == 0.0

    lines = [json.loads(x) for x in (root / "results.jsonl").read_text().splitlines()]
    assert len(lines) == len(ALL_TASKS)
    for row in lines:
        assert {"task", "category", "reward", "status", "agent_seconds", "verifier_seconds"} <= set(
            row
        )
        trial = root / row["trial"]
        result = json.loads((trial / "result.json").read_text())
        assert result["task_name"] == row["task"]
        assert result["hermes_async"]["status"] == row["status"]
        atif = json.loads((trial / "agent" / "trajectory.json").read_text())
        assert atif["schema_version"].startswith("ATIF-") and atif["steps"][0]["source"] == "user"
    assert (root / "git-recover__oracle-0" / "verifier" / "reward.txt").read_text().strip() == "1"
    no_reward = next(r for r in lines if r["task"] == "no-reward")
    assert no_reward["reward"] is None and no_reward["status"] == "verifier"
    metrics = pass_metrics(oracle)
    assert metrics["eval/pass_rate"] == pytest.approx(len(bundled_names) / len(ALL_TASKS))

    null_env = make_env(tmp_path, agent="null")
    with anyio.fail_after(900):
        async with null_env.open_sandboxes():
            null = await null_env.run_tasks(load_dataset(BUNDLED_TASKS).tasks)
    _check(null, "null")
    assert all(t.status == "ok" and t.reward == 0.0 for t in null)


@pytest.mark.docker
@pytest.mark.usefixtures("base_image")
async def test_hermes_rows_run_through_the_oracle_in_the_env(tmp_path: Path) -> None:
    env = make_env(tmp_path, agent="oracle", dataset=str(BUNDLED_ROWS))
    await env.setup()
    assert len(env.tasks) == 2
    with anyio.fail_after(600):
        async with env.open_sandboxes():
            runs = await env.run_tasks()
    assert [(t.status, t.reward) for t in runs] == [("ok", 1.0)] * 2


@pytest.mark.docker
@pytest.mark.usefixtures("base_image")
async def test_spec_image_built_once_and_limits_reach_the_container(tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    marker = uuid.uuid4().hex  # a context no earlier run built
    (context / "Dockerfile").write_text(
        f"FROM hermes-async-base:bookworm\nRUN echo {marker} > /marker\nWORKDIR /srv/app\n"
    )
    backend = DockerBackend()
    spec = SandboxSpec(build_context=context, cpus=0.5, memory_mb=300)
    with anyio.fail_after(600):
        async with SandboxManager(backend) as manager:
            for task_id in ("a", "b", "c"):
                manager.assign_spec(task_id, spec)
            sandboxes = {}

            async def get(task_id: str) -> None:
                sandboxes[task_id] = await manager.get(task_id)

            async with anyio.create_task_group() as tg:
                for task_id in ("a", "b", "c"):
                    tg.start_soon(get, task_id)
            assert backend.images.builds == 1
            done = await sandboxes["a"].exec(PROBE)
    assert done.exit_code == 0, done.output
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    quota, period = (int(x) for x in lines["cpu"].split())
    assert quota / period == pytest.approx(0.5)
    assert int(lines["mem"]) == 300 << 20
    assert (lines["marker"], lines["pwd"]) == (marker, "/srv/app")  # the image's WORKDIR


PROBE = r"""
if [ -f /sys/fs/cgroup/cpu.max ]; then
    echo "cpu $(cat /sys/fs/cgroup/cpu.max)"; echo "mem $(cat /sys/fs/cgroup/memory.max)"
else
    echo "cpu $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
    echo "mem $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
fi
echo "marker $(cat /marker)"
echo "pwd $(pwd)"
"""


def _solutions() -> dict[str, str]:
    return {
        t.instruction.strip(): (t.path / "solution" / "solve.sh").read_text()
        for t in ALL_TASKS
        if (t.path / "solution" / "solve.sh").is_file()
    }


def solving_policy() -> Any:
    """Runs the task's solve.sh through the terminal tool, then answers."""
    solutions = _solutions()

    def policy(request: Any) -> str:
        messages = list(request.messages)
        users = [m for m in messages if m.get("role") == "user"]
        script = solutions.get(str(users[-1].get("content") or "").strip()) if users else None
        if script is None:
            return "I do not know this task."
        if not any(m.get("role") == "tool" for m in messages):
            return tool_call("terminal", {"command": f"bash -c {shlex.quote(script)}"})
        return "Done."

    return policy


@pytest.mark.docker
@pytest.mark.usefixtures("base_image")
async def test_model_agent_is_scored_by_the_verifier(tmp_path: Path) -> None:
    async with serve_policy(solving_policy()) as (url, _):
        env = make_env(tmp_path, url, "openai", task_filter="organize-files,log-summary")
        await env.setup()
        names = {t.name for t in env.tasks}
        fixtures = [t for t in ALL_TASKS if t.name == "no-reward"]
        writer = JobWriter(tmp_path / "job", config={}, resume=False)
        with anyio.fail_after(600):
            async with env.open_sandboxes():
                runs = await env.run_tasks([*env.tasks, *fixtures], writer=writer)
        writer.close()
    by_name = {t.task: t for t in runs}
    for name in names:
        trial = by_name[name]
        assert (trial.status, trial.reward, trial.agent) == ("ok", 1.0, "model")
        folder = tmp_path / "job" / f"{name}__model-0"
        atif = json.loads((folder / "agent" / "trajectory.json").read_text())
        assert any("observation" in step for step in atif["steps"])  # the tool's output
        assert (folder / "verifier" / "reward.txt").read_text().strip() == "1"
    assert by_name["no-reward"].status == "verifier"
    assert by_name["no-reward"].reward is None


@pytest.mark.docker
@pytest.mark.usefixtures("base_image")
async def test_process_gives_phase2_groups_with_the_verifier_reward(tmp_path: Path) -> None:
    async with serve_policy(solving_policy()) as (url, _):
        env = make_env(tmp_path, url, "vllm", group_size=2, task_filter="organize-files")
        assert env.phase == 2
        await env.setup()
        with anyio.fail_after(600):
            async with env.open_sandboxes():
                group, _ = await env.collect_trajectories(env.tasks[0])
                no_reward = next(t for t in ALL_TASKS if t.name == "no-reward")
                dropped, _ = await env.collect_trajectories(no_reward)
    assert group is not None and group["scores"] == [1.0, 1.0]
    for tokens, masks, logprobs in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        assert any(m != -100 for m in masks)
    assert dropped is None  # a rollout without a verifier reward drops its group, never 0


@pytest.mark.docker
@pytest.mark.usefixtures("base_image")
async def test_process_command_writes_phase2_groups_scored_by_the_verifier(tmp_path: Path) -> None:
    import subprocess
    import sys

    groups_path = tmp_path / "groups.jsonl"
    async with serve_policy(solving_policy()) as (url, _):
        with anyio.fail_after(600):
            done = await anyio.run_process(
                [
                    sys.executable,
                    "-m",
                    "hermes_async.envs.terminalbench",
                    "process",
                    "--env.total_steps",
                    "1",
                    "--env.group_size",
                    "2",
                    "--env.task_filter",
                    "sales-summary",
                    "--env.use_wandb",
                    "false",
                    "--env.data_path_to_save_groups",
                    str(groups_path),
                    "--openai.base_url",
                    url + "/v1",
                ],
                check=False,
                stdin=subprocess.DEVNULL,
            )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    groups = [json.loads(line) for line in groups_path.read_text().splitlines()]
    assert len(groups) == 1 and groups[0]["scores"] == [1.0, 1.0]
    assert all(
        len(t) == len(m) for t, m in zip(groups[0]["tokens"], groups[0]["masks"], strict=True)
    )
