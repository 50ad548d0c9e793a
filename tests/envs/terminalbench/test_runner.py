"""run_pass over the contract's fake sandbox: containment per task (hostile tasks among good
ones), rows written as trials finish, resume without rewriting, attempts and pass@k, the
checks made before a trial runs (asyncio and trio)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from hermes_async.envs.terminalbench import (
    JobWriter,
    PassOptions,
    TaskRun,
    format_pass_table,
    load_dataset,
    pass_metrics,
    run_pass,
    run_trial,
)
from hermes_async.envs.terminalbench.job import trial_from_row
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.testing import hostile_tasks
from tests.envs.terminalbench.fakes import ContractSandbox

pytestmark = pytest.mark.anyio


def fake_trials(options: PassOptions, log: list[str] | None = None):  # type: ignore[no-untyped-def]
    async def trial_fn(task: HarborTask, attempt: int, network: bool) -> TaskRun:
        if log is not None:
            log.append(f"{task.name}#{attempt}")
        sandbox = ContractSandbox()
        return TaskRun(await run_trial(task, sandbox, agent=options.agent))

    return trial_fn


async def test_a_pass_with_two_hostile_tasks_completes_the_other_six(tmp_path: Path) -> None:
    # Issue #38's acceptance: 8 tasks, T1 (a link to the host's environ) and T4 (a 400-digit
    # reward) among them; the other 6 finish with their rewards.
    root = tmp_path / "tasks"
    for i in range(6):
        hostile_tasks.plain_task(root, f"good-{i}", reward=(i % 2))
    hostile_tasks.link_out(root)
    hostile_tasks.huge_integer_reward(root)
    report = load_dataset(root)
    assert [name for name, _ in report.invalid] == ["t1-link-out"]
    assert "link out of the task folder" in report.invalid[0][1]
    assert "SECRET" not in report.describe()
    options = PassOptions(agent="null", concurrency=3)
    writer = JobWriter(tmp_path / "job", config={}, resume=False)
    trials = await run_pass(
        report.tasks, fake_trials(options), options=options, writer=writer, invalid=report.invalid
    )
    writer.close()
    by_name = {t.task: t for t in trials}
    assert {n: (by_name[n].status, by_name[n].reward) for n in by_name} == {
        **{f"good-{i}": ("ok", float(i % 2)) for i in range(6)},
        "t4-huge-integer": ("verifier", None),
        "t1-link-out": ("task_invalid", None),  # refused at load, still a row
    }
    rows = [json.loads(r) for r in (tmp_path / "job" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and "SECRET" not in (tmp_path / "job" / "results.jsonl").read_text()
    assert "reward.json's reward is not a number a float can hold" in str(
        by_name["t4-huge-integer"].error
    )


async def test_one_trial_raising_is_its_row_not_the_end_of_the_pass(tmp_path: Path) -> None:
    tasks = [load_dataset(hostile_tasks.plain_task(tmp_path, n)).tasks[0] for n in "abc"]
    options = PassOptions(agent="null")

    async def trial_fn(task: HarborTask, attempt: int, network: bool) -> TaskRun:
        if task.name == "b":
            raise RuntimeError("the backend fell over")
        return TaskRun(await run_trial(task, ContractSandbox(), agent="null"))

    trials = await run_pass(tasks, trial_fn, options=options)
    assert [(t.task, t.status) for t in trials] == [("a", "ok"), ("b", "infra"), ("c", "ok")]
    assert trials[1].error == "RuntimeError: the backend fell over"


async def test_oracle_without_solve_sh_and_network_needs_are_decided_first(tmp_path: Path) -> None:
    nosol = hostile_tasks.plain_task(tmp_path, "nosol")
    (nosol / "solution" / "solve.sh").unlink()
    net = hostile_tasks.plain_task(tmp_path, "net")
    (net / "tests" / "test.sh").write_text(
        "#!/bin/bash\ncurl -LsSf https://astral.sh/uv/install.sh | sh\n"
    )
    ok = hostile_tasks.plain_task(tmp_path, "ok")
    tasks = [load_dataset(p).tasks[0] for p in (nosol, net, ok)]
    ran: list[str] = []
    options = PassOptions(agent="oracle")
    trials = await run_pass(tasks, fake_trials(options, ran), options=options)
    assert [(t.task, t.status, t.reward) for t in trials] == [
        ("nosol", "task_invalid", None),
        ("net", "needs_network", None),
        ("ok", "ok", 1.0),
    ]
    assert ran == ["ok#0"]  # neither of the others reached a sandbox
    assert "allow_network_tasks skip" in str(trials[1].error)
    assert "tests/test.sh downloads" in str(trials[1].error)
    # run: the task runs, and its row says it needed the network.
    ran.clear()
    options = PassOptions(agent="null", network_tasks="run")
    trials = await run_pass(tasks[1:2], fake_trials(options, ran), options=options)
    assert ran == ["net#0"] and trials[0].notes[0].startswith("ran with allow_network_tasks=run")


async def test_rows_are_written_as_trials_finish_and_resume_keeps_them(tmp_path: Path) -> None:
    root = tmp_path / "tasks"
    for name in ("a", "b", "c", "d"):
        hostile_tasks.plain_task(root, name)
    tasks = list(load_dataset(root).tasks)
    options = PassOptions(agent="oracle", concurrency=4)
    job = tmp_path / "job"
    started_d = anyio.Event()

    async def trial_fn(task: HarborTask, attempt: int, network: bool) -> TaskRun:
        if task.name == "d":
            started_d.set()
            await anyio.sleep_forever()  # the run is killed while d is in flight
        return TaskRun(await run_trial(task, ContractSandbox(), agent="oracle"))

    writer = JobWriter(job, config={"agent": "oracle"}, resume=False)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_pass(tasks, trial_fn, options=options, writer=writer))
        await started_d.wait()
        await anyio.wait_all_tasks_blocked()  # a, b and c have finished; d waits forever
        # a, b, c are on disk before the pass ends (each row flushed as its trial finished).
        rows = (job / "results.jsonl").read_text().splitlines()
        assert sorted(json.loads(r)["task"] for r in rows) == ["a", "b", "c"]
        tg.cancel_scope.cancel("Ctrl-C")
    writer.close()
    before = (job / "results.jsonl").read_bytes()

    ran: list[str] = []
    writer = JobWriter(job, config={"agent": "oracle"}, resume=True)
    trials = await run_pass(tasks, fake_trials(options, ran), options=options, writer=writer)
    writer.close()
    assert ran == ["d#0"]  # nothing finished runs twice
    after = (job / "results.jsonl").read_bytes()
    assert after.startswith(before)  # no finished row lost or rewritten
    assert [json.loads(r)["task"] for r in after.decode().splitlines()][-1] == "d"
    assert len(after.decode().splitlines()) == 4
    assert [(t.task, t.reward) for t in trials] == [(n, 1.0) for n in "abcd"]
    result = json.loads((job / "d__oracle-0" / "result.json").read_text())
    assert result["verifier_result"] == {"rewards": {"reward": 1.0}}


async def test_attempts_give_pass_at_k(tmp_path: Path) -> None:
    flaky = load_dataset(hostile_tasks.plain_task(tmp_path, "flaky")).tasks[0]
    options = PassOptions(agent="null", attempts=3)
    seen = 0

    async def trial_fn(task: HarborTask, attempt: int, network: bool) -> TaskRun:
        nonlocal seen
        seen += 1
        passes = attempt == 1  # one of three attempts passes

        def test(files: dict[str, bytes], request: object) -> int:
            files["/logs/verifier/reward.txt"] = b"1" if passes else b"0"
            return 0

        return TaskRun(await run_trial(task, ContractSandbox(test=test), agent="null"))

    trials = await run_pass([flaky], trial_fn, options=options)
    assert seen == 3 and [t.attempt for t in trials] == [0, 1, 2]
    metrics = pass_metrics(trials)
    assert metrics["eval/pass@1"] == pytest.approx(1 / 3)
    assert metrics["eval/pass@3"] == pytest.approx(1.0)
    assert metrics["eval/pass@2"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "damage",
    [
        {"task": None, "agent": None, "status": None, "reward": None, "attempt": None},
        {"agent": ["oracle"], "status": 7, "category": [1]},
        {"reward": "1.0", "metrics": [1, 2], "notes": 5},
        {"reward": 10**400, "agent_seconds": "slow", "verifier_seconds": [1]},
        {"attempt": "first", "error": 5, "notes": [{"a": 1}]},
    ],
)
async def test_resume_over_rows_of_the_wrong_shape(
    tmp_path: Path, damage: dict[str, object]
) -> None:
    # Each raised KeyError, TypeError, ValueError or OverflowError out of the resumed pass
    # (trial_from_row) or its table; now the row reads with defaults and stays as it was.
    tasks = [load_dataset(hostile_tasks.plain_task(tmp_path, n)).tasks[0] for n in "ab"]
    options = PassOptions(agent="null")
    job = tmp_path / "job"
    writer = JobWriter(job, config={}, resume=False)
    await run_pass(tasks, fake_trials(options), options=options, writer=writer)
    writer.close()
    lines = (job / "results.jsonl").read_text().splitlines()
    first, second = sorted(lines, key=lambda line: json.loads(line)["task"])  # a's, then b's
    row = {k: v for k, v in json.loads(first).items() if k == "item_key" or k not in damage}
    row.update({k: v for k, v in damage.items() if v is not None})
    damaged = (json.dumps(row) + "\n" + second + "\n").encode()
    (job / "results.jsonl").write_bytes(damaged)

    ran: list[str] = []
    writer = JobWriter(job, config={}, resume=True)
    trials = await run_pass(tasks, fake_trials(options, ran), options=options, writer=writer)
    writer.close()
    assert ran == [] and (job / "results.jsonl").read_bytes() == damaged
    assert [(t.task, t.agent, t.attempt) for t in trials] == [("a", "null", 0), ("b", "null", 0)]
    assert trials[1].reward == 1.0
    format_pass_table(trials)
    pass_metrics(trials)


@pytest.mark.parametrize("attempt", ["\u00b2", "7" * 5000, "-1", ""])
def test_a_row_key_whose_attempt_is_not_a_plain_number_reads_as_attempt_0(attempt: str) -> None:
    # "²" passes str.isdigit() but not int(); 5,000 digits pass neither int(): ValueError.
    trial = trial_from_row({"item_key": f"a#null#{attempt}", "attempt": None})
    assert (trial.task, trial.agent, trial.attempt) == ("a", "null", 0)


async def test_a_row_that_is_not_utf8_is_escaped_and_resumes(tmp_path: Path) -> None:
    # A refused task whose name held a lone surrogate raised UnicodeEncodeError out of the
    # pass when its row was written.
    options = PassOptions(agent="null")
    writer = JobWriter(tmp_path / "job", config={}, resume=False)
    invalid = [("bad\udcff", "refused in /data/\udcfe")]
    trials = await run_pass(
        [], fake_trials(options), options=options, writer=writer, invalid=invalid
    )
    writer.close()
    assert [(t.task, t.status) for t in trials] == [("bad\udcff", "task_invalid")]
    before = (tmp_path / "job" / "results.jsonl").read_bytes()
    assert b"bad\\udcff" in before
    writer = JobWriter(tmp_path / "job", config={}, resume=True)
    assert writer.finished == {"bad\udcff#null#0"}  # the same key read back
    await run_pass([], fake_trials(options), options=options, writer=writer, invalid=invalid)
    writer.close()
    assert (tmp_path / "job" / "results.jsonl").read_bytes() == before
