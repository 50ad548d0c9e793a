"""Start-up as a user sees it: seconds to the first line of output, this tree vs a baseline.

Cases, each a fresh process with its output read line by line (stdout and stderr merged):

* ``demo``: ``hermes-async demo`` (what ``make demo`` runs), stopped at its first line;
* ``demo-fail``: the demo with ``--env.tool_call_parser hermez``, to the line naming it;
* ``cli-fail``: ``python -m hermes_async.envs.terminal_test evaluate --env.tool_call_parser
  hermez`` (the reference CLI), to the line naming it; also its number of output lines.

Each side imports its own ``hermes_async``: this checkout, or the baseline's, exported with
``git archive`` into a temporary directory. Rounds alternate between the sides; medians and
the ratio (baseline / this tree) are printed. Import time dominates: on a loaded machine the
absolute seconds grow, the ratio of the first case much less.

    .venv/bin/python bench/startup.py                   # baseline: main, 3 rounds
    .venv/bin/python bench/startup.py --baseline 7bbc8c7 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollout_cpu import ROOT, export

CASES: dict[str, tuple[list[str], str | None]] = {
    "demo": (["-m", "hermes_async.cli", "demo", "--no-progress"], None),
    "demo-fail": (
        ["-m", "hermes_async.cli", "demo", "--no-progress", "--env.tool_call_parser", "hermez"],
        "hermez",
    ),
    "cli-fail": (
        ["-m", "hermes_async.envs.terminal_test", "evaluate", "--env.tool_call_parser", "hermez"],
        "hermez",
    ),
}


def measure(tree: Path, args: list[str], marker: str | None, out: Path) -> tuple[float, int]:
    """Seconds to the first line (or to the first line holding ``marker``), and lines printed."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    env.pop("WANDB_MODE", None)
    argv = [sys.executable, *args]
    if args[1] == "hermes_async.cli":
        argv += ["--out", str(out)]
    start = time.monotonic()
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=out
    )
    assert process.stdout is not None
    seconds, lines = float("nan"), 0
    for raw in iter(process.stdout.readline, b""):
        lines += 1
        if seconds != seconds and (marker is None or marker in raw.decode(errors="replace")):
            seconds = time.monotonic() - start
            if marker is None:
                process.terminate()
                break
    process.stdout.close()
    process.wait(timeout=120)
    return seconds, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main", help="a commit or branch (default: main)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = export(args.baseline, Path(tmp))
        out = Path(tmp) / "out"
        out.mkdir()
        sides = {"baseline": base, "this tree": ROOT}
        print(f"baseline {args.baseline}, {args.rounds} rounds (seconds; lines printed)")
        for name, (argv, marker) in CASES.items():
            times: dict[str, list[float]] = {side: [] for side in sides}
            lines: dict[str, int] = {}
            for _ in range(args.rounds):
                for side, tree in sides.items():
                    seconds, count = measure(tree, argv, marker, out)
                    times[side].append(seconds)
                    lines[side] = count
            medians = {side: statistics.median(v) for side, v in times.items()}
            print(
                f"{name:10} baseline {medians['baseline']:6.2f} s ({lines['baseline']:3d} lines)"
                f"  this tree {medians['this tree']:6.2f} s ({lines['this tree']:3d} lines)"
                f"  ratio {medians['baseline'] / medians['this tree']:5.1f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
