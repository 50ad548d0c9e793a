"""Closing many local sandboxes at once: event-loop lag, the shared ``/proc`` sweep vs the old scan.

Workload: N local sandboxes (default 500) through one ``SandboxManager``, each with a running
background ``sleep`` (so the host holds ~3 N extra processes: wrapper, stdin keeper, sleep).
Then all N are released at once, concurrently, while a 5 ms ticker in the same loop measures
the loop's lag (:func:`hermes_async.limits.open_lag_monitor`).

* **ours**: ``LocalSandbox.aclose`` as shipped: every sandbox closing at that moment is served by
  one shared ``/proc`` sweep (:class:`~hermes_async.tools.sandbox.processes.ProcessSweeper`),
  which yields to the loop every 2 ms of work.
* **baseline** (the previous design, reproduced here only): each sandbox scans the whole of
  ``/proc`` (``stat`` and ``environ`` of every host process) synchronously, on the event loop,
  once per kill round and once more to confirm, as ``aclose`` did before.

Both sides kill every process (checked after each run: 0 left) and remove every directory. The
process applies :func:`hermes_async.gc_tuning.tune_gc_for_rollouts` at start-up, as
``hermes-async demo`` and ``HermesAgentBaseEnv`` do (``--gc default`` keeps CPython's settings);
both sides run with the same collector settings.
Reported per side: wall time of the N releases, loop lag p50/p99/max during them, and ``/proc``
sweeps; then the ratios baseline/ours (machines are noisy; absolute numbers mean little).

    .venv/bin/python bench/sandbox_close.py                 # N = 500, both sides, asyncio
    .venv/bin/python bench/sandbox_close.py --sandboxes 100 --backend trio
    .venv/bin/python bench/sandbox_close.py --modes ours
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import anyio

from hermes_async.gc_tuning import tune_gc_for_rollouts
from hermes_async.limits import LagStatistics, Limits, open_lag_monitor
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.local import (
    KILL_WAIT_SECONDS,
    SANDBOX_MARKER_ENV,
    DirectoryRemover,
    LocalSandbox,
)
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.sandbox.processes import ProcessSweeper, read_process_table

# --------------------------------------------------------------------------------- baseline


def _old_proc_stat(pid: str) -> tuple[str, int, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        return None


def _old_find_sandbox_processes(marker: str, sessions: Iterable[int]) -> list[int]:
    """The previous membership scan: every host process's stat and environ, synchronously."""
    wanted = set(sessions)
    needle = f"{SANDBOX_MARKER_ENV}={marker}".encode()
    me = os.getpid()
    marked: list[int] = []
    by_session: list[tuple[int, int]] = []
    confirmed: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        stat = _old_proc_stat(entry)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            environ = b""
        if any(item == needle for item in environ.split(b"\0")):
            marked.append(int(entry))
            confirmed.add(stat[2])
        elif stat[2] in wanted:
            by_session.append((int(entry), stat[2]))
    return marked + [pid for pid, sid in by_session if sid in confirmed]


class OldScanSandbox(LocalSandbox):
    """``LocalSandbox`` with the previous kill loop: a full synchronous scan per round."""

    async def _kill_everything(self, *, graceful: bool) -> list[int]:
        stages = [(signal.SIGTERM, self.terminate_grace)] if graceful else []
        stages.append((signal.SIGKILL, KILL_WAIT_SECONDS))
        for sig, wait in stages:
            deadline = anyio.current_time() + wait
            while True:
                pids = _old_find_sandbox_processes(self.sandbox_id, self._groups)
                if not pids:
                    # The previous aclose then confirmed with one more full scan.
                    return _old_find_sandbox_processes(self.sandbox_id, self._groups)
                groups = set()
                for pid in pids:
                    stat = _old_proc_stat(str(pid))
                    if stat is not None:
                        groups.add(stat[1])
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
                for pg in groups:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pg, sig)
                if anyio.current_time() >= deadline:
                    break
                await anyio.sleep(0.02)
        return _old_find_sandbox_processes(self.sandbox_id, self._groups)


# --------------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Outcome:
    mode: str
    close_seconds: float
    lag: LagStatistics
    sweeps: int
    rm_runs: int
    leftover_processes: int
    leftover_dirs: int


def _factory(
    cls: type[LocalSandbox], root: str, sweeper: ProcessSweeper, remover: DirectoryRemover
) -> Callable[[str], Awaitable[Sandbox]]:
    async def factory(task_id: str) -> Sandbox:
        # The baseline removed each directory with its own `rm`: a private remover each.
        shared = None if cls is OldScanSandbox else remover
        return await cls.create(task_id, root_dir=root, sweeper=sweeper, remover=shared)

    return factory


