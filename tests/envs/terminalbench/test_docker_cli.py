"""The contract on a real engine (plain docker CLI): the bundled pass table, hygiene against
a background job, per-task resources inside the container, builds cached by content,
cancellation. Needs DOCKER_HOST and builds the base image once (see conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from hermes_async.envs.terminalbench import (
    BUNDLED_FIXTURES,
    BUNDLED_ROWS,
    BUNDLED_TASKS,
    format_pass_table,
    load_dataset,
    load_task,
    select,
)
from hermes_async.envs.terminalbench._docker_cli import (
    CONTAINER_LABEL,
    DockerCli,
    DockerCliSandbox,
    run_tasks,
)
from hermes_async.envs.terminalbench.contract import REWARD_TXT, ExecSpec
from hermes_async.envs.terminalbench.expect import expectation_for, mismatch
from hermes_async.envs.terminalbench.rows import write_parquet
from hermes_async.envs.terminalbench.trial import run_agent_phase, verify
from tests.envs.terminalbench.helpers import make_task

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("base_image")]


def our_containers() -> list[str]:
    done = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={CONTAINER_LABEL}={os.getpid()}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.split()


@pytest.fixture(autouse=True)
def no_leftover_containers(base_image: str) -> Iterator[None]:
    yield
    assert our_containers() == [], "a test left a task container behind"


def all_bundled(tmp_path: Path) -> list:
    tasks = []
    for dataset in (BUNDLED_TASKS, BUNDLED_FIXTURES, BUNDLED_ROWS):
        report = load_dataset(dataset, cache_dir=tmp_path / "rows")
        assert report.invalid == ()
        tasks.extend(report.tasks)
    return tasks


@pytest.mark.timeout(900)
async def test_bundled_pass_table(tmp_path: Path, anyio_backend_name: str) -> None:
    """Oracle 1.0 and null 0.0 on every real task; fixtures as declared (verifier failure with
    reward null for no-reward, a verifier timeout within its bound, 0 for both hygiene ones).
    The whole set on asyncio; a cross-section on trio (the same code, to keep CI time sane)."""
    tasks = all_bundled(tmp_path)
    if anyio_backend_name == "trio":
        names = (
            "nonroot-user,sales-summary,no-reward,verifier-timeout,hygiene-plant,log-summary-row"
        )
        tasks = list(select(tasks, task_filter=names).tasks)
    started = time.monotonic()
    results = await run_tasks(
        tasks,
        agents=("oracle", "null"),
        concurrency=2,
        skip=lambda task, agent: expectation_for(task, agent) is None,
    )
    wall = time.monotonic() - started
    print(format_pass_table(results), f"\n{len(results)} trials in {wall:.1f} s")
    by_name = {t.name: t for t in tasks}
    problems = []
    for result in results:
        expected = expectation_for(by_name[result.task], result.agent)
        assert expected is not None
        problem = mismatch(result, expected)
        if problem:
            problems.append(
                f"{result.task} ({result.agent}): {problem}\n{result.verifier_stdout[-1500:]}"
            )
    assert problems == []
    real = [t for t in tasks if "negative" not in t.tags]
    assert len(results) == 2 * len(real) + (len(tasks) - len(real))
    timeout = next(r for r in results if r.task == "verifier-timeout")
    assert 3.0 <= timeout.verifier_seconds < 3.0 + 15.0  # the bound plus docker's overhead


async def test_stopping_agent_processes_defeats_a_background_writer() -> None:
    task = load_task(BUNDLED_FIXTURES / "hygiene-daemon")
    cli = DockerCli()
    image = await cli.ensure_image(task)

    async def reward_after(sandbox: DockerCliSandbox, seconds: float) -> bytes | None:
        # What reward.txt says once the job (if alive) has had `seconds` to rewrite it.
        with anyio.move_on_after(seconds):
            while (data := await sandbox.read_file(REWARD_TXT, max_bytes=64)) != b"1\n":
                await anyio.sleep(0.05)
        return data

    async with cli.open_sandbox(task, image) as sandbox:
        await run_agent_phase(task, sandbox, agent="oracle")
        await verify(task, sandbox, stop_agent_processes=False)
        # Without the stop, the job overwrites the 0 that test.sh wrote: the attack works,
        # which is what the stop is for.
        assert await reward_after(sandbox, 10) == b"1\n"
    async with cli.open_sandbox(task, image) as sandbox:
        await run_agent_phase(task, sandbox, agent="oracle")
        verified = await verify(task, sandbox)
        assert verified.reading is not None and verified.reading.reward == 0.0
        assert await reward_after(sandbox, 1) == b"0\n"  # and the job is really gone


async def test_task_resources_and_runtime_reach_the_container() -> None:
    task = load_task(BUNDLED_TASKS / "custom-workdir")  # cpus 0.5, memory_mb 256, workdir /srv/work
    cli = DockerCli()
    image = await cli.ensure_image(task)
    probe = r"""
