"""The Harbor runtime contract as pure decisions: steps, reward files, statuses.

:mod:`.trial` runs the steps on a sandbox: setup, agent, collect, prepare, verify, score.
Invariant: a missing, unreadable, non-finite or out-of-range reward is a ``verifier``
failure with no reward, never 0 and never ``test.sh``'s exit code.
Reasons: ``docs/decisions/039-terminal-bench.md``.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.tools.sandbox.base import ExecRequest, small_int

__all__ = (
    "AGENT_LOGS_DIR",
    "ARTIFACTS_DIR",
    "DEFAULT_AGENT_TIMEOUT_SECONDS",
    "LOGS_DIR",
    "MAX_REWARD_FILE_BYTES",
    "MAX_STDOUT_BYTES",
    "ORACLE_STDOUT",
    "REWARD_JSON",
    "REWARD_RANGE",
    "REWARD_TXT",
    "SETUP_TIMEOUT_SECONDS",
    "SOLUTION_DIR",
    "TESTS_DIR",
    "TEST_STDOUT",
    "VERIFIER_LOGS_DIR",
    "AgentKind",
    "RewardReading",
    "Step",
    "TrialStatus",
    "agent_status",
    "agent_timeout",
    "collect_spec",
    "oracle_spec",
    "parse_pids",
    "prepare_solution_spec",
    "prepare_verifier_spec",
    "read_reward",
    "read_spec",
    "readable_spec",
    "setup_spec",
    "trial_status",
    "verifier_spec",
    "workdir_for",
)

LOGS_DIR = "/logs"
AGENT_LOGS_DIR = "/logs/agent"
VERIFIER_LOGS_DIR = "/logs/verifier"
ARTIFACTS_DIR = "/logs/artifacts"
TESTS_DIR = "/tests"
SOLUTION_DIR = "/solution"
REWARD_TXT = f"{VERIFIER_LOGS_DIR}/reward.txt"
REWARD_JSON = f"{VERIFIER_LOGS_DIR}/reward.json"
TEST_STDOUT = f"{VERIFIER_LOGS_DIR}/test-stdout.txt"
ORACLE_STDOUT = f"{AGENT_LOGS_DIR}/oracle.txt"

#: The agent's deadline when the task sets none (the reference's ``task_timeout``).
DEFAULT_AGENT_TIMEOUT_SECONDS = 1800.0
#: Deadline of each bookkeeping step (setup, prepare, chmod, reading a file).
SETUP_TIMEOUT_SECONDS = 60.0
#: A reward file is one number or a small JSON object; more is read up to this and parsed.
MAX_REWARD_FILE_BYTES = 64 * 1024
#: How much of the test script's (and oracle's) output is kept: the tail.
MAX_STDOUT_BYTES = 256 * 1024

#: What ran in the agent's place: a model, the task's oracle, or nothing at all.
AgentKind = Literal["model", "oracle", "null"]
#: ``ok`` or a failure category: the rollout taxonomy's, plus ``task_invalid`` (the task
#: cannot run as asked: no solve.sh for an oracle, a bad task.toml) and ``needs_network``
#: (flagged before it ran: the task builds or verifies with the network it does not have).
TrialStatus = Literal[
    "ok",
    "model",
    "tool",
    "agent_timeout",
    "infra",
    "verifier",
    "cancelled",
    "task_invalid",
    "needs_network",
]
#: The rewards a Harbor verifier may write (Harbor's documented range); outside is an error.
REWARD_RANGE = (0.0, 1.0)
#: Output kept from a contract step's command (its messages; files are read apart).
_STEP_OUTPUT_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Step:
    """One command of the contract: what it is (for errors and logs) and the request."""

    what: str
    request: ExecRequest


def _step(
    what: str,
    command: str,
    *,
    user: str | None,
    timeout: float = SETUP_TIMEOUT_SECONDS,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> Step:
    return Step(
        what,
        ExecRequest(
            command,
            cwd=cwd,
            env=dict(env) if env else None,
            timeout=timeout,
            user=user,
            output_limit=_STEP_OUTPUT_BYTES,
        ),
    )


def workdir_for(task: HarborTask, image_workdir: str | None) -> str:
    """The agent's and verifier's working directory: the task's, else the image's, else ``/``."""
    return task.environment.workdir or image_workdir or "/"


def _root(script: str, what: str) -> Step:
    # The contract's own steps run as root whatever the image's USER (Harbor does).
    return _step(what, script, user="root")


def setup_spec() -> Step:
    """Create the log folders and print the container's process ids.

    The folders are 0777: agent and verifier may be non-root. Processes running before the
    agent (an entrypoint service) survive the hygiene before grading (:func:`parse_pids`).
    """
    dirs = " ".join((AGENT_LOGS_DIR, VERIFIER_LOGS_DIR, ARTIFACTS_DIR))
    return _root(
        f"mkdir -p {dirs} && chmod 0777 {LOGS_DIR} {dirs} && "
        'for d in /proc/[0-9]*; do echo "${d#/proc/}"; done',
        "create /logs",
    )


def parse_pids(output: str) -> frozenset[int]:
    """The process ids :func:`setup_spec` printed."""
    numbers = map(small_int, output.split())
    return frozenset(n for n in numbers if n is not None and n >= 0)


def prepare_solution_spec() -> Step:
    """Empty ``/solution`` before the oracle's files are copied in."""
    return _root(f"rm -rf {SOLUTION_DIR} && mkdir -p {SOLUTION_DIR}", "empty /solution")


