"""One Harbor trial (agent phase + the verifier contract) on a project :class:`Sandbox`.

:func:`run_trial` is the async shell around :mod:`.contract`'s steps; the sandbox is the very
one the model used (any backend that can run a command as another user: Docker, the fake).
Files go in with :meth:`Sandbox.put_tree` and come back bounded (``head``/``tail`` as root).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

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
    RewardReading,
    Step,
    TrialStatus,
    agent_status,
    agent_timeout,
    collect_spec,
    oracle_spec,
    parse_pids,
    prepare_solution_spec,
    prepare_verifier_spec,
    read_reward,
    read_spec,
    readable_spec,
    setup_spec,
    trial_status,
    verifier_spec,
    workdir_for,
)
from hermes_async.envs.terminalbench.files import TaskError
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox.base import ExecResult, Sandbox

__all__ = (
    "AgentFn",
    "TrialResult",
    "VerifierResult",
    "read_file",
    "run_agent_phase",
    "run_trial",
    "verify",
)

#: ``async (task, sandbox) -> None``: an agent run in the agent phase (the model's loop, a test's).
AgentFn = Callable[[HarborTask, Sandbox], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class VerifierResult:
    """The verifier phase; ``exit_code`` is recorded, never used for the reward."""

    reading: RewardReading | None
    timed_out: bool
    exit_code: int | None
    stdout: str
    seconds: float


@dataclass(frozen=True, slots=True)
class TrialResult:
    """One trial of a task.

    Attributes:
        status: ``ok`` or a failure category (:data:`~.contract.TrialStatus`).
        agent_exit_code: The oracle's exit status (None for ``null`` or a timeout).
        attempt: 0-based.
        notes: How it ran: values clamped, a stand-in image, a network-needing task run anyway.
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
    attempt: int = 0
    notes: tuple[str, ...] = ()

    @classmethod
    def failed(
        cls,
        task: HarborTask,
        agent: AgentKind,
        status: TrialStatus,
        error: str,
        *,
        agent_seconds: float = 0.0,
    ) -> TrialResult:
        """A trial that ended before grading (``infra``, ``task_invalid``, ...): no reward."""
        return cls(
            task=task.name,
            category=task.category,
            agent=agent,
            status=status,
            reward=None,
            error=error,
            agent_seconds=agent_seconds,
            notes=_notes(task),
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
        """The trial the verifier graded; :func:`~.contract.trial_status` decides status and reward."""
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
            notes=_notes(task),
        )

    def with_notes(self, *notes: str, attempt: int | None = None) -> TrialResult:
        """This result with more notes (and its attempt number)."""
        return replace(
            self,
            notes=(*self.notes, *notes),
            attempt=self.attempt if attempt is None else attempt,
        )


def _notes(task: HarborTask) -> tuple[str, ...]:
    return tuple(f"clamped {note}" for note in task.clamped)


async def _run(sandbox: Sandbox, step: Step) -> ExecResult:
    request = step.request
    return await sandbox.exec(
        request.command,
        cwd=request.cwd,
        env=request.env,
        timeout=request.timeout,
        output_limit=request.output_limit,
        user=request.user,
    )


async def _checked(sandbox: Sandbox, step: Step) -> ExecResult:
    """Run a bookkeeping step that must succeed; its failure is the sandbox's (``infra``)."""
    result = await _run(sandbox, step)
    if result.timed_out or result.exit_code != 0:
        state = "timed out" if result.timed_out else f"exited {result.exit_code}"
        raise SandboxError(f"{step.what} {state} in the task container: {result.output[-500:]!r}")
    return result


async def read_file(
    sandbox: Sandbox, path: str, *, max_bytes: int, tail: bool = False
) -> bytes | None:
    """The first (``tail``: last) ``max_bytes`` of ``path``, read as root; None if not a file.

    Raises:
        SandboxError: The read failed.

    **Cancellation**: the read's process group is killed.
    """
    step = read_spec(path, max_bytes=max_bytes, tail=tail)
    result = await _run(sandbox, step)
    if result.exit_code == 3 and not result.stdout:
        return None
    if result.timed_out or result.exit_code != 0:
        raise SandboxError(
            f"cannot read {path} in the task's sandbox (exit {result.exit_code}): "
            f"{result.stderr.strip()[-300:]}"
        )
    return (
        result.stdout.encode("utf-8")[-max_bytes:] if tail else result.stdout.encode()[:max_bytes]
    )


async def _tail(sandbox: Sandbox, path: str) -> str:
    # A test runner prints its summary last: keep the end of a long output.
    data = await read_file(sandbox, path, max_bytes=MAX_STDOUT_BYTES, tail=True)
    return (data or b"").decode("utf-8", "replace")


async def _upload(sandbox: Sandbox, source: Path, target: str) -> None:
    try:
        await sandbox.put_tree(target, source)
    except ValueError as exc:  # a member the archive rules refuse (checked at load time too)
        raise SandboxError(f"cannot upload {source} to {target}: {exc}") from exc
    await _checked(sandbox, readable_spec(target))


