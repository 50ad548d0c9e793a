#!/usr/bin/env python3
"""Run Harbor tasks' oracle and null agents on the project's Docker backend; print the table.

    eval "$(scripts/docker/engine.sh env)"
    scripts/docker/base_image.sh build               # hermes-async-base:bookworm, cached
    python scripts/terminalbench/check_tasks.py      # bundled tasks + fixtures + rows

Each (task, agent) pair runs in a fresh container through the same pass as ``evaluate``
(:func:`hermes_async.envs.terminalbench.run_pass`). Expectations: every real task scores 1.0
with its oracle and 0.0 (its floor) with ``null``; each negative fixture ends as its
``task.toml`` says. Exit status: 0 when every expectation holds, 1 when one does not, 2 when
nothing was checked (every task invalid, skipped or unknown).

Options: ``--dataset PATH`` (repeatable: a task folder, a directory of them, a ``.jsonl`` /
``.parquet`` of Hermes rows, or a registered name), ``--agent oracle|null`` (repeatable),
``--task-filter a,b``, ``--skip-tasks c,d``, ``--concurrency N`` (default 2),
``--image-map A=B,...``, ``--allow-network-tasks skip|run``, ``--build-network host``
(builds' RUN steps reach what the host reaches), ``--job DIR`` (a Harbor job folder; with
``--resume`` finished trials are kept and skipped), ``--build-base``
(run ``scripts/docker/base_image.sh build`` first), ``--json FILE`` (one JSON object a line).
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
    JobWriter,
    PassOptions,
    TrialResult,
    format_pass_table,
    load_dataset,
    parse_image_map,
    resolve_dataset,
    run_pass,
    scripted_trial,
    select,
)
from hermes_async.envs.terminalbench.expect import (  # noqa: E402
    expectation_for,
    is_negative_fixture,
    mismatch,
)
from hermes_async.envs.terminalbench.task import HarborTask  # noqa: E402
from hermes_async.tools.sandbox.docker import DockerBackend, DockerSandboxConfig  # noqa: E402
from hermes_async.tools.sandbox.manager import SandboxManager  # noqa: E402


def _image_present(image: str) -> bool:
    done = subprocess.run(
        ["docker", "image", "inspect", image], capture_output=True, timeout=30, check=False
    )
    return done.returncode == 0


async def _run(
    tasks: list[HarborTask], agents: tuple[str, ...], args: argparse.Namespace
) -> list[TrialResult]:
    backend = DockerBackend(
        DockerSandboxConfig(default_exec_timeout=600.0, build_network_mode=args.build_network)
    )
    results: list[TrialResult] = []
    async with SandboxManager(backend) as manager:
        for agent in agents:
            options = PassOptions(
                agent=agent,  # type: ignore[arg-type]
                concurrency=args.concurrency,
                image_map=parse_image_map(args.image_map),
                network_tasks=args.allow_network_tasks,
                build_network=args.build_network is not None,
            )
            mine = [t for t in tasks if expectation_for(t, options.agent) is not None]
            writer = None
            if args.job is not None:
                writer = JobWriter(args.job / agent, config={"agent": agent}, resume=args.resume)

            async def trial_fn(task: HarborTask, attempt: int, network: bool, o=options):  # type: ignore[no-untyped-def]
                return await scripted_trial(task, manager=manager, options=o, network=network)

            try:
                results += await run_pass(
                    mine, trial_fn, options=options, writer=writer, probe=backend.image_labels
                )
            finally:
                if writer is not None:
                    writer.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dataset", action="append")
    parser.add_argument("--agent", action="append", choices=("oracle", "null"))
    parser.add_argument("--task-filter", default=None)
    parser.add_argument("--skip-tasks", default=None)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--image-map", default=None)
    parser.add_argument("--allow-network-tasks", choices=("skip", "run"), default="skip")
    parser.add_argument("--build-network", default=None, help="e.g. host: builds reach a mirror")
    parser.add_argument("--job", type=Path, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--build-base", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.build_base:
        subprocess.run([str(REPO / "scripts/docker/base_image.sh"), "build"], check=True)
    datasets = args.dataset or [str(BUNDLED_TASKS), str(BUNDLED_FIXTURES), str(BUNDLED_ROWS)]
    agents = tuple(args.agent or ("oracle", "null"))

    tasks: list[HarborTask] = []
    for dataset in datasets:
        report = load_dataset(resolve_dataset(dataset))
        print(report.describe(), file=sys.stderr)
        for task in report.tasks:
            if any(t.name == task.name for t in tasks):
                print(f"skipping {task.name} from {dataset}: an earlier dataset has it")
                continue
            tasks.append(task)
    selection = select(tasks, args.task_filter, args.skip_tasks)
    if selection.unknown:
        print(f"unknown task names: {', '.join(selection.unknown)}", file=sys.stderr)
        return 2
    if not _image_present(BASE_IMAGE):
        print(f"note: {BASE_IMAGE} is not on the engine (scripts/docker/base_image.sh build)")

    started = time.monotonic()
    results = anyio.run(_run, list(selection.tasks), agents, args, backend="asyncio")
    wall = time.monotonic() - started
    by_name = {t.name: t for t in selection.tasks}
    failures, real, fixtures, fixture_notes = [], [], [], []
    checked = 0
    for result in results:
        task = by_name[result.task]
        expected = expectation_for(task, result.agent)
        if result.status in ("needs_network", "task_invalid"):
            real.append(result)
            continue  # not checked: reported in the table
        checked += 1
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
    print(f"\n{len(results)} trials, {checked} checked, in {wall:.1f} s wall")
    if args.json is not None:
        with args.json.open("w", encoding="utf-8") as f:
            for result in results:
                f.write(json.dumps(dataclasses.asdict(result)) + "\n")
    if failures:
        print("EXPECTATIONS NOT MET:\n  " + "\n  ".join(failures))
        return 1
    if checked == 0:
        print("NOTHING CHECKED: every trial was skipped (needs_network) or invalid")
        return 2
    print("every checked expectation met (oracle 1.0, null 0.0, fixtures as declared)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
