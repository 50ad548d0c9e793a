"""Sandbox lifecycles against the peers: create, first exec, a few commands, close.

One lifecycle: create a sandbox and run ``true`` in it (*create*: until that first command has
returned), run ``--execs`` more commands one after another (``echo $((1+1))``), close it.
At each concurrency C, C workers each run ``--per-worker`` lifecycles back to back; reported
per side: p50 / p99 of create and of the whole lifecycle, lifecycles per second (all of them
over the wall time) and the client's CPU per lifecycle. Sides, each in its own process:

* ``local-ns``: hermes_async's namespaced local backend (bubblewrap; needs root);
* ``docker``: hermes_async's Docker backend (the engine's API, one container per sandbox);
* ``inspect``: Inspect's Docker sandbox (``DockerSandboxEnvironment``: ``sample_init``,
  ``exec``, ``sample_cleanup``: ``docker compose`` per sample), in ``bench/peers/setup.sh``'s
  venv;
* ``harbor``: Harbor's ``DockerEnvironment`` (``start``, ``exec``, ``stop``: ``docker
  compose`` per trial), in ``scripts/terminalbench/harbor_venv.sh``'s venv.

Every Docker side uses the same engine (``DOCKER_HOST``) and the same image (``--image``,
default ``hermes-async-base:bookworm``, ``scripts/docker/base_image.sh``) with the network off
(ours by default; the peers through their own no-network compose settings). Sides alternate
within each C; after each run no container of the run may be left. Ratios: lifecycles/s of
``docker`` over each peer's, and ``docker`` create p50 over ``local-ns``'s.

    eval "$(scripts/docker/engine.sh env)"
    PYTHONPATH=. .venv/bin/python bench/sandbox_lifecycle.py                  # C = 16, 64, 256
    PYTHONPATH=. .venv/bin/python bench/sandbox_lifecycle.py --concurrency 16 --sides docker,inspect
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIDES = ("local-ns", "docker", "inspect", "harbor")
DEFAULT_IMAGE = "hermes-async-base:bookworm"
LABEL = "hermes-bench-lifecycle"
COMMAND = "echo $((1+1))"


# ------------------------------------------------------------------------------ client side


class Lifecycle:
    """One side's three steps; each side implements them with its own API."""

    async def start(self) -> None:
        """Once per run, before any lifecycle (untimed)."""

    async def create(self, name: str) -> Any:
        raise NotImplementedError

    async def exec(self, sandbox: Any, command: str) -> str:
        raise NotImplementedError

    async def close(self, sandbox: Any) -> None:
        raise NotImplementedError

    async def finish(self) -> None:
        """Once per run, after every lifecycle (untimed)."""


class Ours(Lifecycle):
    def __init__(self, args: argparse.Namespace, backend: str) -> None:
        from hermes_async.tools.sandbox.backends import make_backend_factory

        self.root = tempfile.mkdtemp(prefix="hermes-bench-lifecycle-")
        if backend == "local-ns":
            self.factory = make_backend_factory("local", isolation="namespaces", root_dir=self.root)
        else:
            self.factory = make_backend_factory("docker", image=args.image)

    async def create(self, name: str) -> Any:
        return await self.factory(name)

    async def exec(self, sandbox: Any, command: str) -> str:
        result = await sandbox.exec(command)
        return str(result.stdout)

    async def close(self, sandbox: Any) -> None:
        await sandbox.aclose()

    async def finish(self) -> None:
        os.rmdir(self.root)  # empty: every sandbox removed its directory


class Inspect(Lifecycle):
    def __init__(self, args: argparse.Namespace) -> None:
        from inspect_ai.util._sandbox.docker.docker import DockerSandboxEnvironment

        self.env = DockerSandboxEnvironment
        self.dir = tempfile.mkdtemp(prefix="hermes-bench-inspect-")
        self.compose = os.path.join(self.dir, "compose.yaml")
        with open(self.compose, "w") as f:
            f.write(
                "services:\n  default:\n"
                f"    image: {args.image}\n"
                "    x-local: true\n"  # a local image: never pulled
                "    network_mode: none\n"
                "    init: true\n"
                '    command: ["tail", "-f", "/dev/null"]\n'
            )

    async def start(self) -> None:
        from inspect_ai.util._sandbox.docker import prereqs

        # Inspect refuses Docker Engine < 24.0.6; the shared engine is Debian bookworm's
        # 20.10: its engine check runs against that version instead (compose's stays as is).
        check_engine = prereqs.validate_docker_engine

        async def engine_20_10() -> None:
            await check_engine("20.10.0")

        prereqs.validate_docker_engine = engine_20_10  # type: ignore[assignment]
        await self.env.task_init("bench", self.compose)

    async def create(self, name: str) -> Any:
        return await self.env.sample_init("bench", self.compose, {})

    async def exec(self, sandbox: Any, command: str) -> str:
        result = await sandbox["default"].exec(["sh", "-c", command])
        return str(result.stdout)

    async def close(self, sandbox: Any) -> None:
        await self.env.sample_cleanup("bench", self.compose, sandbox, interrupted=False)

    async def finish(self) -> None:
        await self.env.task_cleanup("bench", self.compose, cleanup=True)
        shutil.rmtree(self.dir)


