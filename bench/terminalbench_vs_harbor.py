"""hermes_async's Terminal-Bench pass against Harbor itself, task by task, on one Docker engine.

    eval "$(scripts/docker/engine.sh env)"
    eval "$(scripts/terminalbench/harbor_venv.sh)"          # HARBOR, DOCKER_CONFIG
    python bench/terminalbench_vs_harbor.py --dataset hermes_async/envs/terminalbench/tasks \\
        --concurrency 4 --out /tmp/tb-vs-harbor

Both run the same agent (``oracle`` by default) over the same task folders at the same
concurrency: Harbor with ``harbor run -p DATASET -a oracle -n C``, this project with
:func:`~hermes_async.envs.terminalbench.run_pass` on its Docker backend. ``--warm`` runs each
once untimed first, so both time runs start with their images built. Prints per task both
rewards and statuses, the disagreements with their reasons, the wall times and their ratio
(Harbor / hermes_async), and whether Harbor's own ``TrialResult`` model reads each of our
trial folders' ``result.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import anyio  # noqa: E402

from hermes_async.envs.terminalbench import (  # noqa: E402
    JobWriter,
    PassOptions,
    TrialResult,
    load_dataset,
    parse_image_map,
    run_pass,
    scripted_trial,
)
from hermes_async.envs.terminalbench.task import HarborTask  # noqa: E402
from hermes_async.tools.sandbox.docker import DockerBackend, DockerSandboxConfig  # noqa: E402
from hermes_async.tools.sandbox.manager import SandboxManager  # noqa: E402

_VALIDATE = """
import json, sys
from harbor.models.job.result import JobResult
from harbor.models.trial.result import TrialResult
ok, bad = 0, []
for path in sys.argv[1:]:
    model = JobResult if path.endswith("/job-result.json") else TrialResult
    try:
        text = open(path.removesuffix("/job-result.json") + "/result.json" if model is JobResult else path).read()
        model.model_validate_json(text); ok += 1
    except Exception as exc:
        bad.append(f"{path}: {str(exc)[:200]}")
