"""What namespaced local sandboxes cost: create + first exec, exec, close; namespaces vs process.

Workload, per isolation mode and per concurrency N (default 1, 64, 256): N local sandboxes are
created at once (each task: ``LocalSandbox.create`` then ``exec("true")``: *create+first*),
then every sandbox runs ``--execs`` commands one after another, all sandboxes concurrently
(``echo $((1+1))``: *exec*), then all N are closed at once (*close*; graceful, no process
left to wait for). No limiter in the way: the numbers are the backends' own cost at that
concurrency on this machine (2 cores shared here), so the ratio namespaces/process is the
price of the isolation. A 5 ms ticker measures the event loop's lag over each phase.

* **namespaces**: a bubblewrap world per sandbox (cgroups, loop-mounted ext4 disk cap, PID /
  mount / net / IPC / UTS namespaces), each command entering it with ``nsenter``.
* **process** (baseline): a directory and process groups (what ``isolation="process"`` is).

Every phase runs under a deadline (``--deadline``, default 600 s): a deadlock fails the run.
After each mode the sandboxes' processes are counted from the host (must be 0) and the root
directory must be empty.

    .venv/bin/python bench/sandboxes_isolation.py                       # N = 1, 64, 256
    .venv/bin/python bench/sandboxes_isolation.py --concurrency 1,16 --backend trio
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass

import anyio

from hermes_async.errors import ConfigError
from hermes_async.limits import LagStatistics, open_lag_monitor
from hermes_async.tools.sandbox.local import LocalSandbox, resolve_isolation
from hermes_async.tools.sandbox.namespaces import NamespaceOptions


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True, slots=True)
class Phase:
    p50: float
    p99: float
    wall: float
    lag: LagStatistics

    @classmethod
    def of(cls, values: list[float], wall: float, lag: LagStatistics) -> Phase:
        return cls(statistics.median(values), _pct(values, 0.99), wall, lag)


@dataclass(frozen=True, slots=True)
class Outcome:
    mode: str
    n: int
    create: Phase
    exec: Phase
    close: Phase


async def run(mode: str, n: int, execs: int, deadline: float, disk_mb: int) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="hermes-bench-iso-") as root:
        options = NamespaceOptions(disk_limit_mb=disk_mb)
        sandboxes: list[LocalSandbox] = []
        create: list[float] = []
        exec_times: list[float] = []
        close: list[float] = []

        async def make(i: int) -> None:
            start = anyio.current_time()
            sb = await LocalSandbox.create(
                f"bench-{i}",
                root_dir=root,
                isolation=mode,  # type: ignore[arg-type]
                namespace_options=options,
            )
            sandboxes.append(sb)
            r = await sb.exec("true")
            assert r.exit_code == 0, r
            create.append(anyio.current_time() - start)

        async def work(sb: LocalSandbox) -> None:
            for _ in range(execs):
                start = anyio.current_time()
                r = await sb.exec("echo $((1+1))")
                exec_times.append(anyio.current_time() - start)
                assert r.stdout == "2\n", r

        async def end(sb: LocalSandbox) -> None:
            start = anyio.current_time()
            await sb.aclose()
            close.append(anyio.current_time() - start)

        phases = []
        try:
            for step in ("create", "exec", "close"):
                async with open_lag_monitor() as monitor:
                    start = anyio.current_time()
                    with anyio.fail_after(deadline):
                        async with anyio.create_task_group() as tg:
                            if step == "create":
                                for i in range(n):
                                    tg.start_soon(make, i)
                            else:
                                for sb in list(sandboxes):
                                    tg.start_soon(work if step == "exec" else end, sb)
                    phases.append((anyio.current_time() - start, monitor.statistics()))
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(120):
                for sb in sandboxes:
                    await sb.aclose()
        left = [pid for sb in sandboxes for pid in sb.live_processes()]
        assert left == [], f"{mode}: {len(left)} processes left after close"
        leftover = [p async for p in anyio.Path(root).iterdir()]
        assert leftover == [], f"{mode}: directories left in {root}: {leftover}"
    return Outcome(
        mode,
        n,
        Phase.of(create, *phases[0]),
        Phase.of(exec_times, *phases[1]),
        Phase.of(close, *phases[2]),
    )


def _ms(x: float) -> str:
    return f"{x * 1e3:8.1f}"


async def main(args: argparse.Namespace) -> int:
    try:
        await resolve_isolation("namespaces")
    except ConfigError as exc:
        print(exc)
        return 1
    print(
        f"{'N':>4} {'mode':<11} | create+1st p50/p99 ms | exec p50/p99 ms | close p50/p99 ms"
        " | wall create/exec/close s | lag max ms"
    )
    rows: dict[tuple[str, int], Outcome] = {}
    for mode in ("process", "namespaces"):  # warm-up: the bwrap probe, the disk image template
        await run(mode, 2, 1, args.deadline, args.disk_mb)
    for n in args.concurrency:
        for mode in ("process", "namespaces"):
            o = await run(mode, n, args.execs, args.deadline, args.disk_mb)
            rows[(mode, n)] = o
            lag = max(o.create.lag.max, o.exec.lag.max, o.close.lag.max)
            print(
                f"{n:>4} {mode:<11} | {_ms(o.create.p50)} {_ms(o.create.p99)}    |"
                f" {_ms(o.exec.p50)} {_ms(o.exec.p99)} | {_ms(o.close.p50)} {_ms(o.close.p99)}"
                f" | {o.create.wall:6.2f} {o.exec.wall:6.2f} {o.close.wall:6.2f}"
                f"     | {lag * 1e3:7.1f}",
                flush=True,
            )
    print("\nratios namespaces / process (p50, p99):")
    for n in args.concurrency:
        ns, pr = rows[("namespaces", n)], rows[("process", n)]
        parts = []
        for name in ("create", "exec", "close"):
            a, b = getattr(ns, name), getattr(pr, name)
            parts.append(f"{name} {a.p50 / b.p50:5.2f}x / {a.p99 / b.p99:5.2f}x")
        print(f"  N={n:<4} " + ", ".join(parts))
    print(f"\nno deadlock: {max(args.concurrency)} concurrent namespaced sandboxes ran commands")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64, 256]
    )
    parser.add_argument("--execs", type=int, default=5, help="commands per sandbox")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds per phase")
    parser.add_argument("--disk-mb", type=int, default=2048, help="disk cap per sandbox")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    ns = parser.parse_args()
    sys.exit(anyio.run(main, ns, backend=ns.backend))
