"""Hostile model servers against the clients: time to error and peak RSS, one tree beside another.

Each case of :mod:`hermes_async.testing.hostile` is served on loopback by this process; the
client runs in a child process of its own (``attack(case, url)`` with the default options,
under an address-space limit), importing the package from the tree under test. The child
reports what the client raised, how long it took, and its peak RSS (``VmHWM``); a child
that the limit kills is reported as such.

    PYTHONPATH=. .venv/bin/python bench/hostile.py                           # this tree
    PYTHONPATH=. .venv/bin/python bench/hostile.py --baseline /work/main     # side by side
    PYTHONPATH=. .venv/bin/python bench/hostile.py --cases endless_tokens --timeout 30

(``PYTHONPATH=.``: a script's own folder, not the working directory, starts ``sys.path``.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

import anyio

_KIT = Path(__file__).resolve().parent.parent / "hermes_async" / "testing" / "hostile.py"


def _child() -> None:
    """Run the kit's command line (``attack`` under a limit) against the tree on PYTHONPATH.

    The kit is loaded from this tree by path: the tree under test need not have it.
    """
    spec = importlib.util.spec_from_file_location("_hostile_kit", _KIT)
    assert spec is not None and spec.loader is not None
    kit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kit)
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    kit._main()


async def _measure(tree: str, case: str, url: str, args: argparse.Namespace) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": tree}
    command = [
        sys.executable,
        __file__,
        "--child",
        case,
        url,
        "--rlimit-as",
        str(args.rlimit_mib * 2**20),
        "--timeout",
        str(args.timeout),
    ]
    done = await anyio.run_process(command, env=env, check=False)
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.decode().strip().splitlines()[-1:] or [""]
        return {"error": f"died (exit {done.returncode})", "message": tail[0], "seconds": None}
    result: dict[str, object] = json.loads(lines[-1])
    return result


def _cell(result: dict[str, object]) -> str:
    seconds = result.get("seconds")
    rss = result.get("peak_rss_bytes")
    shown_s = f"{seconds:8.3f} s" if isinstance(seconds, int | float) else "       - "
    shown_rss = f"{rss / 2**20:7.0f} MiB" if isinstance(rss, int) else "        - "
    return f"{str(result['error'])[:22]:<22} {shown_s} {shown_rss}"


async def _main(args: argparse.Namespace) -> None:
    from hermes_async.testing.hostile import HOSTILE_CASES, open_hostile_server

    trees = [("this tree", str(Path(__file__).resolve().parent.parent))]
    if args.baseline:
        trees.append(("baseline", args.baseline))
    cases = args.cases or list(HOSTILE_CASES)
    header = f"{'case':<22}" + "".join(f" | {name:<44}" for name, _ in trees)
    print(f"RLIMIT_AS {args.rlimit_mib} MiB, give up after {args.timeout:g} s")
    print(header)
    print("-" * len(header))
    details = []
    for case in cases:
        cells = []
        for name, tree in trees:
            async with open_hostile_server(case) as server:  # type: ignore[arg-type]
                result = await _measure(tree, case, server.url, args)
            cells.append(_cell(result))
            details.append(f"{case} [{name}]: {result.get('message')}")
        print(f"{case:<22}" + "".join(f" | {cell:<44}" for cell in cells), flush=True)
    if args.verbose:
        print()
        print("\n".join(details))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child()
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="another tree (its root) to run the same clients of")
    parser.add_argument("--cases", nargs="*", help="cases to run (default: all)")
    parser.add_argument("--rlimit-mib", type=int, default=1024, help="child's RLIMIT_AS")
    parser.add_argument("--timeout", type=float, default=60.0, help="child gives up after")
    parser.add_argument("--verbose", action="store_true", help="print each error's message")
    anyio.run(_main, parser.parse_args())