def readable_spec(path: str) -> Step:
    """Make uploaded files readable (and scripts runnable) by a non-root user."""
    return _root(f"chmod -R a+rX {shlex.quote(path)}", f"chmod {path}")


def read_spec(path: str, *, max_bytes: int, tail: bool) -> Step:
    """Print the head (or tail) of ``path`` as root; exit 3 when it is not a regular file."""
    tool = "tail" if tail else "head"
    quoted = shlex.quote(path)
    return Step(
        f"read {path}",
        ExecRequest(
            f"test -f {quoted} || exit 3; {tool} -c {int(max_bytes)} {quoted}",
            timeout=SETUP_TIMEOUT_SECONDS,
            user="root",
            output_limit=max(int(max_bytes), 1024),
        ),
    )


def oracle_spec(task: HarborTask, *, workdir: str, timeout: float | None = None) -> Step:
    """``bash /solution/solve.sh`` as the agent's user, output to ``/logs/agent/oracle.txt``."""
    return _step(
        "solution/solve.sh",
        f"bash {SOLUTION_DIR}/solve.sh > {ORACLE_STDOUT} 2>&1",
        user=task.agent_user,
        env=task.solution_env,
        cwd=workdir,
        timeout=timeout if timeout is not None else agent_timeout(task),
    )


def agent_timeout(task: HarborTask, multiplier: float = 1.0) -> float:
    """The agent phase's deadline: ``[agent].timeout_sec`` (or the default) times ``multiplier``."""
    if not multiplier > 0:
        raise ValueError(f"agent timeout multiplier must be > 0, got {multiplier!r}")
    return (task.agent_timeout_sec or DEFAULT_AGENT_TIMEOUT_SECONDS) * multiplier


def collect_spec(task: HarborTask, index: int, *, workdir: str) -> Step:
    """The ``index``-th ``[[verifier.collect]]`` hook (deadline: its own, else the verifier's)."""
    hook = task.collect[index]
    return _step(
        f"verifier.collect[{index}]",
        hook.command,
        user=hook.user,
        cwd=workdir,
        timeout=hook.timeout_sec or task.verifier_timeout_sec,
    )


