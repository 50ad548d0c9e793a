"""The ``hermes-async`` command.

``hermes-async demo`` is the project's main job: a real, offline run of what the library has.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import anyio

from hermes_async.limits import Limits, open_lag_monitor
from hermes_async.tools.registry import ToolRuntime, builtin_registry, dispatch

__all__ = ["main"]

# A fixed plan of tool calls, as a model would emit them (raw JSON argument strings, including
# a malformed one and a call to a tool the model was not offered).
_PLAN: list[tuple[str, str]] = [
    ("todo", '{"todos": [{"id": "1", "content": "inspect the repo", "status": "in_progress"}]}'),
    (
        "todo",
        '{"todos": "[{\\"id\\": \\"2\\", \\"content\\": \\"write tests\\", \\"status\\": \\"pending\\"}]", "merge": "true"}',
    ),
    ("todo", '{"todos": [{"id": "1", "content": "", "status": "completed"}], "merge": true}'),
    ("todo", '{"todos": [{"id": 1'),
    ("browser_navigate", '{"url": "https://example.com"}'),
    ("todo", "{}"),
]


async def _demo(rollouts: int) -> int:
    limits = Limits(tool_calls=16)
    registry = builtin_registry()
    outcomes: list[list[tuple[str, str | None, str]]] = [[] for _ in range(rollouts)]

    async def rollout(i: int) -> None:
        runtime = ToolRuntime(task_id=f"demo-{i}", limits=limits)
        for name, args in _PLAN:
            out = await dispatch(name, args, runtime, registry=registry)
            outcomes[i].append((name, out.error, out.content))

    async with open_lag_monitor() as monitor:
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for i in range(rollouts):
                tg.start_soon(rollout, i)
        elapsed = anyio.current_time() - start
    print(f"hermes-async demo: {rollouts} concurrent rollouts x {len(_PLAN)} tool calls")
    print(f"registered tools: {', '.join(registry.names())}")
    print()
    for name, error, content in outcomes[0]:
        status = "ERROR" if error else "ok"
        print(f"  {name:<18} {status:<5} {content[:110]}")
    final = json.loads(outcomes[0][-1][2])
    errors = sum(1 for o in outcomes for _, e, _ in o if e)
    print()
    print(f"final todo summary (rollout 0): {final['summary']}")
    print(f"tool errors (model-visible, expected 2 per rollout): {errors}")
    print(f"elapsed {elapsed * 1e3:.1f} ms; {monitor.statistics()}")
    print(f"limiter: {limits.tool_calls.statistics()}")
    return 0 if errors == 2 * rollouts else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hermes-async`` command."""
    parser = argparse.ArgumentParser(prog="hermes-async", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the offline demo")
    demo.add_argument("--rollouts", type=int, default=32, help="concurrent rollouts (default 32)")
    args = parser.parse_args(argv)
    assert args.command == "demo"
    return anyio.run(_demo, args.rollouts)


if __name__ == "__main__":
    sys.exit(main())