if [ -f /sys/fs/cgroup/cpu.max ]; then
    echo "cpu $(cat /sys/fs/cgroup/cpu.max)"; echo "mem $(cat /sys/fs/cgroup/memory.max)"
else
    echo "cpu $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
    echo "mem $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
fi
echo "pid1 $(tr '\0' ' ' < /proc/1/cmdline)"
echo "net $(ls /sys/class/net | tr '\n' ' ')"
echo "pwd $(pwd)"
"""
    async with cli.open_sandbox(task, image) as sandbox:
        assert sandbox.image_workdir == "/app"  # the image's; the task's /srv/work wins
        result = await sandbox.exec(ExecSpec(("sh", "-c", probe), cwd="/srv/work", what="probe"))
    assert result.exit_code == 0, result.output
    lines = dict(line.split(" ", 1) for line in result.output.splitlines())
    quota, period = (int(x) for x in lines["cpu"].split())
    assert quota / period == pytest.approx(0.5)
    assert int(lines["mem"]) == 256 * 1024 * 1024
    assert lines["pid1"].startswith("/sbin/docker-init")  # --init
    assert lines["net"].split() == ["lo"]  # --network none
    assert lines["pwd"] == "/srv/work"


async def test_image_is_built_once_per_content(tmp_path: Path) -> None:
    folder = make_task(
        tmp_path,
        "once",
        dockerfile=f"FROM hermes-async-base:bookworm\nRUN echo {uuid.uuid4().hex} > /stamp\n",
    )
    task = load_task(folder)
    cli = DockerCli()
    try:
        results = await run_tasks([task] * 4, agents=("null",), cli=cli, concurrency=4)
        assert [r.reward for r in results] == [1.0] * 4  # helpers' test.sh always writes 1
        assert cli.builds == 1
        await run_tasks([task], agents=("null",), cli=cli)
        assert cli.builds == 1
        (folder / "environment" / "extra.txt").write_text("changed\n")
        await run_tasks([task], agents=("null",), cli=cli)
        assert cli.builds == 2  # a changed build context is a new image
    finally:
        subprocess.run(
            ["docker", "image", "rm", "-f", *_task_images("once")],
            capture_output=True,
            timeout=60,
            check=False,
        )


def _task_images(name: str) -> list[str]:
    done = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", f"hermes-async-task/{name}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.split() or ["none"]


async def test_cancelled_trial_removes_its_container() -> None:
    task = load_task(BUNDLED_FIXTURES / "no-reward")
    cli = DockerCli()
    image = await cli.ensure_image(task)
    with anyio.move_on_after(3):
        async with cli.open_sandbox(task, image) as sandbox:
            assert len(our_containers()) == 1
            await sandbox.exec(ExecSpec(("sleep", "60"), timeout=60, what="sleep"))
    assert our_containers() == []


async def test_parquet_rows_run_through_the_oracle(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    rows = [json.loads(line) for line in BUNDLED_ROWS.read_text().splitlines()]
    write_parquet(rows, tmp_path / "rows.parquet")
    report = load_dataset(tmp_path / "rows.parquet", cache_dir=tmp_path / "cache")
    assert [t.name for t in report.tasks] == ["log-summary-row", "fix-python-bug-row"]
    results = await run_tasks(report.tasks, agents=("oracle",))
    assert [(r.status, r.reward) for r in results] == [("ok", 1.0), ("ok", 1.0)]


async def test_missing_prebuilt_image_is_reported_not_pulled(tmp_path: Path) -> None:
    task = load_task(
        make_task(
            tmp_path,
            "prebuilt",
            '[environment]\ndocker_image = "hermes-async-nonexistent:1"\n',
            dockerfile=None,
        )
    )
    [result] = await run_tasks([task], agents=("null",))
    assert result.status == "infra"
    assert (
        "image 'hermes-async-nonexistent:1' is not on the engine and this runner does not pull"
        in (result.error or "")
    )
