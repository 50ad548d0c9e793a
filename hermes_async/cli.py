"""The ``hermes-async`` command.

``eval`` and ``process`` run an environment against ``--model`` or an ``--oracle`` into a run
folder (:mod:`hermes_async.envs.command`); ``view`` shows one; ``demo`` runs TerminalTestEnv end
to end offline; ``worker`` serves rollout groups (docs/scale-out.md); ``status`` prints a
running process's status line; ``serve-gym`` serves a NeMo Gym agent
(docs/trainers/nemo_gym.md).
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
from hermes_async._net import base_url_problem
from hermes_async._startup import failure_line, validation_summary
from hermes_async.errors import ConfigError, HermesAsyncError

__all__ = ("main",)

_DEMO_DESCRIPTION = (
    "Run TerminalTestEnv evaluate + process offline against the scripted oracle model "
    "(or a real server with --openai.base_url URL --openai.server_type vllm)."
)


def _parse_overrides(
    rest: Sequence[str], prog: str = "hermes-async demo"
) -> tuple[dict[str, str], dict[str, str]]:
    """``--env.k v`` / ``--openai.k=v`` pairs -> two dicts; anything else exits with 2."""
    env: dict[str, str] = {}
    openai: dict[str, str] = {}
    items = list(rest)
    i = 0
    while i < len(items):
        flag = items[i]
        if not flag.startswith(("--env.", "--openai.")):
            raise SystemExit(
                f"{prog}: unrecognized argument {flag!r}; use --env.<field> VALUE or "
                "--openai.<field> VALUE (see --help)"
            )
        if "=" in flag:
            key, value = flag[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(items):
                raise SystemExit(f"{prog}: {flag} needs a value")
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
        data_path_to_save_samples=str(out / "samples.jsonl"),
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
    return _built(TerminalTestEnvConfig, values, "env"), _built(
        APIServerConfig, server_values, "openai"
    )


def _built(config_type: Any, values: dict[str, Any], flag: str) -> Any:
    """``config_type(**values)``; a bad value is a ``ConfigError`` naming its flag."""
    from pydantic import ValidationError

    try:
        return config_type(**values)
    except ValidationError as exc:
        raise ConfigError(validation_summary(exc, f"--{flag}.")) from None


async def _demo(
    env_over: dict[str, str], openai_over: dict[str, str], out: Path, progress: bool
) -> _DemoRun:
    from hermes_async.envs.base import RolloutSummary
    from hermes_async.envs.command import oracle_isolation
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
        await oracle_isolation(config, "hermes-async demo")
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
    from hermes_async.envs.results import format_summary
    from hermes_async.envs.runs import SAMPLES_FILE, Samples, read_samples
    from hermes_async.envs.viewer import write_viewer

    env, config, total, use_oracle, elapsed = (
        run.env,
        run.config,
        run.total,
        run.use_oracle,
        run.elapsed,
    )
    print()
    print(format_summary(env.rollout_summaries, elapsed))
    report = getattr(env, "last_eval_report", None)
    if report is not None and report.samples and report.samples[0].get("trajectory"):
        print()
        print(f"the eval trajectory ({report.samples[0]['task']}):")
        for line in str(report.samples[0]["trajectory"]).splitlines():
            print("  " + (line if len(line) <= 110 else line[:107] + "..."))
    out = Path(config.data_path_to_save_samples).parent
    evals = Path(config.data_dir_to_save_evals)
    rows = read_samples(evals / SAMPLES_FILE).rows + read_samples(out / SAMPLES_FILE).rows
    viewer = write_viewer(out, samples=Samples(rows))
    jsonl = Path(config.data_path_to_save_groups)
    rewards = [s.reward for s in env.rollout_summaries]
    print()
    print(f"scored groups (JSONL): {jsonl}{'' if jsonl.is_file() else '  [MISSING]'}")
    print(f"rollouts (JSONL):      {evals / SAMPLES_FILE}, {out / SAMPLES_FILE}")
    print(f"eval results:          {evals / 'metrics.json'}")
    print(f"viewer (HTML):         {viewer}")
    ok = jsonl.is_file() and len(rows) == total and len(rewards) == total
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
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"hermes-async demo: --out {out}: cannot make the folder: {exc}", file=sys.stderr)
        return 2
    for stale in ("terminal_test.jsonl", "terminal_test.html"):
        (out / stale).unlink(missing_ok=True)  # atroposlib would write *_1.jsonl instead
    try:
        with single_errors():  # the oracle's loopback server is a task group
            # atroposlib is asyncio-only: asyncio's own loop, or uvloop's (--loop).
            run: _DemoRun = anyio.run(
                _demo, env_over, openai_over, out, not args.no_progress, **run_options
            )
    except (HermesAsyncError, OSError) as exc:  # OSError: e.g. a tokenizer that cannot load
        if args.verbose:
            raise
        print(failure_line("hermes-async demo", exc), file=sys.stderr)
        return 1
    return _summarize(run)


_RUN_EPILOG = """\
ENV: a file (my_env.py, my_env.py:MyEnv), a module (pkg.my_env:MyEnv) or a registered name
(terminal_test, coding, terminalbench2, or one a package registers).
MODEL: PROVIDER/NAME[@URL], PROVIDER vllm or sglang (exact tokens; the tokenizer is NAME unless
--tokenizer) or openai (chat); the API key comes from VLLM_API_KEY / SGLANG_API_KEY /
OPENAI_API_KEY. Any --env.<field> VALUE / --openai.<field> VALUE sets a config field.
"""


def _add_run_parser(sub: Any, mode: str) -> None:
    what = (
        "run an environment's evaluate() on its eval items"
        if mode == "eval"
        else "run an environment's process mode: scored groups (tokens, masks, logprobs)"
    )
    run = sub.add_parser(
        mode,
        help=what,
        description=f"{what[0].upper()}{what[1:]}; write a run folder and print a summary.",
        epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("env", metavar="ENV", help="file.py[:Class], module:Class or a short name")
    who = run.add_mutually_exclusive_group()
    who.add_argument("--model", metavar="MODEL", help="e.g. vllm/Qwen/Qwen3-8B@http://host:8000")
    who.add_argument(
        "--oracle",
        metavar="FILE.py:FUNCTION",
        help="a scripted policy (PolicyRequest -> str) served on 127.0.0.1: runs offline",
    )
    run.add_argument("--tokenizer", help="the tokenizer (HF name or directory), if not MODEL's")
    unit = "eval items" if mode == "eval" else "groups"
    run.add_argument("--limit", type=int, metavar="N", help=f"at most N {unit}")
    run.add_argument(
        "--group-size",
        type=int,
        metavar="G",
        help="rollouts per eval item" if mode == "eval" else "rollouts per group",
    )
    run.add_argument("--out", metavar="DIR", help="run folder (default runs/<env>-<timestamp>)")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out (default: this env's latest): finished rows are kept",
    )
    run.add_argument("--wandb", action="store_true", help="log to wandb (off by default)")
    run.add_argument("--no-progress", action="store_true", help="no progress line")
    run.add_argument("--verbose", action="store_true", help="tracebacks and INFO logs")


def _run_env(args: argparse.Namespace, rest: Sequence[str], argv: Sequence[str]) -> int:
    prog = f"hermes-async {args.command}"
    env_over, openai_over = _parse_overrides(rest, prog)
    print(f"{prog}: loading {args.env} ...", flush=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if not args.wandb:
        os.environ.setdefault("WANDB_MODE", "disabled")
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO)
    from hermes_async.envs.command import RunRequest, run_request
    from hermes_async.errors import ConfigError

    request = RunRequest(
        mode=args.command,
        env=args.env,
        model=args.model,
        oracle=args.oracle,
        tokenizer=args.tokenizer,
        limit=args.limit,
        group_size=args.group_size,
        out=args.out,
        resume=args.resume,
        wandb=args.wandb,
        progress=not args.no_progress,
        env_overrides=env_over,
        openai_overrides=openai_over,
        command=" ".join(["hermes-async", *_hide_secret_flags(argv)]),
    )
    try:
        return run_request(request, verbose=args.verbose)
    except (ConfigError, ImportError) as exc:
        if args.verbose:
            raise
        print(failure_line(prog, exc), file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. an --out that cannot be a folder, a tokenizer that cannot load
        if args.verbose:
            raise
        print(failure_line(prog, exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the run was cancelled: sandboxes released, rows kept
        print(f"{prog}: interrupted; finished rows are kept (--resume continues)", file=sys.stderr)
        return 130


def _hide_secret_flags(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of secret-named flags (``--openai.api_key``) replaced."""
    from hermes_async._redact import REDACTED, secret_name

    shown = list(argv)
    for i, arg in enumerate(shown):
        name, eq, _ = arg.partition("=")
        if not (arg.startswith("--") and secret_name(name.rpartition(".")[2].lstrip("-"))):
            continue
        if eq:
            shown[i] = f"{name}={REDACTED}"
        elif i + 1 < len(shown):
            shown[i + 1] = REDACTED
    return shown


