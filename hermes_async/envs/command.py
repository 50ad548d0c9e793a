"""``hermes-async eval`` and ``hermes-async process``: any environment, one command.

``ENV``, ``--model`` and ``--oracle`` are resolved by :mod:`hermes_async.envs.specs`. Each run
writes a run folder (:mod:`hermes_async.envs.runs`); ``--resume`` keeps every finished row and
runs the rest. Precedence: ``--env.<field>`` / ``--openai.<field>``, then the flags, then the
environment's ``config_init``. wandb stays off unless ``--wandb``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hermes_async._groups import single_errors
from hermes_async._redact import redact_url
from hermes_async._startup import failure_line
from hermes_async.envs.specs import did_you_mean, parse_model, resolve_env, resolve_oracle
from hermes_async.errors import ConfigError

__all__ = ("RunPlan", "RunRequest", "oracle_isolation", "plan_run", "run_request")


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One ``hermes-async eval`` / ``process`` invocation; each field is the flag of its name.

    Attributes:
        mode: ``"eval"`` (the environment's ``evaluate``) or ``"process"`` (scored groups).
        limit: Eval items (``eval_size``) or groups (``total_steps``).
        out: The run folder (default ``runs/<env>-<timestamp>``).
        resume: Continue the run in ``out`` (default: this env's latest).
        command: The command line, for ``run.json``.
    """

    mode: Literal["eval", "process"]
    env: str
    model: str | None = None
    oracle: str | None = None
    tokenizer: str | None = None
    limit: int | None = None
    group_size: int | None = None
    out: str | None = None
    resume: bool = False
    wandb: bool = False
    progress: bool = True
    env_overrides: Mapping[str, str] = field(default_factory=dict)
    openai_overrides: Mapping[str, str] = field(default_factory=dict)
    command: str = ""


@dataclass(slots=True)
class RunPlan:
    """What :func:`plan_run` decided."""

    request: RunRequest
    env_class: type[Any]
    config: Any
    server: Any
    policy: Callable[[Any], str] | None
    run_dir: Path
    model_label: str


def _apply(values: dict[str, Any], overrides: Mapping[str, str], fields: Any, flag: str) -> None:
    unknown = [k for k in overrides if k not in fields]
    if unknown:
        name = unknown[0]
        raise ConfigError(
            f"unknown flag --{flag}.{name}{did_you_mean(name, list(fields))}; see the "
            "environment's config class for its fields"
        )
    values.update({k: (None if v == "None" else v) for k, v in overrides.items()})


def _run_dir(request: RunRequest, env_name: str) -> Path:
    from hermes_async.envs.runs import SAMPLES_FILE, RunInfo, default_run_dir, latest_run_dir

    if request.out is not None:
        run_dir = Path(request.out)
    elif request.resume:
        latest = latest_run_dir(env_name)
        if latest is None:
            raise ConfigError(
                f"--resume: no earlier run of {env_name!r} under runs/ to continue; give its "
                "folder with --out DIR"
            )
        run_dir = latest
    else:
        return default_run_dir(env_name)
    has_rows = (run_dir / SAMPLES_FILE).is_file()
    if has_rows and not request.resume:
        raise ConfigError(
            f"{run_dir} holds the results of an earlier run; pass --resume to continue it, or "
            "choose another --out"
        )
    earlier = RunInfo.read(run_dir)
    if request.resume and earlier is not None and earlier.env_name != env_name:
        raise ConfigError(
            f"--resume: {run_dir} is a run of {earlier.env_name!r}, not of {env_name!r}"
        )
    if request.resume and earlier is not None and earlier.mode != request.mode:
        raise ConfigError(f"--resume: {run_dir} is a {earlier.mode} run, not a {request.mode} run")
    return run_dir


