"""Issue #38's task-folder rows (T1-T8) from hermes_async.testing.hostile_tasks: each one a
classified error for its task, each one also in a child process under a 1 GiB RLIMIT_AS
(the child ends normally with the classified error; the parent is untouched)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hermes_async.envs.terminalbench import (
    TaskError,
    TaskLimits,
    load_dataset,
    load_task,
    read_reward,
)
from hermes_async.testing import hostile_tasks

REPO = Path(__file__).resolve().parents[3]
ONE_GIB = 1 << 30


def test_t1_links_leaving_the_folder_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"instruction.md is a link out of the task folder"):
        load_task(hostile_tasks.link_out(tmp_path))
    folder = hostile_tasks.plain_task(tmp_path, "tests-link")
    os.symlink("/etc/passwd", folder / "tests" / "passwd")
    with pytest.raises(TaskError, match=r"tests/passwd is a link to '/etc/passwd', out of tests/"):
        load_task(folder)
    fifo = hostile_tasks.plain_task(tmp_path, "fifo")
    os.mkfifo(fifo / "tests" / "pipe")
    with pytest.raises(TaskError, match=r"tests/pipe is a device, FIFO or socket"):
        load_task(fifo)
    fifo_instruction = hostile_tasks.plain_task(tmp_path, "fifo-instruction")
    (fifo_instruction / "instruction.md").unlink()
    os.mkfifo(fifo_instruction / "instruction.md")  # a read would block forever
    with pytest.raises(TaskError, match=r"instruction.md is not a regular file"):
        load_task(fifo_instruction)


def test_in_tree_links_are_kept(tmp_path: Path) -> None:
    task = load_task(hostile_tasks.in_tree_link(tmp_path))
    assert os.readlink(task.tests_dir / "dd" / "x") == ".."


def test_t3_size_caps_at_load_time(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"tests/ holds more than 536870912 bytes"):
        load_task(hostile_tasks.huge_file(tmp_path))
    big = hostile_tasks.plain_task(tmp_path, "big-text")
    (big / "instruction.md").write_text("x" * (2 << 20))
    with pytest.raises(TaskError, match=r"instruction.md is 2097152 bytes \(at most 1048576\)"):
        load_task(big)


@pytest.mark.parametrize(
    ("reward_txt", "reward_json", "error"),
    [
        (None, b'{"reward": ' + b"9" * 400 + b"}", "not a number a float can hold"),  # T4
        (b"1e308", None, "outside the reward range 0..1"),  # T5
        (None, b'{"reward": -1e308}', "outside the reward range 0..1"),  # T5
        (None, b'{"reward": NaN, "tests_total": 5}', "is not a finite number"),  # T7
        (None, b'{"reward": Infinity, "duration_sec": 12.5}', "is not a finite number"),  # T7
    ],
)
def test_t4_t5_t7_rewards_are_error_readings(
    reward_txt: bytes | None, reward_json: bytes | None, error: str
) -> None:
    reading = read_reward(reward_txt, reward_json)
    assert reading.reward is None and reading.metrics == {}
    assert error in str(reading.error)


def test_t6_a_member_bomb_is_refused_at_the_cap_while_reading(tmp_path: Path) -> None:
    rows = hostile_tasks.member_bomb(tmp_path)
    started = time.monotonic()
    report = load_dataset(rows, cache_dir=tmp_path / "cache")
    assert report.tasks == ()
    ((name, reason),) = report.invalid
    assert name == "t6-member-bomb" and "more than 20,000 members" in reason
    assert time.monotonic() - started < 60  # the issue measured 16-43 s before; ~4 s here
    assert not any((tmp_path / "cache").iterdir())  # nothing of the row is kept


def test_t8_every_resource_and_timeout_is_clamped_and_said(tmp_path: Path) -> None:
    limits = TaskLimits(verifier_timeout_sec=3.0)
    task = load_task(hostile_tasks.unbounded_task(tmp_path), limits=limits)
    assert task.verifier_timeout_sec == 3.0
    assert task.agent_timeout_sec == limits.agent_timeout_sec
    assert task.environment.cpus == limits.cpus
    assert task.environment.memory_mb == limits.memory_mb
    assert task.environment.build_timeout_sec == limits.build_timeout_sec
    assert task.clamped == (
        f"environment.cpus 1e+18 -> {limits.cpus:g}",
        f"environment.memory_mb 4.61169e+18 -> {limits.memory_mb:g}",
        f"environment.build_timeout_sec 1e+308 -> {limits.build_timeout_sec:g}",
        f"agent.timeout_sec 1e+308 -> {limits.agent_timeout_sec:g}",
        "verifier.timeout_sec 1e+308 -> 3",
    )


# ---------------------------------------------------------------------------- under RLIMIT_AS

CASES = {
    "T1": ("load_task(h.link_out(root))", "TaskError", "link out of the task folder"),
    "T3": ("load_task(h.huge_file(root))", "TaskError", "holds more than"),
    "T4": (
        "print('ERROR', read_reward(None, b'{\"reward\": ' + b'9' * 400 + b'}').error)",
        "ERROR",
        "a float can hold",
    ),
    "T5": ("print('ERROR', read_reward(b'1e308', None).error)", "ERROR", "reward range"),
    "T6": (
        "print('ERROR', load_dataset(h.member_bomb(root), cache_dir=root / 'c').invalid)",
        "ERROR",
        "more than 20,000 members",
    ),
    "T7": (
        "print('ERROR', read_reward(None, b'{\"reward\": NaN, \"tests_total\": 5}').error)",
        "ERROR",
        "not a finite number",
    ),
    "T8": ("print('ERROR', load_task(h.unbounded_task(root)).clamped)", "ERROR", "1e+308 ->"),
}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ONE_GIB, ONE_GIB))


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_case_under_one_gib_address_space(case: str, tmp_path: Path) -> None:
    call, kind, text = CASES[case]
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from hermes_async.envs.terminalbench import TaskError, load_dataset, load_task, read_reward
        from hermes_async.testing import hostile_tasks as h
        root = Path({str(tmp_path)!r})
        try:
            {call}
        except TaskError as exc:
            print("TaskError", exc)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_memory,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(kind) and text in done.stdout, done.stdout[-2000:]
