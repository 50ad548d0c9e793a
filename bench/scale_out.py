"""Scale-out: one process vs N rollout workers (HTTP service, Ray actors), and Ray's per-group cost.

Workload: ``--groups`` groups of ``--size`` rollouts of the scripted echo task
(``hermes_async.testing.worker_tasks``: ``--turns`` terminal commands in a real local sandbox,
then an answer, rewarded through the sandbox), the scripted model server in its own process
(its CPU is not counted). Every configuration runs the same requests through the same
``RolloutWorker`` code:

* ``1 process``: the worker in this process, groups run concurrently (the baseline);
* ``service xN``: N ``hermes-async worker`` processes, this process dispatching over HTTP;
* ``ray xN``: N actors on the cluster of ``scripts/ray/cluster.sh`` (run with ``.venv-ray``'s
  python and its ``env``; skipped without ``RAY_ADDRESS``).

Client CPU per rollout is everything but the model server: the workers' processes (their
sandbox commands included: they are the workers' children) plus this driver; for Ray, the
cluster's own processes (raylets, GCS, agents) are reported apart. On 2 cores the workload is
CPU-bound: more workers cannot beat ``2 / (CPU per rollout)`` rollouts/s, which is printed.

Then Ray's cost per group: a group of ``--size`` rollouts of 3 turns and 4,096 tokens each,
as the wire's JSON (encode + decode ms, bytes), pickled as the in-process ``ScoredGroup``
would travel, and through an actor call and ``ray.put``/``get`` on the cluster.

    PYTHONPATH=. .venv/bin/python bench/scale_out.py                     # 1 process + service
    eval "$(scripts/ray/cluster.sh up)"; PYTHONPATH=. .venv-ray/bin/python bench/scale_out.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")

SERVE = """
import anyio
from hermes_async.testing import ScriptedModelServer, open_loopback_server
from hermes_async.testing.worker_tasks import echo_policy

