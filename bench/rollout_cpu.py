"""Client CPU per Phase 2 rollout: this tree vs a baseline commit, side by side in one run.

Workload (``bench/concurrency.py``'s): N concurrent rollouts of ``--turns`` tool turns and a
final answer each, against the scripted model server in a separate process (its CPU does not
count), with a tool that sleeps. Each side runs in its own client process -- this tree's
``hermes_async``, or the baseline's, exported with ``git archive`` into a temporary directory --
and reports ``time.process_time()`` over its N rollouts (after a warm-up batch). Rounds
alternate between the sides; the medians and their ratio (baseline / this tree) are printed.
Both sides run with the library's defaults (GC tuned as ``HermesAgentBaseEnv`` does).

The default baseline, :data:`ROUND_1`, is the tree issue #23's "today's 4.4 ms" was measured on
(the end of round 1); with ``--n 2000 --model-latency 0.2 --tool-latency 1`` this is that
acceptance point's "same workload, same run" (ratio >= 2.0 wanted). Any commit or branch of
this clone works as ``--baseline``.

    .venv/bin/python bench/rollout_cpu.py                       # baseline: ROUND_1, N=300
    .venv/bin/python bench/rollout_cpu.py --n 2000 --model-latency 0.2 --tool-latency 1
    .venv/bin/python bench/rollout_cpu.py --baseline 1307e95 --n 500 --rounds 5 --turns 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: The last commit of round 1 (2026-11-29): the client CPU issue #23 asks to halve.
ROUND_1 = "38d994c"


async def client(args: argparse.Namespace) -> None:
    # Imported here: the baseline's package is on PYTHONPATH in its own process.
    sys.path.insert(0, str(HERE))
    import concurrency  # type: ignore[import-not-found]

    import hermes_async
    from hermes_async import load_tokenizer
    from hermes_async.gc_tuning import tune_gc_for_rollouts

    load_tokenizer()
    tune_gc_for_rollouts()

    async def handler(arguments: object, runtime: object) -> str:
        await anyio.sleep(args.tool_latency)
        return '{"ok": true}'

    await concurrency.run_rollouts(args.base_url, min(args.n, 50), handler, label="warm")
    start = time.process_time()
    _elapsed, completed, *_ = await concurrency.run_rollouts(
        args.base_url, args.n, handler, label="run"
    )
    cpu = time.process_time() - start
    result = {"cpu_ms_per_rollout": cpu / args.n * 1e3, "completed": completed}
    print(json.dumps({**result, "package": hermes_async.__file__}))


def export(ref: str, into: Path) -> Path:
    """``hermes_async`` of ``ref`` (``git archive``) under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "hermes_async"],
        check=True,
        capture_output=True,
    ).stdout
    tar = into / "src.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return into


def run_side(tree: Path, base_url: str, args: argparse.Namespace) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [
        sys.executable,
        __file__,
        "--client",
        "--base-url",
        base_url,
        "--n",
        str(args.n),
        "--tool-latency",
        str(args.tool_latency),
    ]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not str(result["package"]).startswith(str(tree)):  # the side's own tree, nothing else
        raise SystemExit(f"{tree}: the client imported {result['package']}")
    if result["completed"] != args.n:
        raise SystemExit(f"{tree}: only {result['completed']}/{args.n} rollouts completed")
    return float(result["cpu_ms_per_rollout"])


def main(args: argparse.Namespace) -> None:
    serve = [
        sys.executable,
        str(HERE / "concurrency.py"),
        "--serve",
        "--model-latency",
        str(args.model_latency),
        "--tool-latency",
        str(args.tool_latency),
        "--turns",
        str(args.turns),
    ]
    with tempfile.TemporaryDirectory(prefix="hermes-bench-baseline-") as tmp:
        baseline = export(args.baseline, Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        server = subprocess.Popen(serve, env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            base_url = server.stdout.readline().split()[0]
            print(
                f"N={args.n} concurrent rollouts, {args.turns} tool turns + answer each; model "
                f"latency {args.model_latency}s, tool {args.tool_latency}s; baseline "
                f"{args.baseline!r}; {args.rounds} alternating rounds"
            )
            sides: dict[str, list[float]] = {"baseline": [], "this tree": []}
            for _ in range(args.rounds):
                sides["baseline"].append(run_side(baseline, base_url, args))
                sides["this tree"].append(run_side(ROOT, base_url, args))
                print(
                    f"  baseline {sides['baseline'][-1]:.2f} ms/rollout, "
                    f"this tree {sides['this tree'][-1]:.2f} ms/rollout",
                    flush=True,
                )
        finally:
            server.terminate()
            server.wait()
    base = statistics.median(sides["baseline"])
    ours = statistics.median(sides["this tree"])
    print(
        f"client CPU per rollout (median): baseline {base:.2f} ms, this tree {ours:.2f} ms, "
        f"ratio {base / ours:.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=ROUND_1, help="git ref of the baseline")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--model-latency", type=float, default=0.05)
    parser.add_argument("--tool-latency", type=float, default=0.05)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.client:
        anyio.run(client, ns)
    else:
        main(ns)
