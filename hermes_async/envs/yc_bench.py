"""YCBenchEvalEnv: Collinear's YC-Bench, a year-long startup simulation run through its CLI.

Each item is a (preset, seed) run in its own sandbox and SQLite world; the agent plays CEO with
``yc-bench`` commands, then the run is played to its end and scored (:func:`composite_score`).
The simulator needs its own venv (``scripts/yc_bench/setup_venv.sh``). Differences from the
reference: docs/environments.md.

    python -m hermes_async.envs.yc_bench evaluate --env.presets '["fast_test"]' \\
        --env.seeds '[1]' --env.yc_bench_command .venv-yc-bench/bin/yc-bench
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shlex
import shutil
import sqlite3
import tomllib
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic import Field, GetCoreSchemaHandler
from pydantic_core import core_schema

from hermes_async.agent import AgentOptions, AgentResult, ToolContext
from hermes_async.envs._atropos import APIServerConfig, EvalHandlingEnum
from hermes_async.envs._examples import CyclingItems
from hermes_async.envs.base import HermesAgentBaseEnv
from hermes_async.envs.config import HermesAgentEnvConfig
from hermes_async.envs.results import EvalReport
from hermes_async.envs.samples import YC_BENCH_SAMPLE_PRESET
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.tools.sandbox.base import Sandbox, small_int
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "INITIAL_FUNDS_CENTS",
    "FinalState",
    "RunRecord",
    "YCBenchEnv",
    "YCBenchEvalConfig",
    "YCBenchEvalEnv",
    "composite_score",
    "read_final_state",
    "run_metrics",
)

logger = logging.getLogger(__name__)

#: yc-bench's seed capital ($250,000), the funds score's unit.
INITIAL_FUNDS_CENTS = 25_000_000
#: Horizon of each yc-bench 0.1.0 preset, in years (its TOMLs' ``[sim] horizon_years``).
PRESET_HORIZONS = {
    "tutorial": 1,
    "easy": 1,
    "medium": 1,
    "hard": 1,
    "nightmare": 1,
    "fast_test": 1,
    "high_reward": 1,
    "default": 3,
    "challenge": 3,
}
#: ``--env.presets '["sample"]'``: the built-in small world (hermes_async/envs/samples).
SAMPLE_PRESET = "sample"
#: Most ``sim resume`` calls spent advancing a run to its end after the agent stopped.
MAX_FINISH_RESUMES = 500
#: Largest database read back for scoring.
MAX_DB_BYTES = 100 * 1024 * 1024
#: The system paths a sandbox's PATH keeps after the simulator's own folder.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Seeds a world from the active preset, with yc-bench's interpreter in the sandbox. yc-bench
#: 0.1.0's ``sim init`` seeds the built-in world (only the preset's counts) into a database
#: whose tables it never made; its ``run`` and the git pin's ``sim init`` do what this does.
SEED_PROGRAM = """\
import json, sys
from datetime import datetime, timezone
from yc_bench.config import get_world_config
from yc_bench.core.events import insert_event
from yc_bench.db.models.event import EventType
from yc_bench.db.models.sim_state import SimState
from yc_bench.db.session import build_engine, build_session_factory, init_db, session_scope
from yc_bench.services.seed_world import SeedWorldRequest, seed_world_transactional

seed, start, company, years = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
start_dt = datetime.strptime(start, "%m/%d/%Y").replace(hour=9, tzinfo=timezone.utc)
horizon_end = start_dt.replace(year=start_dt.year + years)
world = get_world_config()
engine = build_engine()
init_db(engine)
with session_scope(build_session_factory(engine)) as db:
    if db.query(SimState).first() is not None:
        sys.exit("a simulation already exists in this database")
    request = SeedWorldRequest(
        run_seed=seed, company_name=company, horizon_years=years,
        employee_count=world.num_employees, market_task_count=world.num_market_tasks,
        start_date=start_dt, cfg=world,
    )
    result = seed_world_transactional(db, request)
    insert_event(
        db=db, company_id=result.company_id, event_type=EventType.HORIZON_END,
        scheduled_at=horizon_end, payload={"reason": "horizon_end"}, dedupe_key="horizon_end",
    )
    db.add(SimState(company_id=result.company_id, sim_time=start_dt, run_seed=seed,
                    horizon_end=horizon_end, replenish_counter=0))
    db.flush()
    print(json.dumps({"company_id": str(result.company_id), "company_name": company,
                      "seed": seed, "horizon_end": horizon_end.isoformat()}))