print(json.dumps({"ok": ok, "bad": bad}))
"""


def run_harbor(args: argparse.Namespace, name: str) -> tuple[float, dict[str, dict[str, object]]]:
    out = args.out / "harbor"
    command = [
        args.harbor, "run", "-p", str(args.dataset), "-a", args.agent,
        "-n", str(args.concurrency), "-o", str(out), "--job-name", name, "-y", "-q",
    ]  # fmt: skip
    for excluded in args.harbor_excluded:
        command += ["-x", excluded]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=7200)
    wall = time.monotonic() - started
    if done.returncode != 0:
        print(f"harbor exited {done.returncode}: {done.stderr[-1500:]}", file=sys.stderr)
    trials: dict[str, dict[str, object]] = {}
    for result in sorted((out / name).glob("*/result.json")):
        data = json.loads(result.read_text())
        rewards = (data.get("verifier_result") or {}).get("rewards") or {}
        error = data.get("exception_info") or {}
        # Keyed by folder name (Harbor's task_name is [task].name when a task sets one).
        trials[str(data["trial_name"]).split("__")[0]] = {
            "reward": rewards.get("reward"),
            "error": f"{error.get('exception_type')}: {str(error.get('exception_message'))[:160]}"
            if error
            else None,
        }
    return wall, trials


async def run_ours(
    args: argparse.Namespace, tasks: list[HarborTask], name: str
) -> tuple[float, list[TrialResult]]:
    backend = DockerBackend(
        DockerSandboxConfig(default_exec_timeout=900.0, build_network_mode=args.build_network)
    )
    options = PassOptions(
        agent=args.agent,
        concurrency=args.concurrency,
        network_tasks=args.allow_network_tasks,
        image_map=parse_image_map(args.image_map),
        build_network=args.build_network is not None,
    )
    writer = JobWriter(args.out / "ours" / name, config={"agent": args.agent}, resume=False)
    started = time.monotonic()
    async with SandboxManager(backend) as manager:

        async def trial_fn(task: HarborTask, attempt: int, network: bool):  # type: ignore[no-untyped-def]
            return await scripted_trial(task, manager=manager, options=options, network=network)

        try:
            trials = await run_pass(
                tasks, trial_fn, options=options, writer=writer, probe=backend.image_labels
            )
        finally:
            writer.close()
        writer.finish(trials, n_total=len(tasks))
    return time.monotonic() - started, trials


def _without_no_network(dataset: Path, copy: Path) -> Path:
    import re
    import shutil

    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(dataset, copy, symlinks=True)
    for toml in copy.glob("*/task.toml"):
        text = toml.read_text()
        text = re.sub(r'(?m)^\s*network_mode\s*=\s*"no-network"\s*$', "", text)
        text = re.sub(r"(?m)^\s*allow_internet\s*=\s*false\s*$", "", text)
        toml.write_text(text)
    return copy


def validate_with_harbor(args: argparse.Namespace, job: Path) -> dict[str, object]:
    python = str(Path(args.harbor).parent / "python")
    files = [str(p) for p in sorted(job.glob("*/result.json"))] + [f"{job}/job-result.json"]
    done = subprocess.run(
        [python, "-c", _VALIDATE, *files], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return {"ok": 0, "bad": [done.stderr[-500:]]}
    result: dict[str, object] = json.loads(done.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--agent", default="oracle", choices=("oracle", "null"))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("/tmp/tb-vs-harbor"))
    parser.add_argument("--harbor", default=os.environ.get("HARBOR", "harbor"))
    parser.add_argument("--image-map", default=None)
    parser.add_argument("--build-network", default=None)
    parser.add_argument("--allow-network-tasks", choices=("skip", "run"), default="skip")
    parser.add_argument("--warm", action="store_true", help="one untimed run of each first")
    args = parser.parse_args()

    report = load_dataset(args.dataset)
    args.harbor_excluded = []
    tasks = list(report.tasks)
    print(f"{len(report.tasks)} tasks ({len(report.invalid)} invalid here) from {args.dataset}")
    # Harbor 0.25's Docker environment refuses a no-network task with a ValueError that ends
    # the whole job (validate_network_policy_support). Harbor gets a copy of the tasks
    # without that declaration; the engine gives containers no network either way here.
    no_network = sorted(
        t.name for t in report.tasks if any(p.mode == "no-network" for p in t.network.values())
    )
    if no_network:
        args.dataset = _without_no_network(args.dataset, args.out / "harbor-tasks")
        print(f"Harbor runs a copy without the no-network declaration of: {', '.join(no_network)}")
    if args.warm:
        run_harbor(args, "warm")
        anyio.run(run_ours, args, tasks, "warm", backend="asyncio")
    harbor_wall, harbor = run_harbor(args, "timed")
    ours_wall, trials = anyio.run(run_ours, args, tasks, "timed", backend="asyncio")
    ours = {t.task: t for t in trials}

    names = sorted({*harbor, *ours, *(n for n, _ in report.invalid)})
    agree, disagreements = 0, []
    print(f"\n{'task':34} {'harbor':>8} {'ours':>8}  our status")
    for name in names:
        theirs = harbor.get(name, {})
        mine = ours.get(name)
        h_reward = theirs.get("reward")
        o_reward = mine.reward if mine is not None else None
        status = mine.status if mine is not None else "invalid here"
        shown = lambda r: "-" if r is None else f"{float(r):g}"  # noqa: E731
        print(f"{name:34} {shown(h_reward):>8} {shown(o_reward):>8}  {status}")
        if (h_reward is None and o_reward is None) or (
            h_reward is not None and o_reward is not None and float(h_reward) == o_reward
        ):
            agree += 1
        else:
            why = (mine.error if mine is not None else dict(report.invalid).get(name)) or ""
            disagreements.append(
                f"{name}: harbor {shown(h_reward)} ({theirs.get('error') or 'ok'}); ours "
                f"{shown(o_reward)} ({status}: {why[:160]})"
            )
    print(f"\nagreement: {agree}/{len(names)} tasks")
    for line in disagreements:
        print("  " + line)
    print(
        f"wall at concurrency {args.concurrency}: harbor {harbor_wall:.1f} s, hermes_async "
        f"{ours_wall:.1f} s, ratio harbor/ours {harbor_wall / ours_wall:.2f}x"
    )
    checked = validate_with_harbor(args, args.out / "ours" / "timed")
    print(f"Harbor's models (TrialResult per trial, JobResult for the job) read {checked['ok']} "
          f"of our result.json files; failures: {checked['bad'] or 'none'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
