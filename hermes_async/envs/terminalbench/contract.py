"""The Harbor runtime contract as pure decisions: paths, commands, reward files, statuses.

Nothing here does I/O: :mod:`.trial` runs these commands through any sandbox, and the
decisions are tested without one.

One trial, in the container (paths fixed by the contract)::

    setup     mkdir /logs/agent /logs/verifier /logs/artifacts (mode 0777)        as root
    agent     the model, or the oracle (/solution/solve.sh with [solution.env]), or nothing
              -- as [agent].user, in the workdir, bounded by [agent].timeout_sec
    collect   [[verifier.collect]] hooks, best effort
    prepare   stop what the agent left running; empty /tests and /logs/verifier   as root
    upload    tests/ -> /tests
    verify    bash /tests/test.sh  (cwd: the workdir; TEST_DIR=/tests + [verifier.env];
              user [verifier].user; bounded by [verifier].timeout_sec; output kept in
              /logs/verifier/test-stdout.txt)
    score     /logs/verifier/reward.json or reward.txt, read on the host

Decisions (each one a rule of the contract or a fix of the reference's TB2 environment):

* **A missing, empty or unreadable reward is a ``verifier`` failure with reward None** —
  never 0.0 and never the test script's exit code (the reference fell back to
  ``exit_code == 0``, which scores a crashed verifier as a pass or a fail at random).
* ``reward.json`` wins over ``reward.txt`` when both exist (Harbor's order). Its numeric
  fields are the trial's metrics; the reward is its ``reward`` key, else the scalar in
  ``reward.txt``, else its first numeric value.
* The verifier's deadline is the task's ``[verifier].timeout_sec`` (the reference used a
  fixed 180 s against TB2's 900 s). A timeout is a ``verifier`` failure, reward None.
* **Hygiene before grading**: the agent's processes are stopped and ``/tests`` and
  ``/logs/verifier`` recreated empty, so a planted reward, a replaced ``test.sh`` or a
  background job that keeps writing ``reward.txt`` cannot score. Stopping processes is this
  project's addition to the contract (Harbor only empties the folders). It keeps PID 1 and
  the oldest child of PID 1 (the idle command under ``docker run --init``), the
  preparing shell and its ancestors (a sandbox backend's exec wrapper); everything else in the container's PID namespace is stopped
  and killed (two passes, for jobs that fork while being killed).
* An agent that fails or times out is still graded (Harbor does): the status says what
  happened to the agent (``agent_timeout``) and the reward says what the verifier found.
* The workdir is the task's ``[environment].workdir``, else the image's ``WORKDIR``, else
  ``/`` (TB2 test scripts refuse to run with ``PWD=/``, so tasks set one).
* The test script runs as ``bash /tests/test.sh`` (not a login shell: Debian's
  ``/etc/profile`` resets ``PATH`` and would drop the image's ``ENV PATH``).

Known limit (Harbor's too, in its shared verifier mode): the verifier runs in the container
the agent used, so an agent with root can still change what the tests run on (replace
``python3``, edit a library). Only a separate verifier container closes that; tasks that
care run the agent as a non-root ``[agent].user``.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from hermes_async.envs.terminalbench.task import HarborTask

__all__ = (
    "AGENT_LOGS_DIR",
    "ARTIFACTS_DIR",
    "DEFAULT_AGENT_TIMEOUT_SECONDS",
    "LOGS_DIR",
    "MAX_REWARD_FILE_BYTES",
    "MAX_STDOUT_BYTES",
    "ORACLE_STDOUT",
    "REWARD_JSON",
    "REWARD_TXT",
    "SETUP_TIMEOUT_SECONDS",
    "SOLUTION_DIR",
    "TESTS_DIR",
    "TEST_STDOUT",
    "VERIFIER_LOGS_DIR",
    "AgentKind",
    "ExecSpec",
    "RewardReading",
    "TrialStatus",
    "agent_status",
    "agent_timeout",
    "collect_spec",
    "oracle_spec",
    "prepare_solution_spec",
    "prepare_verifier_spec",
    "read_reward",
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
#: ``ok`` or one of the failure taxonomy's categories.
TrialStatus = Literal["ok", "model", "tool", "agent_timeout", "infra", "verifier", "cancelled"]


@dataclass(frozen=True, slots=True)
class ExecSpec:
    """One command to run in the task's container.

    Attributes:
        argv: The command (no shell unless argv says so).
        user: Who runs it (None: the image's default user).
        env: Extra environment variables (on top of the image's).
        cwd: The working directory (None: the image's WORKDIR).
        timeout: The deadline in seconds.
        what: A short description for errors and logs.
    """

    argv: tuple[str, ...]
    user: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    timeout: float = SETUP_TIMEOUT_SECONDS
    what: str = "command"


def workdir_for(task: HarborTask, image_workdir: str | None) -> str:
    """The agent's and verifier's working directory (see the module docs)."""
    return task.environment.workdir or image_workdir or "/"


def _sh(script: str, what: str, *, timeout: float = SETUP_TIMEOUT_SECONDS) -> ExecSpec:
    return ExecSpec(("sh", "-c", script), user="root", timeout=timeout, what=what)


def setup_spec() -> ExecSpec:
    """Create the contract's log folders (0777: the agent and verifier may be non-root)."""
    dirs = " ".join((AGENT_LOGS_DIR, VERIFIER_LOGS_DIR, ARTIFACTS_DIR))
    return _sh(f"mkdir -p {dirs} && chmod 0777 {LOGS_DIR} {dirs}", "create /logs")


def prepare_solution_spec() -> ExecSpec:
    """Empty ``/solution`` before the oracle's files are copied in."""
    return _sh(f"rm -rf {SOLUTION_DIR} && mkdir -p {SOLUTION_DIR}", "empty /solution")


def readable_spec(path: str) -> ExecSpec:
    """Make uploaded files readable (and scripts runnable) by a non-root user."""
    return _sh(f"chmod -R a+rX {shlex.quote(path)}", f"chmod {path}")


def oracle_spec(task: HarborTask, *, workdir: str, timeout: float | None = None) -> ExecSpec:
    """``bash /solution/solve.sh`` as the agent's user, with ``[solution.env]``.

    Output goes to ``/logs/agent/oracle.txt`` (read back bounded, like the verifier's).
    """
    return ExecSpec(
        ("bash", "-c", f"bash {SOLUTION_DIR}/solve.sh > {ORACLE_STDOUT} 2>&1"),
        user=task.agent_user,
        env=dict(task.solution_env),
        cwd=workdir,
        timeout=timeout if timeout is not None else agent_timeout(task),
        what="solution/solve.sh",
    )


def agent_timeout(task: HarborTask, multiplier: float = 1.0) -> float:
    """The agent phase's deadline: ``[agent].timeout_sec`` (or the default) times ``multiplier``."""
    if not multiplier > 0:
        raise ValueError(f"agent timeout multiplier must be > 0, got {multiplier!r}")
    return (task.agent_timeout_sec or DEFAULT_AGENT_TIMEOUT_SECONDS) * multiplier


def collect_spec(task: HarborTask, index: int, *, workdir: str) -> ExecSpec:
    """The ``index``-th ``[[verifier.collect]]`` hook (deadline: its own, else the verifier's)."""
    hook = task.collect[index]
    return ExecSpec(
        ("bash", "-c", hook.command),
        user=hook.user,
        cwd=workdir,
        timeout=hook.timeout_sec or task.verifier_timeout_sec,
        what=f"verifier.collect[{index}]",
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
keep=" 1 $$ $idle "
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


def prepare_verifier_spec(*, stop_agent_processes: bool = True) -> ExecSpec:
    """Stop the agent's leftovers, then recreate ``/tests`` and ``/logs/verifier`` empty.

    ``rm -rf`` removes a symlink the agent may have put at ``/tests`` rather than its target.
    """
    steps = [_STOP_STRAYS] if stop_agent_processes else []
    # A SIGKILLed writer can still be finishing a write on a loaded machine while rm runs
    # ("Directory not empty"): the removal is retried briefly (the last try's error stands).
    steps.append(
        f"for _ in 1 2 3 4; do rm -rf {TESTS_DIR} {VERIFIER_LOGS_DIR} 2>/dev/null && break; "
        "sleep 0.25; done\n"
        f"rm -rf {TESTS_DIR} {VERIFIER_LOGS_DIR} && mkdir -p {TESTS_DIR} {VERIFIER_LOGS_DIR} "
        f"&& chmod 0777 {VERIFIER_LOGS_DIR}"
    )
    return _sh("\n".join(steps), "empty /tests and /logs/verifier")


def verifier_spec(task: HarborTask, *, workdir: str, timeout: float | None = None) -> ExecSpec:
    """``bash /tests/test.sh`` under the contract (output to ``/logs/verifier/test-stdout.txt``)."""
    env = {"TEST_DIR": TESTS_DIR, **task.verifier_env}
    return ExecSpec(
        ("bash", "-c", f"bash {TESTS_DIR}/test.sh > {TEST_STDOUT} 2>&1"),
        user=task.verifier_user,
        env=env,
        cwd=workdir,
        timeout=timeout if timeout is not None else task.verifier_timeout_sec,
        what="tests/test.sh",
    )


# --------------------------------------------------------------------------- reward files


@dataclass(frozen=True, slots=True)
class RewardReading:
    """What the reward files said.

    Attributes:
        reward: The reward, or None when the verifier produced none that can be read.
        metrics: Every numeric field of ``reward.json`` (``{"reward": r}`` for reward.txt).
        source: ``"reward.json"``, ``"reward.txt"`` or None.
        error: Why there is no reward (None when there is one).
    """

    reward: float | None
    metrics: Mapping[str, float] = field(default_factory=dict)
    source: str | None = None
    error: str | None = None


def _show(data: bytes, limit: int = 80) -> str:
    text = data[:limit].decode("utf-8", "replace")
    return repr(text) + ("..." if len(data) > limit else "")


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _parse_txt(data: bytes) -> tuple[float | None, str | None]:
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return None, "reward.txt is empty"
    try:
        number = float(text)
    except ValueError:
        return None, f"reward.txt is not a number: {_show(data)}"
    if not math.isfinite(number):
        return None, f"reward.txt is not a finite number: {_show(data)}"
    return number, None


def read_reward(reward_txt: bytes | None, reward_json: bytes | None) -> RewardReading:
    """Score a trial from the contents of its reward files (None: the file does not exist).

    Never raises: an unreadable file is a :class:`RewardReading` with ``error`` set.
    """
    if reward_json is not None:
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
                None,
                source="reward.json",
                error=f"reward.json is not an object: {_show(reward_json)}",
            )
        metrics = {
            str(k): v for k, v in ((k, _finite(v)) for k, v in parsed.items()) if v is not None
        }
        if "reward" in metrics:
            return RewardReading(metrics["reward"], metrics, "reward.json")
        if reward_txt is not None:
            number, _ = _parse_txt(reward_txt)
            if number is not None:
                return RewardReading(number, {**metrics, "reward": number}, "reward.json")
        if metrics:
            return RewardReading(next(iter(metrics.values())), metrics, "reward.json")
        return RewardReading(
            None,
            source="reward.json",
            error=f"reward.json has no numeric value: {_show(reward_json)}",
        )
    if reward_txt is not None:
        number, error = _parse_txt(reward_txt)
        if number is None:
            return RewardReading(None, source="reward.txt", error=error)
        return RewardReading(number, {"reward": number}, "reward.txt")
    return RewardReading(None, error=f"the verifier wrote no {REWARD_TXT} or {REWARD_JSON}")


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

    The verifier decides the reward; the exit code of ``test.sh`` plays no part. A verifier
    failure outranks an agent timeout in the status (there is no reward to qualify).
    """
    if verifier_timed_out:
        return "verifier", None, f"tests/test.sh timed out after {verifier_timeout:g} s"
    if reading is None or reading.reward is None:
        error = reading.error if reading is not None else "the reward files could not be read"
        return "verifier", None, error
    if agent != "ok":
        return agent, reading.reward, None
    return "ok", reading.reward, None
