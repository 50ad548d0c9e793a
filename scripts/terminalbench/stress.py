"""Many bundled tasks at once through TerminalBench2EvalEnv on Docker: wall time, peak memory.

    DOCKER_HOST=unix:///path/docker.sock .venv/bin/python scripts/terminalbench/stress.py \
        --trials 32 --agent oracle [--fresh]

The bundled set runs as attempts until ``--trials`` trials exist; all of them start at once
(``max_concurrent_tasks`` = trials). ``--fresh`` builds every image anew under a private
repository (removed afterwards) to show that each task's image is built exactly once however
many of its trials wait for it. Prints the pass table, then one line of numbers:
wall seconds, builds (one per distinct build context), this process's peak RSS, and the
host's used memory at the start and at its peak (sampled every 0.25 s; other processes on
the box add noise).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import uuid
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hermes_async.envs.terminalbench import BUNDLED_TASKS, format_pass_table, load_dataset
from hermes_async.envs.terminalbench.env import (
    TerminalBench2EvalEnv,
    TerminalBench2EvalEnvConfig,
)
from hermes_async.tools.sandbox.docker_images import ImageBuilder, context_digest


def used_memory_bytes() -> int:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


async def main(args: argparse.Namespace) -> int:
    tasks = list(load_dataset(BUNDLED_TASKS).tasks)
    attempts = -(-args.trials // len(tasks))  # the bundled set repeated as attempts
    trials = tasks
    config, servers = TerminalBench2EvalEnv.config_init()
    values = config.model_dump()
    values.update(
        agent=args.agent,
        attempts=attempts,
        max_concurrent_tasks=args.trials,
        use_wandb=False,
        data_dir_to_save_evals=None,
        data_path_to_save_groups=None,
    )
    env = TerminalBench2EvalEnv(TerminalBench2EvalEnvConfig(**values), servers)
    repository = None
    if args.fresh:
        repository = f"hermes-async-stress-{uuid.uuid4().hex[:8]}"
        env.images = ImageBuilder(repository=repository)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    baseline = used_memory_bytes()
    peak = baseline
    started = time.monotonic()
    async with anyio.create_task_group() as tg:

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, used_memory_bytes())
                await anyio.sleep(0.25)

        tg.start_soon(sample)
        with anyio.fail_after(args.deadline):
            async with env.open_sandboxes():
                results = await env.run_tasks(trials)
        tg.cancel_scope.cancel("the trials finished")
    wall = time.monotonic() - started
    print(format_pass_table(results))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    passed = sum(r.status == "ok" and r.reward == 1.0 for r in results)
    # Identical build contexts share one image (cached by content): one build per digest.
    contexts = {t.environment.build_context for t in trials if t.environment.build_context}
    expected = len({context_digest(c) for c in contexts}) if args.fresh else 0
    print(
        f"trials={len(results)}/{len(tasks) * attempts} passed={passed} wall_seconds={wall:.1f} "
        f"builds={env.images.builds} (fresh: expect {expected}) "
        f"peak_rss_mib={rss / 2**20:.0f} (after imports: {rss_before / 2**20:.0f}) "
        f"host_used_mib start={baseline / 2**20:.0f} peak={peak / 2**20:.0f}"
    )
    if repository is not None:
        listed = await anyio.run_process(
            ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repository], check=False
        )
        tags = listed.stdout.decode().split()  # by tag: an id may be shared with the cached images
        if tags:
            await anyio.run_process(["docker", "rmi", *tags], check=False)
    ok = len(results) == len(tasks) * attempts and (not args.fresh or env.images.builds == expected)
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--agent", choices=("oracle", "null"), default="oracle")
    parser.add_argument("--fresh", action="store_true", help="rebuild every image once")
    parser.add_argument("--deadline", type=float, default=1800.0, help="seconds for the run")
    sys.exit(anyio.run(main, parser.parse_args()))
