"""One Harbor trial (agent phase + the verifier contract) over any sandbox.

:func:`run_trial` is the async shell around :mod:`.contract`'s decisions. It talks to the
task's container only through :class:`TrialSandbox` — run a command, copy a folder in, read
a file back — so the same trial runs on the docker CLI (``scripts/terminalbench/check_tasks.py``)
today and on the project's sandbox backends later.

The agent phase here is ``oracle`` or ``null`` (or a caller's coroutine): the model agent is
the environment's job (it runs the agent loop on the same sandbox, then calls
:func:`verify`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio

from hermes_async.envs.terminalbench.contract import (
    MAX_REWARD_FILE_BYTES,
    MAX_STDOUT_BYTES,
    ORACLE_STDOUT,
    REWARD_JSON,
    REWARD_TXT,
    SOLUTION_DIR,
    TEST_STDOUT,
    TESTS_DIR,
    AgentKind,
    ExecSpec,
    RewardReading,
    TrialStatus,
    agent_status,
    agent_timeout,
    collect_spec,
    oracle_spec,
    prepare_solution_spec,
    prepare_verifier_spec,
    read_reward,
    readable_spec,
    setup_spec,
    trial_status,
    verifier_spec,
    workdir_for,
)
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.errors import ConfigError, SandboxError

__all__ = (
    "ExecResult",
    "TrialResult",
    "TrialSandbox",
    "VerifierResult",
    "format_pass_table",
    "run_agent_phase",
    "run_trial",
    "verify",
)


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What a command in the container did.

    Attributes:
        exit_code: Its exit status (None when it timed out).
        timed_out: It was stopped at ``ExecSpec.timeout``.
        output: Its combined output, as much as the sandbox kept (the tail).
    """

    exit_code: int | None
    timed_out: bool = False
    output: str = ""


class TrialSandbox(Protocol):
    """The three things a trial needs from the task's container.

    Implementations bound every call by its own deadline (``spec.timeout`` for
    :meth:`exec`) and raise :class:`~hermes_async.errors.SandboxError` when the container
    itself fails (not when a command exits non-zero: that is an :class:`ExecResult`).
    """

    @property
    def image_workdir(self) -> str | None:
        """The image's ``WORKDIR`` (None or ``""``: none set)."""
        ...

    async def exec(self, spec: ExecSpec) -> ExecResult:
        """Run ``spec`` in the container and wait for it, at most ``spec.timeout`` seconds.

        **Cancellation**: the wait ends; whether the command is stopped is the sandbox's
        choice (the container's removal ends it at the latest).
        """
        ...

    async def upload_dir(self, source: Path, target: str) -> None:
        """Copy the *contents* of the host folder ``source`` into ``target`` (which exists).

        **Cancellation**: the copy may be left partial.
        """
        ...

    async def read_file(self, path: str, *, max_bytes: int, tail: bool = False) -> bytes | None:
        """The file's first (``tail``: last) ``max_bytes`` bytes; None when it does not exist.

        **Cancellation**: nothing to clean up.
        """
        ...


@dataclass(frozen=True, slots=True)
class VerifierResult:
    """The verifier phase.

    Attributes:
        reading: What the reward files said (None when the verifier timed out).
        timed_out: ``test.sh`` ran past ``[verifier].timeout_sec``.
        exit_code: ``test.sh``'s exit status (recorded, never used for the reward).
        stdout: Its output (the tail of ``/logs/verifier/test-stdout.txt``).
        seconds: Wall time of the phase (prepare, upload, run, read).
    """

    reading: RewardReading | None
    timed_out: bool
    exit_code: int | None
    stdout: str
    seconds: float


