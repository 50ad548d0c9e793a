#!/usr/bin/env python3
"""Run Harbor tasks' oracle and null agents on the docker CLI and print the pass table.

    export DOCKER_HOST=unix:///path/to/docker.sock
    scripts/docker/base_image.sh build               # hermes-async-base:bookworm, cached
    python scripts/terminalbench/check_tasks.py      # bundled tasks + fixtures + rows

Each (task, agent) pair runs in a fresh container: the oracle (``solution/solve.sh``) or
nothing (``null``), then the verifier contract (hygiene, ``tests/`` copied in, ``test.sh``
with the task's user, env and deadline, the reward read on the host). Expectations: every
real task scores 1.0 with its oracle and 0.0 (its floor) with ``null``; each negative fixture
ends as its ``task.toml`` says. Exit status 0 when every expectation holds, 1 otherwise.

Options: ``--dataset PATH`` (repeatable; a task folder, a directory of them, or a
``.jsonl``/``.parquet`` file of Hermes rows), ``--agent oracle|null`` (repeatable),
``--task-filter a,b``, ``--skip-tasks c,d``, ``--concurrency N`` (default 2),
``--build-base`` (run ``scripts/docker/base_image.sh build`` first), ``--json FILE``
(results, one JSON object a line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without installing it

import anyio  # noqa: E402

from hermes_async.envs.terminalbench import (  # noqa: E402
    BASE_IMAGE,
    BUNDLED_FIXTURES,
    BUNDLED_ROWS,
    BUNDLED_TASKS,
    format_pass_table,
    load_dataset,
    select,
)
from hermes_async.envs.terminalbench._docker_cli import DockerCli, run_tasks  # noqa: E402
from hermes_async.envs.terminalbench.contract import AgentKind  # noqa: E402
from hermes_async.envs.terminalbench.expect import (  # noqa: E402
    expectation_for,
    is_negative_fixture,
    mismatch,
)
from hermes_async.envs.terminalbench.task import HarborTask  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", action="append", type=Path)
    parser.add_argument("--agent", action="append", choices=("oracle", "null"))
    parser.add_argument("--task-filter", default=None)
    parser.add_argument("--skip-tasks", default=None)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--build-base", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.build_base:
        subprocess.run([str(REPO / "scripts/docker/base_image.sh"), "build"], check=True)
    datasets = args.dataset or [BUNDLED_TASKS, BUNDLED_FIXTURES, BUNDLED_ROWS]
    agents: tuple[AgentKind, ...] = tuple(args.agent or ("oracle", "null"))

    tasks: list[HarborTask] = []
    for dataset in datasets:
        report = load_dataset(dataset)
        print(report.describe(), file=sys.stderr)
        for task in report.tasks:
            if task.needs_network:
                continue  # reported above; this runner is offline
            if any(t.name == task.name for t in tasks):
                print(
                    f"skipping {task.name} from {dataset}: an earlier dataset has it",
                    file=sys.stderr,
                )
                continue
            tasks.append(task)
    selection = select(tasks, args.task_filter, args.skip_tasks)
    if selection.unknown:
        print(f"unknown task names: {', '.join(selection.unknown)}", file=sys.stderr)
        return 2

    cli = DockerCli()

    async def go() -> list:
        if not await cli.image_exists(BASE_IMAGE):
            raise SystemExit(
                f"{BASE_IMAGE} is not on the engine: run scripts/docker/base_image.sh build "
                "(or pass --build-base)"
            )
        return await run_tasks(
            selection.tasks,
            agents=agents,
            cli=cli,
            concurrency=args.concurrency,
            skip=lambda task, agent: expectation_for(task, agent) is None,
        )

    started = time.monotonic()
    results = anyio.run(go)
    wall = time.monotonic() - started
    by_name = {t.name: t for t in selection.tasks}
    failures = []
    real, fixtures, fixture_notes = [], [], []
    for result in results:
        task = by_name[result.task]
        expected = expectation_for(task, result.agent)
        problem = mismatch(result, expected) if expected is not None else None
        if problem:
            failures.append(f"{result.task} ({result.agent}): {problem}")
        if is_negative_fixture(task):
            fixtures.append(result)
            fixture_notes.append(
                f"NOT MET: {problem}" if problem else f"as expected: {result.error or 'reward 0'}"
            )
        else:
            real.append(result)
    if real:
        print(format_pass_table(real))
    if fixtures:
        print("\nnegative fixtures (not in the pass rate):")
        print(format_pass_table(fixtures, notes=fixture_notes).rsplit("\n", 1)[0])
    print(f"\n{len(results)} trials in {wall:.1f} s wall, {cli.builds} image build(s)")
    if args.json is not None:
        with args.json.open("w", encoding="utf-8") as f:
            for result in results:
                f.write(json.dumps(dataclasses.asdict(result)) + "\n")
    if failures:
        print("EXPECTATIONS NOT MET:\n  " + "\n  ".join(failures))
        return 1
    print("every expectation met (oracle 1.0, null 0.0, fixtures as declared)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