# Runs as root with `sh` (POSIX): no command substitution in the kill loops, so the shell
# forks nothing that the loops could hit. /proc/<pid>/stat: "pid (comm) state ppid ..." where
# comm may hold spaces and parentheses, so fields are taken after the last ") ".
_STOP_STRAYS = r"""
idle=
for s in /proc/[0-9]*/stat; do
  read -r line < "$s" 2>/dev/null || continue
  pid=${line%% *}
  set -- ${line##*) }
  if [ "$2" = 1 ] && { [ -z "$idle" ] || [ "$pid" -lt "$idle" ]; }; then idle=$pid; fi
done
keep=" 1 $$ $idle $HERMES_KEEP_PIDS "
p=$$
while [ "${p:-0}" -gt 1 ]; do
  read -r line < "/proc/$p/stat" 2>/dev/null || break
  set -- ${line##*) }
  p=$2
  keep="$keep$p "
done
for sig in STOP KILL KILL; do
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    case "$keep" in *" $pid "*) continue ;; esac
    kill -s $sig "$pid" 2>/dev/null
  done
done
"""


def prepare_verifier_spec(
    *, stop_agent_processes: bool = True, keep: frozenset[int] = frozenset()
) -> Step:
    """Stop the agent's leftovers, then recreate ``/tests`` and ``/logs/verifier`` empty.

    ``keep``: processes from :func:`setup_spec`'s snapshot survive.
    """
    keep_line = "HERMES_KEEP_PIDS=" + shlex.quote(" ".join(map(str, sorted(keep))))
    steps = [keep_line, _STOP_STRAYS] if stop_agent_processes else []
    # A SIGKILLed writer can still be finishing a write on a loaded machine while rm runs
    # ("Directory not empty"): the removal is retried briefly (the last try's error stands).
    # rm -rf removes a symlink the agent may have put at /tests, not its target.
    steps.append(
        f"for _ in 1 2 3 4; do rm -rf {TESTS_DIR} {VERIFIER_LOGS_DIR} 2>/dev/null && break; "
        "sleep 0.25; done\n"
        f"rm -rf {TESTS_DIR} {VERIFIER_LOGS_DIR} && mkdir -p {TESTS_DIR} {VERIFIER_LOGS_DIR} "
        f"&& chmod 0777 {VERIFIER_LOGS_DIR}"
    )
    return _root("\n".join(steps), "empty /tests and /logs/verifier")


def verifier_spec(task: HarborTask, *, workdir: str, timeout: float | None = None) -> Step:
    """``bash /tests/test.sh`` under the contract (output to ``/logs/verifier/test-stdout.txt``)."""
    return _step(
        "tests/test.sh",
        f"bash {TESTS_DIR}/test.sh > {TEST_STDOUT} 2>&1",
        user=task.verifier_user,
        env={"TEST_DIR": TESTS_DIR, **task.verifier_env},
        cwd=workdir,
        timeout=timeout if timeout is not None else task.verifier_timeout_sec,
    )


# --------------------------------------------------------------------------- reward files


@dataclass(frozen=True, slots=True)
class RewardReading:
    """What the reward files said.

    Attributes:
        reward: None when the verifier produced none that can be read.
        metrics: Every numeric field of ``reward.json`` (``{"reward": r}`` for reward.txt).
        error: Why there is no reward.
    """

    reward: float | None
    metrics: Mapping[str, float] = field(default_factory=dict)
    source: str | None = None
    error: str | None = None


def _show(data: bytes, limit: int = 80) -> str:
    text = data[:limit].decode("utf-8", "replace")
    return repr(text) + ("..." if len(data) > limit else "")