"""

SYSTEM_PROMPT = """\
You are the CEO of a young AI startup in a deterministic business simulation, and you run it
only through the `yc-bench` command line. Your goal: reach the end of the simulation without
going bankrupt, with as much money as you can.

## How the world works

- Funds: you start with $250,000. Money comes from finishing tasks on time; a task's reward
  grows with your prestige in its domains.
- Domains: system, research, data, frontend, backend, training and hardware, each with its own
  prestige (1 to 10). More prestige opens better-paid tasks.
- Employees have a skill rate per domain. An employee working on N active tasks splits their
  time N ways, so concentrate people on few tasks.
- Payroll is paid on the first business day of each month. Funds below zero after payroll is
  bankruptcy, and the game ends.
- Time moves only when you run `yc-bench sim resume`; it jumps to the next event (a task
  reaching half-way or done, payroll, the end).

## Tasks

Browse the market, accept a task (its deadline starts then), assign employees, dispatch it,
then resume time until it completes. Late tasks earn nothing and cost prestige; cancelling
costs more than failing, so cancel only as a last resort.

## Commands (every one prints JSON)

Look:
- `yc-bench company status` (funds, prestige, payroll, runway)
- `yc-bench employee list` (skills, salaries, current tasks)
- `yc-bench market browse [--domain D] [--required-prestige-lte N] [--limit N]`
- `yc-bench task list [--status planned|active|completed_success|completed_fail]`
- `yc-bench task inspect --task-id ID`
- `yc-bench finance ledger [--category monthly_payroll|task_reward]`
- `yc-bench report monthly`

Act:
- `yc-bench task accept --task-id ID`
- `yc-bench task assign --task-id ID --employee-id ID`
- `yc-bench task dispatch --task-id ID` (needs at least one assigned employee)
- `yc-bench task cancel --task-id ID --reason "why"`
- `yc-bench sim resume`

Notes that survive a long run: `yc-bench scratchpad read|clear`, `yc-bench scratchpad
write|append --content "text"`.

## Strategy

