"""Setting up a group of sandboxes from a snapshot vs setting up one, on real Docker.

Each side is timed from "the group wants its sandboxes" to every sandbox being in the prepared
state and having run a first command:

* **one**: one container created, the setup run in it (the unit of comparison);
* **snapshot**: ``prepare_group`` (the first member's container, the setup in it, ``docker
  commit``; that container stays the first member's) then the ``--size - 1`` others created
  from the snapshot at once;
* **per-sandbox**: ``--size`` containers created at once, the setup run in each (no snapshot).

The setup stands for a task's preparation (unpacking data, installing a package): it writes
``--megabytes`` of random data and compresses it (CPU and disk, as an install is), then counts
to ``--cpu-loops`` in the shell (a build: a fixed amount of CPU work, little output). Rounds
alternate the sides; medians, and each side over **one** as a ratio. The snapshot side's
target (issue #19): at most 1.5x one sandbox.

    DOCKER_HOST=unix:///work/docker-engine/docker.sock \\
    HERMES_ASYNC_DOCKER_TEST_IMAGE=hermes-async-busybox:local \\
        .venv/bin/python bench/group_snapshot.py --size 8 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics

import anyio

from hermes_async.limits import Limits
from hermes_async.tools.sandbox.backends import make_backend_factory
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.sandbox.snapshot import prepare_group


def make_setup(megabytes: int, cpu_loops: int):  # type: ignore[no-untyped-def]
    async def setup(sandbox: Sandbox) -> None:
        command = (
            f"mkdir -p task && dd if=/dev/urandom of=task/data bs=1M count={megabytes} "
            "2>/dev/null && gzip -k task/data && echo ready > task/state"
        )
        if cpu_loops > 0:  # e.g. compiling: a fixed amount of CPU work, little output
            command += f" && i=0 && while [ $i -lt {cpu_loops} ]; do i=$((i+1)); done"

        result = await sandbox.exec(command, timeout=600)
        if result.exit_code != 0:
            raise RuntimeError(f"setup failed: {result.stderr}")

    return setup


async def first_command(sandbox: Sandbox) -> None:
    result = await sandbox.exec("cat task/state")
    assert result.stdout == "ready\n", result


async def one(manager: SandboxManager, setup, tag: str) -> None:  # type: ignore[no-untyped-def]
    sandbox = await manager.get(tag)
    await setup(sandbox)
    await first_command(sandbox)
    await manager.release(tag)


async def snapshot_side(manager: SandboxManager, setup, size: int, tag: str) -> None:  # type: ignore[no-untyped-def]
    snapshot = await prepare_group(manager, None, setup, task_id=f"{tag}-0")
    assert snapshot is not None
    try:

        async def member(i: int) -> None:
            manager.assign_spec(f"{tag}-{i}", snapshot.spec)
            sandbox = await manager.get(f"{tag}-{i}")
            await first_command(sandbox)

        async with anyio.create_task_group() as tg:
            tg.start_soon(first_command, await manager.get(f"{tag}-0"))  # the template's own
            for i in range(1, size):
                tg.start_soon(member, i)
    finally:
        for i in range(size):
            await manager.release(f"{tag}-{i}")
        await snapshot.aclose()


async def per_sandbox_side(manager: SandboxManager, setup, size: int, tag: str) -> None:  # type: ignore[no-untyped-def]
    async def member(i: int) -> None:
        sandbox = await manager.get(f"{tag}-{i}")
        await setup(sandbox)
        await first_command(sandbox)

    try:
        async with anyio.create_task_group() as tg:
            for i in range(size):
                tg.start_soon(member, i)
    finally:
        for i in range(size):
            await manager.release(f"{tag}-{i}")


async def main(args: argparse.Namespace) -> None:
    image = os.environ.get("HERMES_ASYNC_DOCKER_TEST_IMAGE", "hermes-async-busybox:local")
    factory = make_backend_factory("docker", image=image)
    setup = make_setup(args.megabytes, args.cpu_loops)
    times: dict[str, list[float]] = {"one": [], "snapshot": [], "per-sandbox": []}
    limits = Limits(sandbox_create=args.size * 2, sandbox_exec=args.size * 4)
    async with SandboxManager(factory, limits=limits) as manager:
        await one(manager, setup, "warmup")
        for r in range(args.rounds):
            for side in times:
                start = anyio.current_time()
                if side == "one":
                    await one(manager, setup, f"one{r}")
                elif side == "snapshot":
                    await snapshot_side(manager, setup, args.size, f"snap{r}")
                else:
                    await per_sandbox_side(manager, setup, args.size, f"each{r}")
                seconds = anyio.current_time() - start
                times[side].append(seconds)
                print(f"  round {r} {side:11s}: {seconds:6.2f} s", flush=True)
    base = statistics.median(times["one"])
    print(
        f"\nmedian, setup of {args.megabytes} MB random data + gzip + {args.cpu_loops} shell "
        f"loop iterations, group of {args.size}: "
        f"one sandbox {base:.2f} s"
    )
    for side in ("snapshot", "per-sandbox"):
        median = statistics.median(times[side])
        print(f"  {side:11s}: {median:6.2f} s = {median / base:.2f}x one sandbox")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--megabytes", type=int, default=48)
    parser.add_argument("--cpu-loops", type=int, default=0, help="~0.6 M per CPU second")
    anyio.run(main, parser.parse_args())