def _port(text: str) -> int:
    """An argparse ``type``: a TCP port, 0-65535 (0: any free one)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, got {text!r}")
    return port


def _add_view_parser(sub: Any) -> None:
    view = sub.add_parser(
        "view",
        help="write (or serve on 127.0.0.1) the HTML viewer of a run folder",
        description="Write RUN_DIR/index.html from RUN_DIR/samples.jsonl and print its path; "
        "with --serve, serve it on 127.0.0.1 (re-read at each load) until Ctrl-C.",
    )
    view.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (or its samples.jsonl)")
    view.add_argument("--serve", action="store_true", help="serve it on 127.0.0.1")
    view.add_argument("--port", type=_port, default=0, help="with --serve (default: any free port)")


def _view(args: argparse.Namespace) -> int:
    from hermes_async.envs.runs import SAMPLES_FILE
    from hermes_async.envs.viewer import write_viewer

    run_dir = Path(args.run_dir)
    if run_dir.is_file():
        run_dir = run_dir.parent
    if not (run_dir / SAMPLES_FILE).is_file():
        print(f"hermes-async view: {run_dir} has no {SAMPLES_FILE}", file=sys.stderr)
        return 2
    path = write_viewer(run_dir)
    print(f"viewer: {path.resolve()}")
    print(f"        {path.resolve().as_uri()}", flush=True)
    if not args.serve:
        return 0
    try:
        return anyio.run(_serve_viewer, run_dir, args.port)
    except KeyboardInterrupt:
        return 0


async def _serve_viewer(run_dir: Path, port: int) -> int:
    from hermes_async._http_serve import serve_get
    from hermes_async.envs.viewer import write_viewer

    def answer(path: str) -> tuple[str, str, bytes]:
        if path not in ("/", "/index.html"):
            return "404 Not Found", "text/plain", b"try GET /\n"
        page = write_viewer(run_dir).read_bytes()  # re-read: a running run's new rows show
        return "200 OK", "text/html; charset=utf-8", page

    async with anyio.create_task_group() as tg:
        try:
            bound = await tg.start(serve_get, answer, port)
        except OSError as exc:  # the port is taken
            print(f"hermes-async view: cannot serve on port {port}: {exc}", file=sys.stderr)
            return 2
        print(f"serving http://127.0.0.1:{bound}/ (Ctrl-C stops)", flush=True)
    return 0


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
    gym.add_argument("--port", type=_port, default=8000, help="default: 8000")


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
    worker.add_argument("--port", type=_port, default=8700, help="default 8700 (0: any free port)")
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
            try:
                url = await tg.start(run)
            except OSError as exc:  # the port is taken, or the host is not this machine's
                raise ConfigError(f"cannot serve on {host}:{port}: {exc}") from exc
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
    for mode in ("eval", "process"):
        _add_run_parser(sub, mode)
    _add_view_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
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
    if args.command in ("eval", "process"):
        return _run_env(args, rest, argv)
    if args.command == "view":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return _view(args)
    if args.command == "status":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if args.watch is not None and not args.watch > 0:
            parser.error("--watch takes a positive number of seconds")
        if base_url_problem(args.url) is not None:
            parser.error(f"status takes an http(s)://host[:port] URL, got {args.url!r}")
        return anyio.run(_status, args.url, args.watch)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse exits


if __name__ == "__main__":
    sys.exit(main())
