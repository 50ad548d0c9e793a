"""The ``hermes-async`` command.

``hermes-async demo`` is the project's main job: TerminalTestEnv's ``evaluate`` and ``process``
run end to end — agent loop, tools in local sandboxes, rewards through ``ToolContext``, scored
groups written as JSONL plus atroposlib's HTML view — against a model server:

* by default, the scripted **oracle** model (it knows each task and emits the right tool calls,
  then a final answer), started on 127.0.0.1 and spoken to over vLLM's token protocol
  (Phase 2: exact tokens, masks and logprobs); nothing leaves the machine;
* with ``--openai.base_url http://host:8000/v1 --openai.server_type vllm`` (or ``sglang``, or
  ``openai`` for a chat endpoint), a real server.

Any ``--env.<field> <value>`` / ``--openai.<field> <value>`` flag overrides TerminalTestEnv's
``config_init`` the way atroposlib's CLI does (CLI > defaults).

``hermes-async worker --env NAME=module:make_task --server URL`` serves rollout groups over
HTTP (``hermes_async.service``; ``docs/scale-out.md``).

``hermes-async status [URL]`` prints the live status line (rollouts in flight by phase, limiter
saturation, servers up) of a running process from its metrics endpoint (an environment's
``metrics_port``; default ``http://127.0.0.1:9464``); ``--watch SECONDS`` repeats it.

``hermes-async serve-gym --tasks MODULE:ATTR --model-url URL`` serves a NeMo Gym agent
(``POST /run``) over a task source and a token server (``docs/trainers/nemo_gym.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from hermes_async._asynclib import EVENT_LOOPS, loop_options
from hermes_async._checks import check_names
from hermes_async._groups import single_errors
from hermes_async._startup import failure_line
from hermes_async.errors import ConfigError, HermesAsyncError

__all__ = ("main",)

_DEMO_DESCRIPTION = (
    "Run TerminalTestEnv evaluate + process offline against the scripted oracle model "
    "(or a real server with --openai.base_url URL --openai.server_type vllm)."
)


def _parse_overrides(rest: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``--env.k v`` / ``--openai.k=v`` pairs -> two dicts of raw strings.

    Raises:
        SystemExit: A flag that is neither (argparse-style message, exit code 2).
    """
    env: dict[str, str] = {}
    openai: dict[str, str] = {}
    items = list(rest)
    i = 0
    while i < len(items):
        flag = items[i]
        if not flag.startswith(("--env.", "--openai.")):
            raise SystemExit(
                f"hermes-async demo: unrecognized argument {flag!r}; use --env.<field> VALUE or "
                "--openai.<field> VALUE (see --help)"
            )
        if "=" in flag:
            key, value = flag[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(items):
                raise SystemExit(f"hermes-async demo: {flag} needs a value")
            key, value = flag[2:], items[i + 1]
            i += 2
        namespace, _, field = key.partition(".")
        (env if namespace == "env" else openai)[field] = value
    return env, openai


def _build_configs(
    env_over: dict[str, str], openai_over: dict[str, str], out: Path
) -> tuple[Any, Any]:
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig

    from hermes_async.envs.terminal_test import TerminalTestEnv, TerminalTestEnvConfig

    config, servers = TerminalTestEnv.config_init()
    values = config.model_dump()
    values.update(
        use_wandb=False,
        include_messages=True,
        ensure_scores_are_not_same=False,
        data_path_to_save_groups=str(out / "terminal_test.jsonl"),
        data_dir_to_save_evals=str(out / "eval"),
    )
    values.update({k: (None if v == "None" else v) for k, v in env_over.items()})
    check_names(
        [*(f"--env.{k}" for k in env_over), *(f"--openai.{k}" for k in openai_over)],
        [
            *(f"--env.{k}" for k in TerminalTestEnvConfig.model_fields),
            *(f"--openai.{k}" for k in APIServerConfig.model_fields),
        ],
        kind="flag",
        otherwise="run with --help for the flags",
    )
    server_values = servers[0].model_dump()
    server_values.update(model_name="scripted-oracle", health_check=False)
    server_values.update({k: (None if v == "None" else v) for k, v in openai_over.items()})
    return TerminalTestEnvConfig(**values), APIServerConfig(**server_values)


async def _oracle_isolation(config: Any) -> None:
    """The oracle runs only commands written here: where namespaces cannot be made, the demo
    opts out of isolation explicitly and says so in one line (a real model never does)."""
    from hermes_async.tools.sandbox.local import ISOLATION_ENV
    from hermes_async.tools.sandbox.namespaces import probe_namespaces

    options = dict(config.sandbox_options or {})
    if config.terminal_backend != "local" or "isolation" in options:
        return
    if os.environ.get(ISOLATION_ENV) or (reason := await probe_namespaces()) is None:
        return
    config.sandbox_options = {**options, "isolation": "process"}
    print(
        f"hermes-async demo: sandboxes are NOT isolated here ({reason}); the oracle's own "
        "commands run with isolation='process' (scripts/sandbox/install.sh isolates them)",
        flush=True,
    )


async def _demo(
    env_over: dict[str, str], openai_over: dict[str, str], out: Path, progress: bool
) -> _DemoRun:
    from hermes_async.envs.base import RolloutSummary
    from hermes_async.envs.display import ProgressBar
    from hermes_async.envs.terminal_test import (
        EVAL_TASKS,
        TerminalTestEnv,
        terminal_test_oracle,
    )
    from hermes_async.telemetry import format_status, run_status

    start = anyio.current_time()
    config, server = _build_configs(env_over, openai_over, out)
    use_oracle = "base_url" not in openai_over
    if use_oracle:
        await _oracle_isolation(config)
    async with contextlib.AsyncExitStack() as stack:
        if use_oracle:
            from hermes_async.testing.http import open_loopback_server
            from hermes_async.testing.scripted_server import ScriptedModelServer

            url = await stack.enter_async_context(
                open_loopback_server(ScriptedModelServer(terminal_test_oracle()))
            )
            server.base_url = url + "/v1"
        where = "scripted oracle model on " + server.base_url if use_oracle else server.base_url
        print(f"hermes-async demo: TerminalTestEnv evaluate + process against {where}")
        print(
            f"  server_type={server.server_type} "
            f"(Phase {'1: placeholder tokens' if server.server_type == 'openai' else '2: exact tokens'}), "
            f"sandboxes={config.terminal_backend}, group_size={config.group_size}, "
            f"groups={config.total_steps}"
        )
        print("  loading the tokenizer (built once, then cached) ...", flush=True)
        env = TerminalTestEnv(config, [server])
        env.process_mode = True
        env.n_groups_to_process = config.total_steps
        env.group_size_to_process = config.group_size
        eval_count = len(EVAL_TASKS[: config.eval_size or None])
        total = eval_count + config.total_steps * config.group_size
        bar = (
            ProgressBar(total, "  rollouts", status=lambda: format_status(run_status()))
            if progress
            else None
        )

        def on_rollout(summary: RolloutSummary) -> None:
            if bar is not None:
                mode = "eval" if summary.evaluating else "train"
                bar.advance(f"{mode}:{summary.label} reward={summary.reward:.2f}")

        env.on_rollout = on_rollout
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Trainer requested to ignore max length")
            with contextlib.redirect_stdout(sys.stderr):  # atroposlib's own prints
                await env._run_evaluate()
                await env.process_manager()
        if bar is not None:
            bar.close()
    elapsed = anyio.current_time() - start
    return _DemoRun(env, config, total, use_oracle, elapsed)


@dataclass(frozen=True, slots=True)
class _DemoRun:
    env: Any
    config: Any
    total: int
    use_oracle: bool
    elapsed: float


def _summarize(run: _DemoRun) -> int:
    """Print the summary table and the files written; the demo's exit code."""
    from hermes_async.envs.display import format_failures, format_table

    env, config, total, use_oracle, elapsed = (
        run.env,
        run.config,
        run.total,
        run.use_oracle,
        run.elapsed,
    )

    rows: list[list[object]] = []
    keys: list[tuple[str, str]] = []
    for summary in env.rollout_summaries:
        key = ("eval" if summary.evaluating else "process", summary.label)
        if key not in keys:
            keys.append(key)
    for key in keys:
        group = [
            s
            for s in env.rollout_summaries
            if ("eval" if s.evaluating else "process", s.label) == key
        ]
        n = len(group)
        rows.append(
            [
                key[0],
                key[1],
                n,
                sum(s.reward for s in group) / n,
                sum(s.turns for s in group) / n,
                round(sum(s.tokens for s in group) / n),
                sum(s.seconds for s in group) / n,
                format_failures(s.category for s in group),
            ]
        )
    print()
    print(
        format_table(
            ["mode", "task", "rollouts", "reward", "turns", "tokens", "time_s", "failures"],
            rows,
        )
    )
    report = getattr(env, "last_eval_report", None)
    if report is not None and report.samples and report.samples[0].get("trajectory"):
        print()
        print(f"the eval trajectory ({report.samples[0]['task']}):")
        for line in str(report.samples[0]["trajectory"]).splitlines():
            print("  " + (line if len(line) <= 110 else line[:107] + "..."))
    rewards = [s.reward for s in env.rollout_summaries]
    jsonl = Path(config.data_path_to_save_groups)
    html = jsonl.with_suffix(".html")
    print()
    print(f"scored groups (JSONL): {jsonl}{'' if jsonl.is_file() else '  [MISSING]'}")
    print(f"HTML view:             {html}{'' if html.is_file() else '  [MISSING]'}")
    print(f"eval results:          {Path(config.data_dir_to_save_evals) / 'metrics.json'}")
    print(
        f"{len(rewards)} rollouts, mean reward {sum(rewards) / max(len(rewards), 1):.2f}, "
        f"{elapsed:.1f} s"
    )
    ok = jsonl.is_file() and html.is_file() and len(rewards) == total
    if use_oracle:
        ok = ok and all(r == 1.0 for r in rewards)
    return 0 if ok else 1


def _run_demo(args: argparse.Namespace, rest: Sequence[str]) -> int:
    env_over, openai_over = _parse_overrides(rest)
    # Before the imports (atroposlib, transformers: seconds): say what is starting.
    print("hermes-async demo: loading TerminalTestEnv (atroposlib) ...", flush=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # "PyTorch was not found" noise
    try:
        import hermes_async.envs.terminal_test  # noqa: F401  (fail early, clearly)
    except ImportError as exc:
        print(f"hermes-async demo: {exc}", file=sys.stderr)
        return 2
    try:
        run_options = loop_options(args.loop)
    except ConfigError as exc:
        print(failure_line("hermes-async demo", exc), file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        _build_configs(env_over, openai_over, out)  # bad flags fail before the output is touched
    except ConfigError as exc:
        print(failure_line("hermes-async demo", exc), file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("terminal_test.jsonl", "terminal_test.html"):
        (out / stale).unlink(missing_ok=True)  # atroposlib would write *_1.jsonl instead
    try:
        with single_errors():  # the oracle's loopback server is a task group
            # atroposlib is asyncio-only: asyncio's own loop, or uvloop's (--loop).
            run: _DemoRun = anyio.run(
                _demo, env_over, openai_over, out, not args.no_progress, **run_options
            )
    except HermesAsyncError as exc:
        if args.verbose:
            raise
        print(failure_line("hermes-async demo", exc), file=sys.stderr)
        return 1
    return _summarize(run)


def _add_serve_gym_parser(sub: Any) -> None:
    gym = sub.add_parser(
        "serve-gym",
        help="a NeMo Gym agent server (POST /run) over a task source and a token server",
        description="Serve hermes_async rollouts as a NeMo Gym agent: POST /run takes a "
        "BaseRunRequest and answers a BaseVerifyResponse whose output items carry each turn's "
        "exact token ids and logprobs (docs/trainers/nemo_gym.md).",
    )
    gym.add_argument(
        "--tasks",
        required=True,
        metavar="MODULE:ATTR",
        help="the task source: body -> RolloutTask, or an environment",
    )
    gym.add_argument(
        "--model-url", required=True, help="the model server (vLLM as NeMo RL exposes it)"
    )
    gym.add_argument(
        "--token-endpoint",
        choices=("vllm", "completions", "sglang"),
        default="vllm",
        help="vllm: /inference/v1/generate; completions: /v1/completions with ids; "
        "sglang: /generate (default: vllm)",
    )
    gym.add_argument("--vocab-size", type=int, help="the tokenizer's size (checks the ids)")
    gym.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1")
    gym.add_argument("--port", type=int, default=8000, help="default: 8000")


def _serve_gym(args: argparse.Namespace) -> int:
    from hermes_async.errors import ConfigError
    from hermes_async.integrations.nemo_gym import create_app

    try:
        import uvicorn
    except ImportError:
        print(
            "hermes-async serve-gym needs uvicorn: pip install 'hermes-async[nemo-gym]'",
            file=sys.stderr,
        )
        return 2
    try:
        app = create_app(
            args.tasks,
            model_url=args.model_url,
            token_endpoint=args.token_endpoint,
            vocab_size=args.vocab_size,
        )
    except (ConfigError, ImportError) as exc:
        print(f"hermes-async serve-gym: {exc}", file=sys.stderr)
        return 2
    # uvicorn owns the event loop of this process (a command, not library code).
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


#: Where ``hermes-async status`` looks by default (``serve_metrics``' conventional port).
DEFAULT_STATUS_URL = "http://127.0.0.1:9464"


async def _status(url: str, watch: float | None) -> int:
    from hermes_async.telemetry import format_status, read_status

    while True:
        try:
            status = await read_status(url)
        except (OSError, ValueError) as exc:
            print(f"hermes-async status: {exc}", file=sys.stderr)
            return 1
        print(format_status(status), flush=True)
        if watch is None:
            return 0
        await anyio.sleep(watch)


_WORKER_EPILOG = """\
ENV: [ALIAS=]module:NAME or [ALIAS=]file.py:NAME: a function item -> RolloutTask, or a
HermesAgentBaseEnv subclass (needs the atropos extra). Requests name it by ALIAS (default NAME).
The API: POST /groups, GET /health, GET /statistics, POST /drain (docs/scale-out.md).
SIGTERM or Ctrl-C drains: new groups get 503, running ones get --drain-timeout seconds.
"""


def _add_worker_parser(sub: Any) -> None:
    worker = sub.add_parser(
        "worker",
        help="serve rollout groups over HTTP (one process, one event loop, its own sandboxes)",
        description="Run a rollout worker: POST /groups runs a group of an environment's item "
        "and answers it by its deadline (the group, or a classified failure).",
        epilog=_WORKER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_argument("--env", action="append", required=True, metavar="ENV", help="repeatable")
    worker.add_argument(
        "--server", action="append", required=True, metavar="URL", help="model server (repeatable)"
    )
    worker.add_argument("--api", default="vllm", choices=("vllm", "sglang", "atropos", "chat"))
    worker.add_argument(
        "--tokenizer", help="token servers: HF name or directory (default: built-in)"
    )
    worker.add_argument("--model", default="default", help="model name of chat requests")
    worker.add_argument(
        "--api-key-env", metavar="VAR", help="the variable holding the servers' API key"
    )
    worker.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    worker.add_argument("--port", type=int, default=8700, help="default 8700 (0: any free port)")
    worker.add_argument("--name", help="worker name (default <host>-<pid>); names its sandbox root")
    worker.add_argument("--max-groups", type=int, default=64, help="groups run at once")
    worker.add_argument("--max-group-size", type=int, default=256)
    worker.add_argument("--drain-timeout", type=float, default=60.0, metavar="SECONDS")
    worker.add_argument(
        "--sandbox-root", metavar="DIR", help="parent of the workers' sandbox roots"
    )
    worker.add_argument("--isolation", default="auto", choices=("auto", "namespaces", "process"))
    worker.add_argument("--trio", action="store_true", help="run on trio (plain environments)")
    _add_loop_argument(worker)
    worker.add_argument("--verbose", action="store_true", help="INFO logs")


async def _serve_worker(config: Any, host: str, port: int) -> int:
    """Run the worker; print its URL once it serves (scripts wait for that line)."""
    from hermes_async.service.serve import run_worker

    cancelled: list[int] = []

    async def run(*, task_status: Any) -> None:
        cancelled.append(await run_worker(config, host=host, port=port, task_status=task_status))

    from hermes_async._groups import single_errors

    with single_errors():
        async with anyio.create_task_group() as tg:
            url = await tg.start(run)
            print(f"hermes-async worker {config.options.name}: serving on {url}", flush=True)
    return cancelled[0]


def _worker(args: argparse.Namespace) -> int:
    import logging
    from functools import partial

    from hermes_async.service.config import WorkerConfig
    from hermes_async.service.worker import DEFAULT_SANDBOX_PARENT, WorkerOptions

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        named = {"name": args.name} if args.name else {}
        options = WorkerOptions(
            max_groups=args.max_groups,
            max_group_size=args.max_group_size,
            drain_timeout=args.drain_timeout,
            sandbox_parent=args.sandbox_root or DEFAULT_SANDBOX_PARENT,
            isolation=args.isolation,
            **named,
        )
        config = WorkerConfig(
            tuple(args.env),
            tuple(args.server),
            api=args.api,
            tokenizer=args.tokenizer,
            model=args.model,
            options=options,
            api_key_env=args.api_key_env,
        )
        if args.trio and args.loop != "asyncio":
            raise ConfigError(f"--trio and --loop {args.loop} exclude each other")
        cancelled = anyio.run(
            partial(_serve_worker, config, args.host, args.port),
            **loop_options("trio" if args.trio else args.loop),
        )
    except (ConfigError, ImportError) as exc:
        print(f"hermes-async worker: error: {exc}", file=sys.stderr)
        return 2
    return 0 if cancelled == 0 else 3


def _add_loop_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loop",
        choices=[loop for loop in EVENT_LOOPS if loop != "trio"],  # trio: the worker's --trio
        default="asyncio",
        help="asyncio's event loop (default) or uvloop's (the uvloop extra)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hermes-async`` command."""
    parser = argparse.ArgumentParser(prog="hermes-async", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="TerminalTestEnv evaluate + process against the scripted oracle (offline)",
        description=_DEMO_DESCRIPTION,
        epilog="Extra flags: --env.<field> VALUE and --openai.<field> VALUE (atroposlib's names).",
    )
    demo.add_argument(
        "--out", default="demo_output", help="output directory (default: ./demo_output)"
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.add_argument(
        "--verbose", action="store_true", help="a failed start-up shows its traceback"
    )
    _add_loop_argument(demo)
    status = sub.add_parser(
        "status",
        help="the live status line of a running process, from its metrics endpoint",
        description="Read a running process's /metrics (serve_metrics; an environment's "
        "metrics_port) and print rollouts in flight by phase, limiter saturation and servers up.",
    )
    status.add_argument(
        "url", nargs="?", default=DEFAULT_STATUS_URL, help=f"default {DEFAULT_STATUS_URL}"
    )
    status.add_argument(
        "--watch", type=float, metavar="SECONDS", help="print it again every SECONDS (Ctrl-C ends)"
    )
    _add_worker_parser(sub)
    _add_serve_gym_parser(sub)
    args, rest = parser.parse_known_args(argv)
    if args.command in ("worker", "serve-gym") and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "worker":
        return _worker(args)
    if args.command == "serve-gym":
        return _serve_gym(args)
    if args.command == "demo":
        return _run_demo(args, rest)
    if args.command == "status":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if args.watch is not None and not args.watch > 0:
            parser.error("--watch takes a positive number of seconds")
        return anyio.run(_status, args.url, args.watch)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse exits


if __name__ == "__main__":
    sys.exit(main())