async def main():
    server = ScriptedModelServer(
        echo_policy, max_chunk_tokens=8, response_delay_seconds={delay}, keep_requests=False
    )
    async with open_loopback_server(server) as url:
        print(url, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""

ENV = "echo=hermes_async.testing.worker_tasks:echo_task"


def proc_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its reaped children (``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICK


def self_cpu() -> float:
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``marker`` (the Ray cluster's, see cluster.sh)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker.encode() in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


@dataclass
class Row:
    name: str
    rollouts: int
    seconds: float
    cpu: float  # workers + driver
    system_cpu: float = 0.0  # Ray's own processes
    rewarded: int = 0

    @property
    def throughput(self) -> float:
        return self.rollouts / self.seconds

    @property
    def cpu_ms(self) -> float:
        return self.cpu / self.rollouts * 1e3


def requests(args: argparse.Namespace, tag: str) -> list[Any]:
    from hermes_async.service.wire import GroupRequest

    return [
        GroupRequest.within(
            args.deadline,
            "echo",
            {"label": f"{tag}{i}", "turns": args.turns},
            args.size,
            group_id=f"{tag}-{i}",
        )
        for i in range(args.groups)
    ]


def rewarded(results: Sequence[Any]) -> int:
    return sum(1 for g in results for r in g.rollouts if r.reward == 1.0)


async def one_process(args: argparse.Namespace, url: str, parent: str) -> Row:
    from hermes_async.service.config import WorkerConfig, open_configured_worker
    from hermes_async.service.worker import WorkerOptions

    config = WorkerConfig(
        (ENV,),
        (url,),
        options=WorkerOptions(name="bench-1p", sandbox_parent=parent, isolation=args.isolation),
    )
    async with open_configured_worker(config) as worker:
        reqs = requests(args, "p")
        cpu0, t0 = self_cpu(), time.perf_counter()
        results: list[Any] = []
        async with anyio.create_task_group() as tg:
            for request in reqs:

                async def run(request: Any = request) -> None:
                    results.append(await worker.run_group(request))

                tg.start_soon(run)
        seconds, cpu = time.perf_counter() - t0, self_cpu() - cpu0
    return Row("1 process", len(reqs) * args.size, seconds, cpu, rewarded=rewarded(results))


async def service(args: argparse.Namespace, url: str, parent: str, n: int) -> Row:
    from hermes_async.service.dispatch import DispatchOptions, GroupDispatcher, HTTPWorker

    procs = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        urls = []
        for i in range(n):
            command = [
                sys.executable, "-m", "hermes_async.cli", "worker", "--env", ENV,
                "--server", url, "--port", "0", "--name", f"bench-svc-{n}-{i}",
                "--sandbox-root", parent, "--isolation", args.isolation,
            ]  # fmt: skip
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
            procs.append(proc)
            assert proc.stdout is not None
            urls.append(proc.stdout.readline().split("serving on ")[1].strip())
        async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10)) as client:
            dispatcher = GroupDispatcher(
                [HTTPWorker(u, client) for u in urls], DispatchOptions(max_per_worker=args.groups)
            )
            reqs = requests(args, f"s{n}")
            before = [proc_cpu(p.pid) for p in procs]
            cpu0, t0 = self_cpu(), time.perf_counter()
            results = await dispatcher.run_groups(reqs)
            seconds = time.perf_counter() - t0
            cpu = (
                self_cpu()
                - cpu0
                + sum(proc_cpu(p.pid) - b for p, b in zip(procs, before, strict=True))
            )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
            if proc.stdout is not None:
                proc.stdout.close()
    return Row(f"service x{n}", len(reqs) * args.size, seconds, cpu, rewarded=rewarded(results))


async def ray_workers(args: argparse.Namespace, url: str, parent: str, n: int) -> Row:
    from hermes_async.service.config import WorkerConfig
    from hermes_async.service.dispatch import DispatchOptions
    from hermes_async.service.ray import RayWorkerPool
    from hermes_async.service.worker import WorkerOptions

    config = WorkerConfig(
        (ENV,), (url,), options=WorkerOptions(sandbox_parent=parent, isolation=args.isolation)
    )
    marker = f"HERMES_ASYNC_RAY_CLUSTER={os.environ.get('HERMES_ASYNC_RAY_DIR', '')}"
    async with RayWorkerPool(
        config,
        workers=n,
        dispatch=DispatchOptions(max_per_worker=args.groups),
        name_prefix=f"bench-ray-{n}",
    ) as pool:
        system = [p for p in marked_pids(marker) if p not in pool.pids]
        reqs = requests(args, f"r{n}")
        before = [proc_cpu(p) for p in pool.pids]
        system_before = sum(proc_cpu(p) for p in system)
        cpu0, t0 = self_cpu(), time.perf_counter()
        results = await pool.run_groups(reqs)
        seconds = time.perf_counter() - t0
        cpu = (
            self_cpu() - cpu0 + sum(proc_cpu(p) - b for p, b in zip(pool.pids, before, strict=True))
        )
        system_cpu = sum(proc_cpu(p) for p in system) - system_before
    return Row(f"ray x{n}", len(reqs) * args.size, seconds, cpu, system_cpu, rewarded(results))


def big_group(size: int, tokens: int = 4096, turns: int = 3) -> Any:
    """A group result of ``size`` rollouts of ``turns`` turns and ``tokens`` tokens each."""
    from hermes_async.service.wire import GroupResult, RolloutRecord

    rng = random.Random(0)
    rollouts = []
    for i in range(size):
        ids = [rng.randrange(151_000) for _ in range(tokens)]
        prompt = tokens // 4
        masks = [-100] * prompt + ids[prompt:]
        logprobs = [1.0] * prompt + [-rng.random() * 3 for _ in range(tokens - prompt)]
        rollouts.append(RolloutRecord(f"g-{i}", ids, masks, logprobs, 1.0, True, turns=turns))
    return GroupResult("g", "echo", "ok", tuple(rollouts), worker="w")


def timed(fn: Any, repeat: int = 20) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


async def ray_cost(size: int) -> list[tuple[str, float, int]]:
    """(what, ms, bytes) per group."""
    from hermes_async.service.wire import GroupResult

    group = big_group(size)
    data = group.to_bytes()
    rows = [
        ("wire JSON encode", timed(group.to_bytes), len(data)),
        ("wire JSON decode", timed(lambda: GroupResult.from_bytes(data)), len(data)),
    ]
    pickled = pickle.dumps(group, protocol=5)
    rows.append(
        (
            "pickle of the same rows (for scale)",
            timed(lambda: pickle.dumps(group, protocol=5)),
            len(pickled),
        )
    )
    try:
        import ray
    except ImportError:
        return rows
    if not ray.is_initialized():
        return rows

    @ray.remote(num_cpus=0.1)
    class Echo:
        async def echo(self, body: bytes) -> tuple[int, bytes]:
            return 200, body

    actor = Echo.remote()
    await actor.echo.remote(b"")
    empty, full = [], []
    for _ in range(20):
        t0 = time.perf_counter()
        await actor.echo.remote(b"")
        empty.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await actor.echo.remote(data)
        full.append(time.perf_counter() - t0)
    rows.append(("actor call, empty (round trip)", statistics.median(empty) * 1e3, 0))
    rows.append(
        ("actor call carrying the group both ways", statistics.median(full) * 1e3, 2 * len(data))
    )
    put = timed(lambda: ray.get(ray.put(data)), 10)
    rows.append(("ray.put + ray.get of the group", put, len(data)))
    ray.kill(actor)
    return rows


async def main(args: argparse.Namespace) -> None:
    from hermes_async.tools.sandbox.leftovers import count_sandboxes

    server = subprocess.Popen(
        [sys.executable, "-c", SERVE.format(delay=args.model_latency)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    parent = tempfile.mkdtemp(prefix="hermes-scale-out-")
    rows: list[Row] = []
    ray_up = False
    if os.environ.get("RAY_ADDRESS") and not args.no_ray:
        try:
            import ray

            ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
            ray_up = True
        except ImportError:
            print("(Ray not installed: no ray rows; run with .venv-ray's python)")
    try:
        rows.append(await one_process(args, url, parent))
        for n in args.workers:
            rows.append(await service(args, url, parent, n))
        if ray_up:
            for n in args.workers:
                rows.append(await ray_workers(args, url, parent, n))
        cost = await ray_cost(args.size)
    finally:
        server.terminate()
        server.wait()
        server.stdout.close()
    base = rows[0]
    print(
        f"\n{args.groups} groups x {args.size} rollouts, {args.turns} tool turns each, "
        f"{args.isolation} sandboxes, model latency {args.model_latency}s, {os.cpu_count()} cores"
    )
    print(
        f"{'config':<12} {'rollouts/s':>10} {'x 1 proc':>9} {'CPU ms/rollout':>15} {'x 1 proc':>9} {'ray system ms':>14} {'rewarded':>9}"
    )
    for row in rows:
        system = f"{row.system_cpu / row.rollouts * 1e3:14.2f}" if row.system_cpu else f"{'-':>14}"
        print(
            f"{row.name:<12} {row.throughput:10.1f} {row.throughput / base.throughput:9.2f} "
            f"{row.cpu_ms:15.2f} {row.cpu_ms / base.cpu_ms:9.2f} {system} {row.rewarded:>9}"
        )
    cores = os.cpu_count() or 1
    print(
        f"ceiling on {cores} cores at the 1-process CPU per rollout: {cores / base.cpu * base.rollouts:.1f} rollouts/s"
    )
    print(f"\nper group of {args.size} rollouts x 3 turns x 4,096 tokens:")
    for what, ms, size in cost:
        print(f"  {what:<42} {ms:8.2f} ms  {size:>10,} bytes")
    print(f"sandboxes left on disk: {count_sandboxes(parent)}")
    with contextlib.suppress(OSError):  # empty if every worker closed cleanly
        os.rmdir(parent)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--model-latency", type=float, default=0.05)
    parser.add_argument("--deadline", type=float, default=900)
    parser.add_argument(
        "--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4]
    )
    parser.add_argument("--isolation", default="auto", choices=("auto", "namespaces", "process"))
    parser.add_argument("--no-ray", action="store_true")
    anyio.run(main, parser.parse_args())
