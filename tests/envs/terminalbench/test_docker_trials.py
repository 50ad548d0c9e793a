"""Trials on the project's Docker backend: hostile tasks in a real container (a verifier that
never ends killed at the clamped bound, an in-tree link uploaded intact), a USER non-root
image graded with root steps, the image map and docker_image preference (asyncio: aiodocker)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from hermes_async.envs.terminalbench import (
    PassOptions,
    TaskLimits,
    TaskRun,
    load_task,
    run_pass,
    scripted_trial,
)
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.testing import hostile_tasks
from hermes_async.tools.sandbox.docker import DockerBackend, DockerSandboxConfig
from hermes_async.tools.sandbox.manager import SandboxManager

pytestmark = [pytest.mark.anyio, pytest.mark.docker, pytest.mark.usefixtures("base_image")]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"debug": True})


async def _pass(tasks: list[HarborTask], options: PassOptions) -> list:  # type: ignore[type-arg]
    backend = DockerBackend(DockerSandboxConfig(default_exec_timeout=120.0))
    async with SandboxManager(backend) as manager:

        async def trial_fn(task: HarborTask, attempt: int, network: bool) -> TaskRun:
            return await scripted_trial(task, manager=manager, options=options, network=network)

        return await run_pass(tasks, trial_fn, options=options, probe=backend.image_labels)


async def test_unbounded_task_is_clamped_and_its_endless_verifier_killed(tmp_path: Path) -> None:
    task = load_task(
        hostile_tasks.unbounded_task(tmp_path), limits=TaskLimits(verifier_timeout_sec=3.0)
    )
    started = anyio.current_time()
    with anyio.fail_after(300):
        (trial,) = await _pass([task], PassOptions(agent="null"))
    assert (trial.status, trial.reward) == ("verifier", None)
    assert trial.error == "tests/test.sh timed out after 3 s"
    assert "clamped verifier.timeout_sec 1e+308 -> 3" in trial.notes
    assert "clamped environment.cpus 1e+18 -> 16" in trial.notes
    assert anyio.current_time() - started < 120


async def test_in_tree_link_reaches_the_container_and_hostile_rewards_are_rows(
    tmp_path: Path,
) -> None:
    linked = hostile_tasks.in_tree_link(tmp_path)
    (linked / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        '[ "$(readlink /tests/dd/x)" = .. ] && [ -f /tests/dd/x/test.sh ] '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    tasks = [
        load_task(linked),
        load_task(hostile_tasks.huge_integer_reward(tmp_path)),
        load_task(hostile_tasks.nan_reward(tmp_path)),
        load_task(hostile_tasks.out_of_range_reward(tmp_path)),
    ]
    with anyio.fail_after(300):
        trials = await _pass(tasks, PassOptions(agent="null", concurrency=2))
    by_name = {t.task: t for t in trials}
    assert (by_name["in-tree-link"].status, by_name["in-tree-link"].reward) == ("ok", 1.0)
    for name in ("t4-huge-integer", "t7-nan", "t5-out-of-range"):
        assert (by_name[name].status, by_name[name].reward) == ("verifier", None), name


async def test_image_map_and_a_present_docker_image(tmp_path: Path) -> None:
    # FROM a registry name the engine lacks, mapped onto the local base: builds offline.
    folder = hostile_tasks.plain_task(tmp_path, "mapped")
    (folder / "environment" / "Dockerfile").write_text("FROM python:3.99-nowhere\nWORKDIR /app\n")
    mapped = load_task(folder)
    # A docker_image the engine has wins over the Dockerfile (which could not build).
    prebuilt = hostile_tasks.plain_task(tmp_path, "prebuilt")
    (prebuilt / "environment" / "Dockerfile").write_text("FROM no-such-image:1\n")
    (prebuilt / "task.toml").write_text(
        '[environment]\ndocker_image = "hermes-async-base:bookworm"\n'
    )
    options = PassOptions(
        agent="oracle", image_map={"python:3.99-nowhere": "hermes-async-base:bookworm"}
    )
    with anyio.fail_after(300):
        trials = await _pass([mapped, load_task(prebuilt)], options)
    assert [(t.task, t.status, t.reward) for t in trials] == [
        ("mapped", "ok", 1.0),
        ("prebuilt", "ok", 1.0),
    ]
    # Unmapped, the missing base is flagged before anything runs.
    (flagged,) = await _pass([mapped], PassOptions(agent="oracle"))
    assert flagged.status == "needs_network"
    assert "image 'python:3.99-nowhere' is not on the engine" in str(flagged.error)