async def run_mode(mode: str, n: int, setup_concurrency: int) -> Outcome:
    cls = OldScanSandbox if mode == "baseline" else LocalSandbox
    sweeper = ProcessSweeper()
    remover = DirectoryRemover()
    limits = Limits(sandbox_create=setup_concurrency, sandbox_exec=max(n, 1))
    with tempfile.TemporaryDirectory(prefix=f"bench-close-{mode}-") as root:
        async with SandboxManager(
            _factory(cls, root, sweeper, remover),
            limits=limits,
            idle_timeout=None,
            close_timeout=600,
        ) as manager:
            ids = [f"{mode}-{i}" for i in range(n)]
            inner: list[LocalSandbox] = []
            gate = anyio.CapacityLimiter(setup_concurrency)

            async def start(task_id: str) -> None:
                async with gate:
                    sandbox = await manager.get(task_id)
                    await sandbox.start_background("sleep 100000")
                    assert isinstance(sandbox.inner, LocalSandbox)
                    inner.append(sandbox.inner)

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for task_id in ids:
                    tg.start_soon(start, task_id)
            print(
                f"  [{mode}] {n} sandboxes with a background sleep ready in "
                f"{time.perf_counter() - t0:.1f} s ({len(os.listdir('/proc'))} /proc entries)",
                flush=True,
            )
            markers = {sb.sandbox_id: tuple(sb._groups) for sb in inner}
            before = read_process_table()
            alive = sum(len(before.members(m, s)) for m, s in markers.items())
            assert alive >= n, f"expected >= {n} sandbox processes, found {alive}"
            sweeps_before = sweeper.statistics().sweeps
            async with open_lag_monitor() as monitor:
                await anyio.sleep(0.2)
                monitor.reset()
                start_close = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for task_id in ids:
                        tg.start_soon(manager.release, task_id)
                close_seconds = time.perf_counter() - start_close
                lag = monitor.statistics()
            after = read_process_table()
            leftover = sum(len(after.members(m, s)) for m, s in markers.items())
            leftover_dirs = len(os.listdir(root))
    return Outcome(
        mode,
        close_seconds,
        lag,
        sweeper.statistics().sweeps - sweeps_before,
        remover.runs if mode == "ours" else n,
        leftover,
        leftover_dirs,
    )


def _row(o: Outcome) -> str:
    sweeps = str(o.sweeps) if o.mode == "ours" else "3+/sandbox"
    return (
        f"{o.mode:<9} {o.close_seconds:>9.2f} {o.lag.p50 * 1e3:>9.2f} {o.lag.p99 * 1e3:>9.2f} "
        f"{o.lag.max * 1e3:>9.1f} {sweeps:>12} {o.rm_runs:>7} {o.leftover_processes:>6} "
        f"{o.leftover_dirs:>5}"
    )


async def main(args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    outcomes: dict[str, Outcome] = {}
    print(
        f"closing {args.sandboxes} local sandboxes at once ({args.backend}, gc {args.gc}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)",
        flush=True,
    )
    for mode in modes:
        outcomes[mode] = await run_mode(mode, args.sandboxes, args.setup_concurrency)
    print()
    print(
        f"{'mode':<9} {'close s':>9} {'lag p50':>9} {'lag p99':>9} {'lag max':>9} "
        f"{'/proc sweeps':>12} {'rm runs':>7} {'procs':>6} {'dirs':>5}"
    )
    print(f"{'':<9} {'':>9} {'ms':>9} {'ms':>9} {'ms':>9} {'':>12} {'':>7} {'left':>6} {'left':>5}")
    for o in outcomes.values():
        print(_row(o))
    if "baseline" in outcomes and "ours" in outcomes:
        b, o = outcomes["baseline"], outcomes["ours"]
        print()
        print(
            f"ratio baseline/ours: lag p99 {b.lag.p99 / max(o.lag.p99, 1e-6):.1f}x, "
            f"lag max {b.lag.max / max(o.lag.max, 1e-6):.1f}x, "
            f"close time {b.close_seconds / max(o.close_seconds, 1e-6):.1f}x"
        )
    failed = [o.mode for o in outcomes.values() if o.leftover_processes or o.leftover_dirs]
    if failed:
        print(f"FAILED: processes or directories left behind by {failed}", file=sys.stderr)
        return 1
    if "ours" in outcomes and outcomes["ours"].lag.p99 >= args.p99_budget:
        print(
            f"FAILED: ours lag p99 {outcomes['ours'].lag.p99 * 1e3:.1f} ms >= "
            f"{args.p99_budget * 1e3:.0f} ms",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandboxes", type=int, default=500)
    parser.add_argument("--modes", default="baseline,ours", help="comma-separated: baseline,ours")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument(
        "--setup-concurrency", type=int, default=32, help="sandboxes prepared at once (setup only)"
    )
    parser.add_argument(
        "--p99-budget", type=float, default=0.020, help="fail if ours lag p99 reaches this (s)"
    )
    parser.add_argument("--gc", choices=("tuned", "default"), default="tuned")
    ns = parser.parse_args()
    if ns.gc == "tuned":
        tune_gc_for_rollouts()
    sys.exit(anyio.run(main, ns, backend=ns.backend))