@dataclass(frozen=True, slots=True)
class TrialResult:
    """One task's trial.

    Attributes:
        task: The task's name.
        category: Its category.
        agent: What ran in the agent's place.
        status: ``ok`` or a failure category (``verifier``, ``agent_timeout``, ``infra``).
        reward: The verifier's reward, None when there is none.
        error: What went wrong, when ``status`` is not ``ok``.
        metrics: The reward file's numeric fields.
        agent_seconds: Wall time of the agent phase.
        verifier_seconds: Wall time of the verifier phase.
        agent_exit_code: The oracle's exit status (None for ``null`` or a timeout).
        verifier_exit_code: ``test.sh``'s exit status.
        verifier_stdout: The tail of the test script's output.
        agent_output: The tail of the oracle's output.
    """

    task: str
    category: str
    agent: AgentKind
    status: TrialStatus
    reward: float | None
    error: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    agent_seconds: float = 0.0
    verifier_seconds: float = 0.0
    agent_exit_code: int | None = None
    verifier_exit_code: int | None = None
    verifier_stdout: str = ""
    agent_output: str = ""

    @classmethod
    def infra(
        cls, task: HarborTask, agent: AgentKind, error: str, *, agent_seconds: float = 0.0
    ) -> TrialResult:
        """A trial the infrastructure failed (no sandbox, a lost sandbox): no reward."""
        return cls(
            task=task.name,
            category=task.category,
            agent=agent,
            status="infra",
            reward=None,
            error=error,
            agent_seconds=agent_seconds,
        )

    @classmethod
    def graded(
        cls,
        task: HarborTask,
        agent: AgentKind,
        agent_status: TrialStatus,
        verified: VerifierResult,
        *,
        agent_seconds: float,
        agent_timeout_error: str | None,
        agent_exit_code: int | None = None,
        agent_output: str = "",
    ) -> TrialResult:
        """The trial the verifier graded (:func:`trial_status` decides status and reward);
        ``agent_timeout_error`` is its error when the agent ran out of time."""
        status, reward, error = trial_status(
            agent=agent_status,
            verifier_timed_out=verified.timed_out,
            verifier_timeout=task.verifier_timeout_sec,
            reading=verified.reading,
        )
        if status == "agent_timeout":
            error = agent_timeout_error
        return cls(
            task=task.name,
            category=task.category,
            agent=agent,
            status=status,
            reward=reward,
            error=error,
            metrics=dict(verified.reading.metrics) if verified.reading is not None else {},
            agent_seconds=agent_seconds,
            verifier_seconds=verified.seconds,
            agent_exit_code=agent_exit_code,
            verifier_exit_code=verified.exit_code,
            verifier_stdout=verified.stdout,
            agent_output=agent_output,
        )


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace")


async def _tail(sandbox: TrialSandbox, path: str) -> str:
    # A test runner prints its summary last: keep the end of a long output.
    return _decode(await sandbox.read_file(path, max_bytes=MAX_STDOUT_BYTES, tail=True))


async def _checked(sandbox: TrialSandbox, spec: ExecSpec) -> ExecResult:
    """Run a bookkeeping step that must succeed; its failure is the sandbox's (``infra``)."""
    result = await sandbox.exec(spec)
    if result.timed_out or result.exit_code != 0:
        state = "timed out" if result.timed_out else f"exited {result.exit_code}"
        raise SandboxError(f"{spec.what} {state} in the task container: {result.output[-500:]!r}")
    return result


async def run_agent_phase(
    task: HarborTask,
    sandbox: TrialSandbox,
    *,
    agent: AgentKind,
    timeout_multiplier: float = 1.0,
) -> tuple[TrialStatus, int | None, str]:
    """Set up ``/logs``, then run the oracle (or nothing for ``null``).

    Returns:
        ``(status, exit_code, output)``: ``agent_timeout`` when the oracle ran past its
        deadline; the oracle's exit status (not used for scoring); its output.

    Raises:
        ConfigError: ``oracle`` for a task without ``solution/solve.sh``, or ``model`` (the
            environment runs the model itself).
        SandboxError: A bookkeeping step failed in the container.

    **Cancellation**: the running command is abandoned (the sandbox's exec decides how it
    is stopped); nothing is left for this function to clean up.
    """
    await _checked(sandbox, setup_spec())
    if agent == "null":
        return "ok", None, ""
    if agent != "oracle":
        raise ConfigError(f"run_agent_phase runs 'oracle' or 'null', got {agent!r}")
    if task.solution_dir is None:
        raise ConfigError(f"task {task.name!r} has no solution/solve.sh: it cannot run as oracle")
    workdir = workdir_for(task, sandbox.image_workdir)
    await _checked(sandbox, prepare_solution_spec())
    await sandbox.upload_dir(task.solution_dir, SOLUTION_DIR)
    await _checked(sandbox, readable_spec(SOLUTION_DIR))
    spec = oracle_spec(task, workdir=workdir, timeout=agent_timeout(task, timeout_multiplier))
    result = await sandbox.exec(spec)
    output = await _tail(sandbox, ORACLE_STDOUT)
    return agent_status(kind=agent, timed_out=result.timed_out), result.exit_code, output