def plan_run(request: RunRequest) -> RunPlan:
    """Everything decided before anything starts: bad flags fail here, the output untouched.

    Raises:
        ConfigError: A bad flag or value; an ``--out`` with an earlier run and no ``--resume``.
    """
    from hermes_async.envs._atropos import APIServerConfig
    from hermes_async.envs.runs import GROUPS_FILE, SAMPLES_FILE
    from hermes_async.inference.tokenizer import QWEN_OFFLINE_NAME

    if request.model is not None and request.oracle is not None:
        raise ConfigError("give --model or --oracle, not both")
    for name, value in (("--limit", request.limit), ("--group-size", request.group_size)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    model = parse_model(request.model) if request.model is not None else None
    policy = resolve_oracle(request.oracle) if request.oracle is not None else None
    env_class = resolve_env(request.env)
    env_name = str(env_class.name or env_class.__name__)
    config, servers = env_class.config_init()
    values = config.model_dump()
    values.update(
        use_wandb=request.wandb,
        include_messages=True,
        ensure_scores_are_not_same=False,
        resume=request.resume,
    )
    run_dir = _run_dir(request, env_name)
    if request.mode == "eval":
        values.update(data_dir_to_save_evals=str(run_dir))
        if request.limit is not None:
            values["eval_size"] = request.limit
        if request.group_size is not None:
            values["eval_group_size"] = request.group_size
    else:
        values.update(
            data_path_to_save_groups=str(run_dir / GROUPS_FILE),
            data_path_to_save_samples=str(run_dir / SAMPLES_FILE),
        )
        if request.limit is not None:
            values["total_steps"] = request.limit
        if request.group_size is not None:
            values["group_size"] = request.group_size
    if policy is not None:
        # The oracle's replies are hermes <tool_call> blocks in the built-in tokenizer's ids.
        values.update(tokenizer_name=QWEN_OFFLINE_NAME, tool_call_parser="hermes")
    elif model is not None and model.token_server:
        values["tokenizer_name"] = model.name
    if request.tokenizer is not None:
        values["tokenizer_name"] = request.tokenizer
    _apply(values, request.env_overrides, type(config).model_fields, "env")
    if model is not None:
        server = model.server_config()
        label = str(model)
    elif policy is not None:
        server = APIServerConfig(
            base_url="http://127.0.0.1:1/v1",  # replaced by the oracle's address at start
            model_name="oracle",
            server_type="vllm",
            api_key="x",
            health_check=False,
        )
        label = f"oracle {request.oracle} (scripted, on 127.0.0.1)"
    else:
        first = servers[0] if isinstance(servers, list) and servers else servers
        if not isinstance(first, APIServerConfig):
            raise ConfigError(
                f"{env_class.__name__}.config_init() gives no APIServerConfig; pass --model "
                "PROVIDER/NAME@URL or --oracle FILE.py:FUNCTION"
            )
        server = first
        label = f"{server.server_type}/{server.model_name}@{redact_url(str(server.base_url))}"
        label += " (config_init)"
    server_values = server.model_dump()
    _apply(server_values, request.openai_overrides, APIServerConfig.model_fields, "openai")
    try:
        built = type(config)(**values)
        server = APIServerConfig(**server_values)
    except ValueError as exc:  # pydantic's ValidationError: a bad value of a named field
        raise ConfigError(_validation_message(exc)) from None
    return RunPlan(request, env_class, built, server, policy, run_dir, label)


def _validation_message(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    parts = []
    for error in errors():
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg')} (got {error.get('input')!r})")
    return "bad config value: " + "; ".join(parts)


async def oracle_isolation(config: Any, prog: str) -> None:
    """Where namespaces cannot be made, an oracle's run opts out of isolation and says so.

    A scripted oracle runs only commands its author wrote; a model's run never opts out.

    **Cancellation**: the namespace probe is abandoned; ``config`` is unchanged.
    """
    from hermes_async.tools.sandbox.local import ISOLATION_ENV
    from hermes_async.tools.sandbox.namespaces import probe_namespaces

    options = dict(config.sandbox_options or {})
    if config.terminal_backend != "local" or "isolation" in options:
        return
    if os.environ.get(ISOLATION_ENV) or (reason := await probe_namespaces()) is None:
        return
    config.sandbox_options = {**options, "isolation": "process"}
    print(
        f"{prog}: sandboxes are NOT isolated here ({reason}); the oracle's own "
        "commands run with isolation='process' (scripts/sandbox/install.sh isolates them)",
        flush=True,
    )


async def _execute(plan: RunPlan) -> float:
    from hermes_async.envs.display import ProgressBar
    from hermes_async.envs.results import RolloutSummary
    from hermes_async.inference.tokenizer import QWEN_OFFLINE_NAME, load_tokenizer
    from hermes_async.telemetry import format_status, run_status

    start = time.monotonic()
    request, config, server = plan.request, plan.config, plan.server
    async with contextlib.AsyncExitStack() as stack:
        if plan.policy is not None:
            from hermes_async.testing.endpoint import open_scripted_endpoint

            await oracle_isolation(config, f"hermes-async {request.mode}")

            name = config.tokenizer_name
            tokenizer = None if name == QWEN_OFFLINE_NAME else load_tokenizer(name)
            endpoint = await stack.enter_async_context(
                open_scripted_endpoint(plan.policy, tokenizer=tokenizer)
            )
            server.base_url = endpoint.openai_url
        env = plan.env_class(config, [server])
        total = None
        if request.mode == "process":
            env.process_mode = True
            env.n_groups_to_process = config.total_steps
            env.group_size_to_process = config.group_size
            total = config.total_steps * config.group_size
        bar = (
            ProgressBar(total, "  rollouts", status=lambda: format_status(run_status()))
            if request.progress
            else None
        )

        def on_rollout(summary: RolloutSummary) -> None:
            if bar is not None:
                bar.advance(f"{summary.label} reward={summary.reward:.2f}")

        env.on_rollout = on_rollout
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
                warnings.filterwarnings("ignore", message="Trainer requested to ignore max length")
                if request.mode == "eval":
                    await env._run_evaluate()
                else:
                    await env.process_manager()
        finally:
            if bar is not None:
                bar.close()
    return time.monotonic() - start


def run_request(request: RunRequest, *, out: Any = None, verbose: bool = False) -> int:
    """Run one ``eval`` / ``process`` invocation; print the table and the files; the exit code.

    0: no rollout errored; 1: errored rollouts, none recorded, or a failed start-up check
    (``verbose`` raises it instead); 2: a bad flag or config.

    **Cancellation**: Ctrl-C cancels the run; every sandbox is released, rows stay written.
    """
    import anyio

    from hermes_async.envs._resume import errored as errored_row
    from hermes_async.envs.results import format_summary
    from hermes_async.envs.runs import SAMPLES_FILE, RunInfo, read_samples, write_metrics
    from hermes_async.envs.viewer import write_viewer
    from hermes_async.errors import HermesAsyncError

    stream = out if out is not None else sys.stdout
    prog = f"hermes-async {request.mode}"
    plan = plan_run(request)
    config = plan.config
    print(f"{prog}: {plan.env_class.__name__} against {plan.model_label}", file=stream)
    where = "resuming " if request.resume else ""
    print(f"  {where}run folder: {plan.run_dir}", file=stream, flush=True)
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    info = RunInfo(
        command=request.command,
        env=request.env,
        env_name=str(plan.env_class.name or plan.env_class.__name__),
        mode=request.mode,
        model=plan.model_label,
        started=time.time(),
    )
    info.write(plan.run_dir)
    failed: BaseException | None = None
    seconds = 0.0
    try:
        with single_errors():  # the oracle's loopback server is a task group
            seconds = anyio.run(_execute, plan, backend="asyncio")
    except HermesAsyncError as exc:
        if verbose:
            raise
        failed = exc
    samples = read_samples(plan.run_dir / SAMPLES_FILE)
    info = dataclasses.replace(info, seconds=seconds or time.time() - info.started)
    info.write(plan.run_dir)
    summaries = samples.summaries()
    if failed is not None:
        print(failure_line(prog, failed), file=sys.stderr)
    if not samples.rows:
        if failed is None:
            print(
                f"{prog}: {plan.env_class.__name__} recorded no rollout (does its evaluate() call "
                "run_agent_eval?)",
                file=sys.stderr,
            )
        return 1
    metrics = write_metrics(plan.run_dir, samples.rows, info, info.seconds or 0.0)
    viewer = write_viewer(plan.run_dir, samples=samples)
    print(file=stream)
    print(format_summary(summaries, info.seconds or 0.0), file=stream)
    print(file=stream)
    print(f"rows:    {plan.run_dir / SAMPLES_FILE}", file=stream)
    if request.mode == "process":
        print(f"groups:  {config.data_path_to_save_groups}", file=stream)
    print(f"metrics: {metrics}", file=stream)
    print(f"viewer:  {viewer}  (hermes-async view {plan.run_dir})", file=stream)
    errored = [row for row in samples.rows if errored_row(row)]
    return 1 if failed is not None or errored else 0