class Harbor(Lifecycle):
    def __init__(self, args: argparse.Namespace) -> None:
        from harbor.environments.docker import COMPOSE_NO_NETWORK_PATH
        from harbor.environments.docker.docker import DockerEnvironment
        from harbor.models.task.config import EnvironmentConfig
        from harbor.models.trial.paths import TrialPaths

        self.dir = Path(tempfile.mkdtemp(prefix="hermes-bench-harbor-"))
        (self.dir / "environment").mkdir()

        def make(name: str) -> Any:
            paths = TrialPaths(trial_dir=self.dir / name)
            paths.mkdir()
            return DockerEnvironment(
                environment_dir=self.dir / "environment",
                environment_name="bench",
                session_id=name,
                trial_paths=paths,
                task_env_config=EnvironmentConfig(docker_image=args.image),
                extra_docker_compose=[COMPOSE_NO_NETWORK_PATH],  # Harbor's own no-network file
            )

        self.make = make

    async def create(self, name: str) -> Any:
        environment = self.make(name)
        await environment.start(force_build=False)
        return environment

    async def exec(self, sandbox: Any, command: str) -> str:
        result = await sandbox.exec(command)
        return str(result.stdout or "")  # None when the command printed nothing

    async def close(self, sandbox: Any) -> None:
        await sandbox.stop(delete=True)  # Harbor's default (TrialConfig.environment.delete)

    async def finish(self) -> None:
        shutil.rmtree(self.dir)  # the trials' log directories


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


async def run_lifecycles(side: Lifecycle, args: argparse.Namespace) -> dict[str, Any]:
    import anyio

    rows: list[tuple[float, float]] = []
    failures: list[str] = []
    tag = uuid.uuid4().hex[:6]

    async def lifecycle(name: str) -> None:
        start = time.perf_counter()
        sandbox = await side.create(name)
        try:
            assert (await side.exec(sandbox, "true")) == ""
            created = time.perf_counter()
            for _ in range(args.execs):
                output = await side.exec(sandbox, COMMAND)
                assert output.strip() == "2", output
        finally:
            await side.close(sandbox)
        rows.append((created - start, time.perf_counter() - start))

    async def worker(w: int) -> None:
        for k in range(args.per_worker):
            try:
                await lifecycle(f"{LABEL}-{tag}-{w}-{k}")
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}"[:300])

    await side.start()
    cpu, wall = _cpu(), time.perf_counter()
    with anyio.fail_after(args.deadline):
        async with anyio.create_task_group() as tg:
            for w in range(args.concurrency):
                tg.start_soon(worker, w)
    cpu, wall = _cpu() - cpu, time.perf_counter() - wall
    await side.finish()
    return {
        "create": [r[0] for r in rows],
        "total": [r[1] for r in rows],
        "wall_s": wall,
        "cpu_s": cpu,
        "failures": failures,
    }


def client(args: argparse.Namespace) -> None:
    import anyio

    side: Lifecycle
    if args.client in ("local-ns", "docker"):
        side = Ours(args, args.client)
    elif args.client == "inspect":
        side = Inspect(args)
    elif args.client == "harbor":
        side = Harbor(args)
    else:
        raise SystemExit(f"unknown side {args.client!r}; known: {', '.join(SIDES)}")
    print(json.dumps(anyio.run(run_lifecycles, side, args)), flush=True)


# ------------------------------------------------------------------------------ orchestrator