async def verify(
    task: HarborTask,
    sandbox: TrialSandbox,
    *,
    stop_agent_processes: bool = True,
) -> VerifierResult:
    """The verifier contract: collect hooks, hygiene, upload ``tests/``, run, read the reward.

    Raises:
        SandboxError: A bookkeeping step (prepare, upload) failed — an ``infra`` failure,
            not the verifier's.

    **Cancellation**: the running ``test.sh`` is abandoned; nothing is left for this function
    to clean up (the container's owner tears it down).
    """
    started = time.monotonic()
    workdir = workdir_for(task, sandbox.image_workdir)
    for index in range(len(task.collect)):
        # Best effort (the contract): a failing hook is recorded in its output, no more.
        await sandbox.exec(collect_spec(task, index, workdir=workdir))
    await _checked(sandbox, prepare_verifier_spec(stop_agent_processes=stop_agent_processes))
    await sandbox.upload_dir(task.tests_dir, TESTS_DIR)
    await _checked(sandbox, readable_spec(TESTS_DIR))
    result = await sandbox.exec(verifier_spec(task, workdir=workdir))
    stdout = await _tail(sandbox, TEST_STDOUT)
    reading = None
    if not result.timed_out:
        reward_txt = await sandbox.read_file(REWARD_TXT, max_bytes=MAX_REWARD_FILE_BYTES)
        reward_json = await sandbox.read_file(REWARD_JSON, max_bytes=MAX_REWARD_FILE_BYTES)
        reading = read_reward(reward_txt, reward_json)
    return VerifierResult(
        reading=reading,
        timed_out=result.timed_out,
        exit_code=result.exit_code,
        stdout=stdout,
        seconds=time.monotonic() - started,
    )


async def run_trial(
    task: HarborTask,
    sandbox: TrialSandbox,
    *,
    agent: AgentKind = "oracle",
    timeout_multiplier: float = 1.0,
    agent_fn: Callable[[HarborTask, TrialSandbox], Awaitable[None]] | None = None,
) -> TrialResult:
    """Run the agent phase (``oracle``/``null``, or ``agent_fn``) and grade it.

    Args:
        task: The task.
        sandbox: Its running container (fresh: one trial per container).
        agent: ``"oracle"`` or ``"null"``; with ``agent_fn``, the label to record.
        timeout_multiplier: Scales ``[agent].timeout_sec``.
        agent_fn: A coroutine to run as the agent instead (bounded by the agent deadline).

    Returns:
        The trial. A container failure is a result with status ``infra`` (not an exception),
        so one broken task does not stop a pass over many.

    **Cancellation**: propagates; the result is lost and the caller's sandbox owner cleans up.
    """
    started = time.monotonic()
    try:
        if agent_fn is None:
            status, exit_code, output = await run_agent_phase(
                task, sandbox, agent=agent, timeout_multiplier=timeout_multiplier
            )
        else:
            await _checked(sandbox, setup_spec())
            status, exit_code, output = "ok", None, ""
            with anyio.move_on_after(agent_timeout(task, timeout_multiplier)) as scope:
                await agent_fn(task, sandbox)
            if scope.cancelled_caught:
                status = "agent_timeout"
        agent_seconds = time.monotonic() - started
        verified = await verify(task, sandbox)
    except SandboxError as exc:
        return TrialResult.infra(task, agent, str(exc), agent_seconds=time.monotonic() - started)
    return TrialResult.graded(
        task,
        agent,
        status,
        verified,
        agent_seconds=agent_seconds,
        agent_timeout_error=f"the agent ran past {agent_timeout(task, timeout_multiplier):g} s",
        agent_exit_code=exit_code,
        agent_output=output,
    )


def format_pass_table(
    results: Sequence[TrialResult], *, notes: Sequence[str | None] | None = None
) -> str:
    """A plain-text table, one line per trial, then a pass line per agent kind.

    A trial passes when its status is ``ok`` and its reward is 1.0. ``notes`` (one per
    result) replaces the note column (default: the error).
    """
    header = ("task", "agent", "status", "reward", "agent s", "verifier s", "note")
    rows = [
        (
            r.task,
            r.agent,
            r.status,
            "null" if r.reward is None else f"{r.reward:g}",
            f"{r.agent_seconds:.1f}",
            f"{r.verifier_seconds:.1f}",
            ((notes[i] if notes is not None else r.error) or "")[:70],
        )
        for i, r in enumerate(results)
    ]
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]
    for kind in dict.fromkeys(r.agent for r in results):
        mine = [r for r in results if r.agent == kind]
        passed = sum(1 for r in mine if r.status == "ok" and r.reward == 1.0)
        rewards = [r.reward for r in mine if r.reward is not None]
        mean = sum(rewards) / len(rewards) if rewards else float("nan")
        lines.append(
            f"{kind}: {passed}/{len(mine)} passed (reward 1.0, status ok), "
            f"mean reward {mean:.3g}, {len(mine) - len(rewards)} without a reward"
        )
    return "\n".join(lines)