def _number(value: object) -> float | None:
    """A JSON number as a float; None for a non-number, a bool or an integer too large."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # a 400-digit integer
        return None


def _check(number: float | None, what: str, raw: object) -> tuple[float | None, str | None]:
    """``(reward, None)`` for a finite reward in :data:`REWARD_RANGE`, else ``(None, why)``."""
    low, high = REWARD_RANGE
    shown = _show(str(raw).encode(), 40)
    if number is None:
        return None, f"{what} is not a number a float can hold: {shown}"
    if not math.isfinite(number):
        return None, f"{what} is not a finite number: {shown}"
    if not low <= number <= high:
        return None, f"{what} is {number:g}, outside the reward range {low:g}..{high:g}"
    return number, None


def _parse_txt(data: bytes) -> tuple[float | None, str | None]:
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return None, "reward.txt is empty"
    try:
        number = float(text)
    except ValueError:
        return None, f"reward.txt is not a number: {_show(data)}"
    return _check(number, "reward.txt", text)


def read_reward(reward_txt: bytes | None, reward_json: bytes | None) -> RewardReading:
    """Score a trial from its reward files' contents (None: the file does not exist).

    ``reward.json`` wins over ``reward.txt`` (Harbor's order); its ``reward`` key is the
    reward, and only when that key is absent ``reward.txt``, else the first number. A reward
    present but not finite or out of :data:`REWARD_RANGE` is an error, never replaced.
    Never raises.
    """
    if reward_json is not None:
        return _read_json(reward_json, reward_txt)
    if reward_txt is not None:
        number, error = _parse_txt(reward_txt)
        if number is None:
            return RewardReading(None, source="reward.txt", error=error)
        return RewardReading(number, {"reward": number}, "reward.txt")
    return RewardReading(None, error=f"the verifier wrote no {REWARD_TXT} or {REWARD_JSON}")


def _read_json(reward_json: bytes, reward_txt: bytes | None) -> RewardReading:
    if not reward_json.strip():
        return RewardReading(None, source="reward.json", error="reward.json is empty")
    try:
        parsed = json.loads(reward_json)
    except (ValueError, RecursionError):
        return RewardReading(
            None, source="reward.json", error=f"reward.json is not JSON: {_show(reward_json)}"
        )
    if not isinstance(parsed, dict):
        return RewardReading(
            None, source="reward.json", error=f"reward.json is not an object: {_show(reward_json)}"
        )
    metrics = {}
    for key, value in parsed.items():
        number = _number(value)
        if number is not None and math.isfinite(number):
            metrics[str(key)] = number
    if "reward" in parsed:
        reward, error = _check(_number(parsed["reward"]), "reward.json's reward", parsed["reward"])
        return RewardReading(reward, metrics if reward is not None else {}, "reward.json", error)
    if reward_txt is not None:
        reward, error = _parse_txt(reward_txt)
        if reward is None:
            return RewardReading(None, source="reward.txt", error=error)
        return RewardReading(reward, {**metrics, "reward": reward}, "reward.json")
    for key, value in parsed.items():
        number = _number(value)
        if not isinstance(value, bool) and isinstance(value, int | float):
            reward, error = _check(number, f"reward.json's first value ({key!r})", value)
            return RewardReading(
                reward, metrics if reward is not None else {}, "reward.json", error
            )
    return RewardReading(
        None, source="reward.json", error=f"reward.json has no numeric value: {_show(reward_json)}"
    )


def agent_status(*, kind: AgentKind, timed_out: bool) -> TrialStatus:
    """The agent phase's status: ``agent_timeout`` when it ran out of time, else ``ok``."""
    del kind  # the same rule for every agent kind (kept for the call sites' clarity)
    return "agent_timeout" if timed_out else "ok"


def trial_status(
    *,
    agent: TrialStatus,
    verifier_timed_out: bool,
    verifier_timeout: float,
    reading: RewardReading | None,
) -> tuple[TrialStatus, float | None, str | None]:
    """``(status, reward, error)`` of a graded trial.

    The verifier decides the reward; ``test.sh``'s exit code plays no part. A verifier
    failure outranks an agent timeout.
    """
    if verifier_timed_out:
        return "verifier", None, f"tests/test.sh timed out after {verifier_timeout:g} s"
    if reading is None or reading.reward is None:
        error = reading.error if reading is not None else "the reward files could not be read"
        return "verifier", None, error
    if agent != "ok":
        return agent, reading.reward, None
    return "ok", reading.reward, None