def harbor_env() -> dict[str, str]:
    """``HARBOR`` and ``DOCKER_CONFIG`` from scripts/terminalbench/harbor_venv.sh (builds it)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "terminalbench" / "harbor_venv.sh")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    env: dict[str, str] = {}
    for word in out.split():
        if "=" in word and word != "export":
            key, value = word.split("=", 1)
            env[key] = value
    return env


def python_of(side: str, harbor: dict[str, str]) -> str:
    if side == "inspect":
        base = os.environ.get("HERMES_PEERS_VENVS")
        venv = Path(base) / "inspect" if base else ROOT / ".venv-peers-inspect"
        return str(venv / "bin" / "python")
    if side == "harbor":
        return str(Path(harbor["HARBOR"]).parent / "python")
    return sys.executable


def leftovers() -> list[str]:
    """Containers of this benchmark still on the engine (any side's naming)."""
    out = subprocess.run(
        ["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, check=True
    ).stdout
    # Ours and Harbor's carry the lifecycle's name; Inspect's compose projects its task's.
    return [name for name in out.split() if LABEL in name or name.startswith("inspect-bench-i")]


def run_side(side: str, c: int, args: argparse.Namespace, harbor: dict[str, str]) -> dict[str, Any]:
    command = [python_of(side, harbor), __file__, "--client", side, "--concurrency", str(c)]
    command += ["--per-worker", str(args.per_worker), "--execs", str(args.execs)]
    command += ["--image", args.image, "--deadline", str(args.deadline)]
    env = dict(os.environ)
    if side in ("inspect", "harbor"):
        env.pop("PYTHONPATH", None)
        env["DOCKER_CONFIG"] = harbor["DOCKER_CONFIG"]  # the `docker compose` plugin
    else:
        env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=args.deadline + 300, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{side} C={c}: exit {done.returncode}: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # local-ns needs no engine: its client fails if a sandbox directory is left (Ours.finish).
    left = leftovers() if side != "local-ns" else []
    if left:
        raise SystemExit(f"{side} C={c}: {len(left)} containers left: {left[:5]}")
    return result


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(args: argparse.Namespace) -> int:
    sides = args.sides.split(",")
    harbor = harbor_env() if "harbor" in sides or "inspect" in sides else {}
    if "inspect" in sides and not args.no_setup:
        subprocess.run(["bash", str(HERE / "peers" / "setup.sh"), "inspect"], check=True)
    print(
        f"image {args.image}, network off; {args.per_worker} lifecycles per worker, "
        f"{args.execs} commands after the first; sides alternate at each C"
    )
    print(
        f"{'C':>4} {'side':<9} | create p50/p99 ms | lifecycle p50/p99 ms | lifecycles/s"
        " | CPU ms/lifecycle | failed"
    )
    table: dict[tuple[str, int], dict[str, Any]] = {}
    for c in args.concurrency:
        for i in range(len(sides)):
            side = sides[(i + args.concurrency.index(c)) % len(sides)]
            r = run_side(side, c, args, harbor)
            done = len(r["total"])
            r["rate"] = done / r["wall_s"] if r["wall_s"] else 0.0
            table[(side, c)] = r
            print(
                f"{c:>4} {side:<9} | {pct(r['create'], 0.5) * 1e3:7.0f} "
                f"{pct(r['create'], 0.99) * 1e3:8.0f} | {pct(r['total'], 0.5) * 1e3:8.0f} "
                f"{pct(r['total'], 0.99) * 1e3:10.0f} | {r['rate']:12.2f} | "
                f"{r['cpu_s'] / max(done, 1) * 1e3:16.1f} | {len(r['failures'])}"
                + (f" ({r['failures'][0]})" if r["failures"] else ""),
                flush=True,
            )
    print("\nratios (lifecycles/s of docker over each peer; create p50 of docker over local-ns):")
    for c in args.concurrency:
        parts = []
        ours = table.get(("docker", c))
        for peer in ("inspect", "harbor"):
            theirs = table.get((peer, c))
            if ours and theirs and theirs["rate"]:
                parts.append(f"docker/{peer} {ours['rate'] / theirs['rate']:.2f}x")
        ns = table.get(("local-ns", c))
        if ours and ns:
            ratio = pct(ours["create"], 0.5) / pct(ns["create"], 0.5)  # the table's p50
            parts.append(f"docker/local-ns create p50 {ratio:.1f}x")
        print(f"  C={c:<4} " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 256]
    )
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--per-worker", type=int, default=2, help="lifecycles per worker")
    parser.add_argument("--execs", type=int, default=3, help="commands after the first")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--deadline", type=float, default=1200.0, help="seconds per side and C")
    parser.add_argument("--no-setup", action="store_true", help="do not run bench/peers/setup.sh")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.client:
        ns.concurrency = ns.concurrency[0]
        client(ns)
    else:
        sys.exit(main(ns))
