"""The cost of honouring a ``collect_trajectory`` override on the default (no-override) path.

Issue #14 made ``HermesAgentBaseEnv.collect_trajectories`` check whether the subclass overrides
``collect_trajectory`` (the reference's single-rollout extension point) and, if so, run the
override ``group_size`` times. The default path must stay as fast as before. Measured here:

* **check**: the override check itself (``overrides(env, HermesAgentBaseEnv,
  "collect_trajectory")``), per call, with ``timeit``;
* **ours**: ``collect_trajectories`` of :class:`~hermes_async.envs.terminal_test.TerminalTestEnv`
  as shipped (the check runs, finds no override, takes the ``run_group`` path);
* **baseline**: the same call with the check replaced by a constant ``False`` (the code before
  the change: straight to ``run_group``);
* **override**: a subclass whose override only calls ``super().collect_trajectory(item)`` (for
  scale: the reference's path, one rollout at a time, group built from the items).

Every group runs against the in-process scripted model (Phase 2, exact tokens) on local
sandboxes; each solves the task (3 turns, 2 tool calls, a reward ``ctx.terminal``). Reported:
median seconds per group per side and the ratios ours/baseline, check/group.

    .venv/bin/python bench/collect_override.py                 # 20 groups of 4 per side
    .venv/bin/python bench/collect_override.py --groups 50 --group-size 8
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import timeit
from typing import Any

import anyio

from hermes_async.envs import _override, base as env_base
from hermes_async.envs.terminal_test import TRAIN_TASKS, TerminalTestEnv, terminal_test_oracle
from hermes_async.testing.pytest_plugin import open_scripted_endpoint
from hermes_async.tools.sandbox.local import local_factory


class OverridingEnv(TerminalTestEnv):
    """The reference's extension point, doing nothing but the default rollout."""

    async def collect_trajectory(self, item: Any) -> tuple[dict[str, Any] | None, list[Any]]:
        return await super().collect_trajectory(item)


async def time_groups(
    env_class: type[TerminalTestEnv], *, groups: int, group_size: int, check: bool, root: str
) -> list[float]:
    config, _ = env_class.config_init()
    values = config.model_dump()
    values.update(
        use_wandb=False,
        data_path_to_save_groups=None,
        data_dir_to_save_evals=None,
        group_size=group_size,
    )
    original = env_base.overrides
    if not check:
        env_base.overrides = lambda *_: False  # type: ignore[assignment]
    try:
        async with open_scripted_endpoint(terminal_test_oracle(), loopback=False) as endpoint:
            env = env_class(type(config)(**values), [endpoint.server_config("vllm")])
            env.model_transport = endpoint.transport
            env.make_sandbox_factory = lambda: local_factory(root)  # type: ignore[method-assign]
            await env.setup()
            seconds: list[float] = []
            for index in range(groups + 2):  # two warm-up groups
                start = time.perf_counter()
                group, _ = await env.collect_trajectories(TRAIN_TASKS[index % len(TRAIN_TASKS)])
                if index >= 2:
                    seconds.append(time.perf_counter() - start)
                assert group is not None and len(group["scores"]) == group_size, group
                assert all(s == 1.0 for s in group["scores"]), group["scores"]
            return seconds
    finally:
        env_base.overrides = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()

    env = TerminalTestEnv.__new__(TerminalTestEnv)
    loops = 200_000
    check_ns = (
        timeit.timeit(
            lambda: _override.overrides(env, env_base.HermesAgentBaseEnv, "collect_trajectory"),
            number=loops,
        )
        / loops
        * 1e9
    )

    async def run() -> dict[str, float]:
        out: dict[str, float] = {}
        with tempfile.TemporaryDirectory(prefix="bench-override-") as root:
            # Interleaved rounds so drift on a shared machine hits every side alike.
            samples: dict[str, list[float]] = {"baseline": [], "ours": [], "override": []}
            for _ in range(2):
                for name, cls, check in (
                    ("baseline", TerminalTestEnv, False),
                    ("ours", TerminalTestEnv, True),
                    ("override", OverridingEnv, True),
                ):
                    samples[name] += await time_groups(
                        cls,
                        groups=max(1, args.groups // 2),
                        group_size=args.group_size,
                        check=check,
                        root=root,
                    )
            for name, values in samples.items():
                out[name] = statistics.median(values)
        return out

    medians = anyio.run(run)
    print(f"groups of {args.group_size}, {args.groups} per side (median seconds per group)")
    for name in ("baseline", "ours", "override"):
        print(f"  {name:9s} {medians[name] * 1e3:8.1f} ms")
    print(f"  check     {check_ns:8.0f} ns per call")
    print(f"ours / baseline     {medians['ours'] / medians['baseline']:.3f}")
    print(f"override / baseline {medians['override'] / medians['baseline']:.3f}")
    print(f"check / group       {check_ns * 1e-9 / medians['ours']:.2e}")


if __name__ == "__main__":
    main()