Specialise in two or three domains, keep each employee on few tasks, watch your runway before
each payroll, and do not accept more than your team can finish in time. Think before each
step, then act; keep going until the simulation ends."""


def _words(value: Any) -> Any:
    """A JSON list or comma-separated text as a list (other values unchanged)."""
    if isinstance(value, str):
        text = value.strip()
        return json.loads(text) if text.startswith("[") else [w for w in text.split(",") if w]
    return value


class _Presets(list[str]):
    # atroposlib's CLI turns a plain list field into `nargs="+"` (one string per word), so the
    # reference's documented `--env.presets '["fast_test"]'` named a preset '["fast_test"]'; a
    # list of its own type is one argument, read as JSON or comma-separated.
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return core_schema.no_info_before_validator_function(_words, handler(list[str]))


class _Seeds(list[int]):
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return core_schema.no_info_before_validator_function(_words, handler(list[int]))


class YCBenchEvalConfig(HermesAgentEnvConfig):
    """YCBenchEvalEnv's options: the reference's, and where the simulator is."""

    presets: _Presets = Field(
        default_factory=lambda: _Presets(["fast_test", "medium", "hard"]),
        description="yc-bench preset names or .toml files ('sample': the built-in world); "
        "a JSON list or comma-separated on the command line.",
    )
    seeds: _Seeds = Field(
        default_factory=lambda: _Seeds([1, 2, 3]),
        description="Seeds; each preset x seed is one run.",
    )
    run_timeout: int = Field(default=3600, gt=0, description="Wall-clock seconds per run.")
    survival_weight: float = Field(default=0.5, description="Weight of survival (0/1).")
    funds_weight: float = Field(default=0.5, description="Weight of the log-scaled funds.")
    db_dir: str = Field(
        default="/tmp/yc_bench_dbs", description="Folder of the run's database, in its sandbox."
    )
    horizon_years: int | None = Field(
        default=None, description="Simulation horizon (None: the preset's, else 1)."
    )
    company_name: str = Field(default="BenchCo", description="The simulated company's name.")
    start_date: str = Field(default="01/01/2025", description="Start date, MM/DD/YYYY.")
    yc_bench_command: str = Field(
        default="yc-bench",
        description="The yc-bench executable (a path, or a name on PATH; inside the image for "
        "container backends).",
    )


@dataclass(frozen=True, slots=True)
class FinalState:
    """A run's end, read from its database.

    Attributes:
        terminal_reason: ``bankruptcy``, ``horizon_end`` or ``unfinished``.
    """

    funds_cents: int
    terminal_reason: str
    survived: bool


def read_final_state(database: bytes) -> FinalState:
    """The end state of a yc-bench SQLite database (its bytes).

    Bankruptcy is funds below zero or a bankruptcy event by the simulation's clock; the
    horizon is the clock reaching it (the reference's latest-event query always said horizon).

    Raises:
        ValueError: Not a yc-bench database (no company or simulation state).
    """
    conn = sqlite3.connect(":memory:")
    try:
        try:
            conn.deserialize(database)
            company = conn.execute("SELECT funds_cents FROM companies LIMIT 1").fetchone()
            state = conn.execute("SELECT sim_time, horizon_end FROM sim_state LIMIT 1").fetchone()
            bankruptcies = conn.execute(
                "SELECT COUNT(*) FROM sim_events WHERE event_type = 'bankruptcy' "
                "AND scheduled_at <= ?",
                (state[0] if state else "",),
            ).fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"not a yc-bench database: {exc}") from exc
    finally:
        conn.close()
    if company is None or state is None:
        raise ValueError("not a yc-bench database: no company or no simulation state")
    funds = int(company[0])
    bankrupt = funds < 0 or bankruptcies > 0
    horizon = str(state[0]) >= str(state[1])
    reason = "bankruptcy" if bankrupt else "horizon_end" if horizon else "unfinished"
    return FinalState(funds, reason, horizon and not bankrupt)


def composite_score(
    funds_cents: int,
    survived: bool,
    survival_weight: float = 0.5,
    funds_weight: float = 0.5,
    initial_funds_cents: int = INITIAL_FUNDS_CENTS,
) -> float:
    """``survival_weight x survived + funds_weight x funds score``; the funds score is 0 at or
    below zero, log1p(funds / initial) / log1p(100) above (0.15 at 1x, 0.52 at 10x), at most 1."""
    funds = 0.0
    if funds_cents > 0:
        funds = min(math.log1p(funds_cents / max(initial_funds_cents, 1)) / math.log1p(100), 1.0)
    return survival_weight * (1.0 if survived else 0.0) + funds_weight * funds


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One scored run (the reference's result record, without the messages)."""

    preset: str
    seed: int
    survived: bool
    final_funds_cents: int
    terminal_reason: str
    composite_score: float


def _preset_key(preset: str) -> str:
    return Path(preset).stem if preset.endswith(".toml") else preset


class YCBenchEvalEnv(CyclingItems, HermesAgentBaseEnv):
    """YC-Bench runs, one sandbox and database each, scored from the final state.

    Attributes:
        items: The (preset, seed) runs. ``runs`` holds each scored run's record by task id.
    """

    name = "yc-bench"
    env_config_cls = YCBenchEvalConfig

    @classmethod
    def config_init(cls) -> tuple[YCBenchEvalConfig, list[APIServerConfig]]:
        """The reference's defaults (terminal only, 200 turns, temperature 0, local)."""
        config = YCBenchEvalConfig(
            enabled_toolsets=["terminal"],
            max_agent_turns=200,
            max_token_length=32000,
            agent_temperature=0.0,
            eval_temperature=0.0,
            system_prompt=SYSTEM_PROMPT,
            terminal_backend="local",
            terminal_timeout=60,
            eval_handling=EvalHandlingEnum.STOP_TRAIN,
            group_size=1,
            steps_per_eval=1,
            total_steps=1,
            use_wandb=True,
            wandb_name="yc-bench",
            ensure_scores_are_not_same=False,
        )
        server = APIServerConfig(
            base_url="https://openrouter.ai/api/v1",
            model_name="anthropic/claude-sonnet-4.6",
            server_type="openai",
            api_key=os.environ.get("OPENROUTER_API_KEY") or "x",
            health_check=False,
        )
        return config, [server]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.yc_config
        found = shutil.which(cfg.yc_bench_command)
        #: The simulator's executable on this host (None: not here; it may be in an image).
        self.yc_bench_path = os.path.abspath(found) if found else None
        if self.yc_bench_path and cfg.terminal_backend == "local":
            # A namespaced sandbox shows the host only where told: the simulator's venv.
            options = dict(cfg.sandbox_options or {})
            root = str(Path(self.yc_bench_path).parent.parent)
            options["ro_binds"] = [*options.get("ro_binds", ()), root]
            cfg.sandbox_options = options
        self.runs: dict[str, RunRecord] = {}
        self.preset_files: dict[str, bytes] = {}
        self._eval_runs: list[RunRecord] | None = None

    @property
    def yc_config(self) -> YCBenchEvalConfig:
        config = self.config
        if not isinstance(config, YCBenchEvalConfig):
            raise ConfigError(
                f"YCBenchEvalEnv needs a YCBenchEvalConfig, got {type(config).__name__}"
            )
        return config

    async def setup(self) -> None:
        """The preset x seed runs; on the local backend, the simulator must be on this host.

        Raises:
            ConfigError: No runs, an unknown preset file, or (local backend) no ``yc-bench``.

        **Cancellation**: nothing to clean up.
        """
        cfg = self.yc_config
        if cfg.terminal_backend == "local" and self.yc_bench_path is None:
            raise ConfigError(
                f"yc-bench not found (yc_bench_command={cfg.yc_bench_command!r}): build its venv "
                "with scripts/yc_bench/setup_venv.sh (or pip install yc-bench under Python >= "
                "3.12) and pass --env.yc_bench_command PATH/bin/yc-bench"
            )
        self.preset_files = {}
        for preset in cfg.presets:
            file = self._preset_file(preset)
            if file is None:
                continue
            if not await anyio.Path(file).is_file():
                raise ConfigError(f"preset file {preset!r} does not exist")
            self.preset_files[preset] = await anyio.Path(file).read_bytes()
        self.items = [{"preset": p, "seed": s} for p in cfg.presets for s in cfg.seeds]
        if not self.items:
            raise ConfigError("no runs: presets and seeds must not be empty")
        self.train_items = self.items
        self._index = 0
        self.last_eval_report: EvalReport | None = None

    def _preset_file(self, preset: str) -> Path | None:
        if preset == SAMPLE_PRESET:
            return YC_BENCH_SAMPLE_PRESET
        return Path(preset) if preset.endswith(".toml") else None

    def horizon(self, preset: str) -> int:
        """``horizon_years``, else the preset's (a file's ``[sim]``, its ``extends``), else 1."""
        if self.yc_config.horizon_years:
            return self.yc_config.horizon_years
        content = self.preset_files.get(preset)
        if content is None:
            return PRESET_HORIZONS.get(preset, 1)
        data = tomllib.loads(content.decode("utf-8"))
        years = data.get("sim", {}).get("horizon_years")
        return int(years) if years else PRESET_HORIZONS.get(str(data.get("extends")), 1)

    def format_prompt(self, item: dict[str, Any]) -> str:
        """The reference's opening message: the run, the first commands, the loop to follow."""
        return (
            f"A new YC-Bench simulation has been initialized (preset={item['preset']!r}, "
            f"seed={item['seed']}).\n"
            f"Your company '{self.yc_config.company_name}' is ready.\n\n"
            "Begin by calling:\n"
            "1. `yc-bench company status` -- your funds and prestige\n"
            "2. `yc-bench employee list` -- your team and their skills\n"
            "3. `yc-bench market browse --required-prestige-lte 1` -- tasks you can take\n\n"
            "Then accept 2-3 tasks, assign employees, dispatch them, and call "
            "`yc-bench sim resume` to advance time. Repeat until the simulation ends (horizon "
            "reached or bankruptcy)."
        )

    def item_label(self, item: Any) -> str:
        if isinstance(item, dict) and "preset" in item:
            return f"{_preset_key(str(item['preset']))}/seed{item['seed']}"
        return super().item_label(item)

    def sandbox_spec(self, item: Any) -> SandboxSpec:
        """The run's own database and preset as sandbox variables, so runs can overlap."""
        cfg = self.yc_config
        preset = str(item["preset"])
        run = uuid.uuid4().hex[:8]
        key = _preset_key(preset)
        env = {
            "DATABASE_URL": f"sqlite:///{cfg.db_dir}/yc_bench_{key}_seed{item['seed']}_{run}.db",
            "YC_BENCH_EXPERIMENT": (
                f"{cfg.db_dir}/{key}.toml" if self._preset_file(preset) else preset
            ),
        }
        if self.yc_bench_path and cfg.terminal_backend == "local":
            env["PATH"] = f"{Path(self.yc_bench_path).parent}:{SYSTEM_PATH}"
        return SandboxSpec(env=env)

    def rollout_options(self, item: Any, options: AgentOptions) -> AgentOptions:
        """A run ends after ``run_timeout`` seconds, scoring included."""
        return dataclasses.replace(options, rollout_timeout=float(self.yc_config.run_timeout))

    async def setup_sandbox(self, item: Any, sandbox: Sandbox) -> None:
        """Seed a fresh world for the run (its preset, seed, start date and horizon).

        Raises:
            SandboxError: yc-bench is missing in the sandbox or the seeding failed.

        **Cancellation**: the command is killed; the sandbox is released by the rollout core.
        """
        cfg = self.yc_config
        preset = str(item["preset"])
        await sandbox.exec(f"mkdir -p {shlex.quote(cfg.db_dir)}", timeout=30)
        content = self.preset_files.get(preset)
        if content is not None:
            await sandbox.write_bytes(f"{cfg.db_dir}/{_preset_key(preset)}.toml", content)
        program = f"{cfg.db_dir}/seed_world.py"
        await sandbox.write_bytes(program, SEED_PROGRAM.encode())
        values = (item["seed"], cfg.start_date, cfg.company_name, self.horizon(preset))
        args = shlex.join(str(v) for v in values)
        command = (
            f'bin="$(command -v {shlex.quote(cfg.yc_bench_command)})" || '
            f'{{ echo "yc-bench not found in the sandbox" >&2; exit 127; }}; '
            f'"$(sed -n \'1s/^#!//p\' "$bin")" {shlex.quote(program)} {args}'
        )
        result = await sandbox.exec(command, timeout=300)
        if result.exit_code != 0:
            raise SandboxError(
                f"yc-bench could not seed preset {preset!r} seed {item['seed']} (exit "
                f"{result.exit_code}): {result.output.strip()[-500:]}"
            )

    async def compute_reward(
        self, item: dict[str, Any], result: AgentResult, ctx: ToolContext
    ) -> float:
        """Play the run to its end (no more decisions), read the database, return the score.

        Raises:
            SandboxError: The simulator failed or the database could not be read.

        **Cancellation**: the running command is killed; the sandbox is released by the caller.
        """
        cfg = self.yc_config
        sandbox = await ctx.manager.get(ctx.task_id)
        await self._finish(sandbox)
        url = (await sandbox.exec("printenv DATABASE_URL", timeout=30)).stdout.strip()
        path = "/" + url.removeprefix("sqlite:///").lstrip("/")
        size = (await sandbox.exec(f"stat -c %s {shlex.quote(path)}", timeout=30)).stdout.strip()
        number = small_int(size)
        if number is None or not 0 <= number <= MAX_DB_BYTES:
            raise SandboxError(f"the run's database {path} is missing or over {MAX_DB_BYTES} bytes")
        try:
            state = read_final_state(await sandbox.read_bytes(path))
        except (OSError, ValueError) as exc:
            raise SandboxError(f"cannot read the run's database {path}: {exc}") from exc
        score = composite_score(
            state.funds_cents, state.survived, cfg.survival_weight, cfg.funds_weight
        )
        preset, seed = str(item["preset"]), int(item["seed"])
        end = (state.survived, state.funds_cents, state.terminal_reason)
        record = RunRecord(preset, seed, *end, score)
        self.runs[ctx.task_id] = record
        if len(self.runs) > 10_000:
            del self.runs[next(iter(self.runs))]
        if self._eval_runs is not None and self.is_evaluating:
            self._eval_runs.append(record)
        logger.info("yc-bench run scored: %s", record)
        return score

    async def _finish(self, sandbox: Sandbox) -> None:
        """``sim resume`` until the run reports a terminal reason (bounded)."""
        command = f"{shlex.quote(self.yc_config.yc_bench_command)} sim resume"
        for _ in range(MAX_FINISH_RESUMES):
            out = await sandbox.exec(command, timeout=120)
            try:
                reply = json.loads(out.stdout)
            except ValueError:
                reply = None
            if not isinstance(reply, dict) or "error" in reply:
                raise SandboxError(
                    f"yc-bench sim resume failed (exit {out.exit_code}): {out.output.strip()[-500:]}"
                )
            if reply.get("terminal_reason") or reply.get("message") == "no_pending_events":
                return
        raise SandboxError(f"the run did not end within {MAX_FINISH_RESUMES} sim resumes")

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Every (preset, seed) run, concurrently (``eval_concurrency``), scored.

        **Cancellation**: every run is cancelled and its sandbox released.
        """
        size = self.config.eval_size
        items = self.items[:size] if size else self.items
        self._eval_runs = []
        try:
            self.last_eval_report = await self.run_agent_eval(items, task_name="yc_bench_eval")
        finally:
            self._eval_runs = None

    async def evaluate_log(self, metrics: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        """atroposlib's, with the run metrics of the evaluation that is logging.

        **Cancellation**: as atroposlib's.
        """
        if self._eval_runs is not None:
            metrics = {**metrics, **run_metrics(self._eval_runs)}
        await super().evaluate_log(metrics, *args, **kwargs)


def run_metrics(runs: Sequence[RunRecord]) -> dict[str, float]:
    """The reference's evaluation metrics over scored runs."""
    total = len(runs)
    metrics = {
        "eval/total_runs": float(total),
        "eval/survived_runs": float(sum(r.survived for r in runs)),
        "eval/survival_rate": sum(r.survived for r in runs) / total if total else 0.0,
        "eval/avg_composite_score": (
            math.fsum(r.composite_score for r in runs) / total if total else 0.0
        ),
    }
    by_preset: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        by_preset[_preset_key(run.preset).replace("-", "_")].append(run)
    for key, group in sorted(by_preset.items()):
        metrics[f"eval/survival_rate_{key}"] = sum(r.survived for r in group) / len(group)
        metrics[f"eval/avg_score_{key}"] = math.fsum(r.composite_score for r in group) / len(group)
    return metrics


#: The name the seeds use.
YCBenchEnv = YCBenchEvalEnv


if __name__ == "__main__":
    YCBenchEvalEnv.cli()
