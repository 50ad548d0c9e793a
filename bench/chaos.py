"""The chaos harness at scale: containment under random faults, next to a fault-free baseline.

Runs :func:`hermes_async.testing.chaos.run_chaos` twice in one process — once with every fault
kind injected at random (server 500/429, disconnect mid-stream, malformed chunk, stall, sandbox
create failure and hang, exec hang, exec death, a reward that raises, hostile model text), once
with none — and prints both reports plus the ratios (wall time, attempts per rollout). The
verdict lines are the acceptance numbers of issue 16: group aborts, mixed groups, rollouts past
``rollout_timeout`` + the close bound, uncategorized failures, leaked secrets, sandboxes, tasks
and file descriptors — all must be 0.

    PYTHONPATH=. .venv/bin/python bench/chaos.py                          # 10,000, fake sandboxes
    PYTHONPATH=. .venv/bin/python bench/chaos.py --rollouts 1000 --sandbox local
    PYTHONPATH=. .venv/bin/python bench/chaos.py --rollouts 800 --protocol chat --backend trio

Exit status 1 when containment failed in the chaos run.
"""

from __future__ import annotations

import argparse
import sys

import anyio

from hermes_async.testing.chaos import ChaosConfig, ChaosStatistics, run_chaos


async def _run(args: argparse.Namespace) -> tuple[ChaosStatistics, ChaosStatistics | None]:
    common = {
        "rollouts": args.rollouts,
        "group_size": args.group_size,
        "concurrency": args.concurrency,
        "seed": args.seed,
        "sandbox": args.sandbox,
        "protocol": args.protocol,
        "loopback": args.loopback,
        "rollout_timeout": args.rollout_timeout,
        "tool_timeout": args.tool_timeout,
        # A local close may spend its TERM -> KILL grace (2 s) on a command still running: a
        # 2 s bound (the fake default) would abandon it every time and leave its directory.
        "close_timeout": args.close_timeout
        if args.close_timeout is not None
        else (10.0 if args.sandbox == "local" else 2.0),
    }
    chaos = await run_chaos(ChaosConfig(fault_rate=args.fault_rate, **common))
    clean = None if args.no_baseline else await run_chaos(ChaosConfig(fault_rate=0.0, **common))
    return chaos, clean


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8, help="groups at once")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--fault-rate", type=float, default=0.08)
    parser.add_argument("--sandbox", choices=("fake", "local"), default="fake")
    parser.add_argument("--protocol", choices=("vllm", "chat"), default="vllm")
    parser.add_argument("--loopback", action="store_true", help="serve over a real socket")
    parser.add_argument("--rollout-timeout", type=float, default=10.0)
    parser.add_argument("--tool-timeout", type=float, default=0.5)
    parser.add_argument(
        "--close-timeout", type=float, default=None, help="default: 2 (fake), 10 (local)"
    )
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--no-baseline", action="store_true", help="skip the fault-free run")
    args = parser.parse_args()
    chaos, clean = anyio.run(_run, args, backend=args.backend)
    print(f"chaos (fault rate {args.fault_rate:g}, {args.sandbox} sandboxes, {args.protocol}):")
    print(chaos.format())
    if clean is not None:
        print("baseline (no faults):")
        print(clean.format())
        print(
            f"ratios chaos/baseline: wall time {chaos.seconds / max(clean.seconds, 1e-9):.2f}x, "
            f"attempts per rollout {chaos.attempts / max(chaos.rollouts, 1):.3f} vs "
            f"{clean.attempts / max(clean.rollouts, 1):.3f}"
        )
    return 0 if chaos.ok and (clean is None or clean.ok) else 1


if __name__ == "__main__":
    sys.exit(main())