async def run_agent_phase(
    task: HarborTask,
    sandbox: Sandbox,
    *,
    agent: AgentKind,
    timeout_multiplier: float = 1.0,
) -> tuple[TrialStatus, int | None, str, frozenset[int]]:
    """Set up ``/logs``, then run the oracle (or nothing for ``null``).

    Returns:
        ``(status, exit_code, output, before)``; ``before``: processes from before the agent.

    Raises:
        TaskError: ``oracle`` for a task without ``solution/solve.sh``.
        ValueError: ``agent`` is ``model`` (the environment runs the model itself).
        SandboxError: A bookkeeping step failed in the container.

    **Cancellation**: the running command's process group is killed by the sandbox.
    """
    if agent not in ("oracle", "null"):
        raise ValueError(f"run_agent_phase runs 'oracle' or 'null', got {agent!r}")
    if agent == "oracle" and task.solution_dir is None:
        raise TaskError(task.name, "no solution/solve.sh: it cannot run as oracle")
    before = parse_pids((await _checked(sandbox, setup_spec())).stdout)
    if agent == "null" or task.solution_dir is None:
        return "ok", None, "", before
    workdir = workdir_for(task, sandbox.workdir)
    await _checked(sandbox, prepare_solution_spec())
    await _upload(sandbox, task.solution_dir, SOLUTION_DIR)
    spec = oracle_spec(task, workdir=workdir, timeout=agent_timeout(task, timeout_multiplier))
    result = await _run(sandbox, spec)
    output = await _tail(sandbox, ORACLE_STDOUT)
    exit_code = None if result.timed_out else result.exit_code
    return agent_status(kind=agent, timed_out=result.timed_out), exit_code, output, before


async def verify(
    task: HarborTask,
    sandbox: Sandbox,
    *,
    stop_agent_processes: bool = True,
    keep: frozenset[int] = frozenset(),
) -> VerifierResult:
    """The verifier contract: collect hooks, hygiene, upload ``tests/``, run, read the reward.

    ``keep``: processes from before the agent (an entrypoint service) are not stopped.

    Raises:
        SandboxError: A bookkeeping step failed (``infra``, not the verifier's).

    **Cancellation**: the running ``test.sh`` is killed; the container's owner tears it down.
    """
    started = time.monotonic()
    workdir = workdir_for(task, sandbox.workdir)
    for index in range(len(task.collect)):
        # Best effort (the contract): a failing hook is recorded in its output, no more.
        await _run(sandbox, collect_spec(task, index, workdir=workdir))
    await _checked(
        sandbox, prepare_verifier_spec(stop_agent_processes=stop_agent_processes, keep=keep)
    )
    await _upload(sandbox, task.tests_dir, TESTS_DIR)
    result = await _run(sandbox, verifier_spec(task, workdir=workdir))
    stdout = await _tail(sandbox, TEST_STDOUT)
    reading = None
    if not result.timed_out:
        reward_txt = await read_file(sandbox, REWARD_TXT, max_bytes=MAX_REWARD_FILE_BYTES)
        reward_json = await read_file(sandbox, REWARD_JSON, max_bytes=MAX_REWARD_FILE_BYTES)
        reading = read_reward(reward_txt, reward_json)
    return VerifierResult(
        reading=reading,
        timed_out=result.timed_out,
        exit_code=None if result.timed_out else result.exit_code,
        stdout=stdout,
        seconds=time.monotonic() - started,
    )


async def run_trial(
    task: HarborTask,
    sandbox: Sandbox,
    *,
    agent: AgentKind = "oracle",
    timeout_multiplier: float = 1.0,
    agent_fn: AgentFn | None = None,
) -> TrialResult:
    """Run the agent phase (``oracle``/``null``, or ``agent_fn``) and grade it.

    ``sandbox`` is a fresh container: one trial per container. ``agent_fn`` runs as the
    agent, bounded by the agent deadline; ``agent`` is then its label.

    Returns:
        The trial. A container failure is ``infra`` and a missing ``solve.sh``
        ``task_invalid``: results, so one broken task does not stop a pass.

    **Cancellation**: propagates; the caller's sandbox owner cleans up.
    """
    started = time.monotonic()
    try:
        if agent_fn is None:
            status, exit_code, output, before = await run_agent_phase(
                task, sandbox, agent=agent, timeout_multiplier=timeout_multiplier
            )
        else:
            before = parse_pids((await _checked(sandbox, setup_spec())).stdout)
            status, exit_code, output = "ok", None, ""
            with anyio.move_on_after(agent_timeout(task, timeout_multiplier)) as scope:
                await agent_fn(task, sandbox)
            if scope.cancelled_caught:
                status = "agent_timeout"
        agent_seconds = time.monotonic() - started
        verified = await verify(task, sandbox, keep=before)
    except TaskError as exc:
        return TrialResult.failed(task, agent, "task_invalid", exc.reason)
    except SandboxError as exc:
        return TrialResult.failed(
            task, agent, "infra", str(exc), agent_seconds=time.monotonic() - started
        )
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
