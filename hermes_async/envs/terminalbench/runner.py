"""A pass over Harbor tasks: every (task, attempt) a trial, contained, written as it finishes.

:func:`run_pass` is the one loop ``evaluate``, ``check_tasks.py`` and the benchmark share.
What needs no sandbox is decided first (``task_invalid``, ``needs_network``). Invariant: a
failing trial is that trial's row, never the pass's end; rows already in ``results.jsonl``
are not run again; Ctrl-C loses at most the trials in flight.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from hermes_async.envs.terminalbench.contract import VERIFIER_LOGS_DIR, AgentKind
from hermes_async.envs.terminalbench.images import (
    machine_cpus,
    offline_reasons,
    standin_notes,
    task_images,
    task_sandbox_spec,
)
from hermes_async.envs.terminalbench.job import JobWriter, trial_from_row, trial_key
from hermes_async.envs.terminalbench.report import atif_trajectory
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.envs.terminalbench.trial import TrialResult, run_trial
from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.manager import SandboxManager

__all__ = (
    "ImageProbe",
    "PassOptions",
    "TaskRun",
    "TrialFn",
    "run_pass",
    "scripted_trial",
    "verifier_archive",
)

logger = logging.getLogger(__name__)

#: ``/logs/verifier`` is copied to the host only up to this size (else just the stdout tail).
MAX_VERIFIER_COPY_BYTES = 16 * 1024 * 1024

#: ``async (images) -> {image: labels or None}``: what the engine has (``DockerBackend.image_labels``).
ImageProbe = Callable[[Sequence[str]], Awaitable[Mapping[str, Mapping[str, str] | None]]]


@dataclass(frozen=True, slots=True)
class PassOptions:
    """How a pass runs.

    Attributes:
        agent: ``model``, ``oracle`` or ``null``.
        attempts: Trials per task (pass@k up to k = attempts).
        network_tasks: ``skip`` makes a task that needs a missing network a
            ``needs_network`` row; ``run`` runs it on the configured network, and says so.
        build_network: Image builds reach a network, so installing packages is no reason to skip.
    """

    agent: AgentKind = "oracle"
    attempts: int = 1
    concurrency: int = 4
    timeout_multiplier: float = 1.0
    network_tasks: Literal["skip", "run"] = "skip"
    image_map: Mapping[str, str] = field(default_factory=dict)
    build_network: bool = False

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.concurrency < 1:
            raise ValueError(
                f"attempts and concurrency must be >= 1, got {self.attempts} and {self.concurrency}"
            )


@dataclass(frozen=True, slots=True)
class TaskRun:
    """One trial and what goes into its folder: ``messages`` (the conversation, or the oracle's
    prompt and output) and ``verifier_tar`` (``/logs/verifier``, when it could be copied).
    """

    trial: TrialResult
    messages: list[dict[str, Any]] = field(default_factory=list)
    verifier_tar: bytes | None = None


#: ``async (task, attempt, network) -> TaskRun``: one trial (the model's, or :func:`scripted_trial`).
TrialFn = Callable[[HarborTask, int, bool], Awaitable[TaskRun]]


async def verifier_archive(sandbox: Sandbox) -> bytes | None:
    """``/logs/verifier`` as a tar, when it is small enough to copy (else None).

    **Cancellation**: nothing to clean up.
    """
    probe = await sandbox.exec(f"du -sb {VERIFIER_LOGS_DIR} | cut -f1", timeout=60, user="root")
    try:
        size = int(probe.stdout.strip() or "0")
    except ValueError:
        return None
    if probe.exit_code != 0 or size > MAX_VERIFIER_COPY_BYTES:
        return None
    try:
        return await sandbox.get_archive(VERIFIER_LOGS_DIR)
    except (OSError, SandboxError):
        return None


async def scripted_trial(
    task: HarborTask,
    *,
    manager: SandboxManager,
    options: PassOptions,
    network: bool,
) -> TaskRun:
    """One ``oracle`` / ``null`` trial in a fresh sandbox from ``manager``.

    **Cancellation**: the sandbox is released (interrupted); the cancellation propagates.
    """
    task_id = f"tb2-{task.name}-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    manager.assign_spec(
        task_id, task_sandbox_spec(task, network=network, image_map=options.image_map)
    )
    interrupted = False
    try:
        try:
            sandbox = await manager.get(task_id)
        except SandboxError as exc:
            failed = TrialResult.failed(
                task, options.agent, "infra", str(exc), agent_seconds=time.monotonic() - started
            )
            return TaskRun(failed)
        trial = await run_trial(
            task, sandbox, agent=options.agent, timeout_multiplier=options.timeout_multiplier
        )
        tar = await verifier_archive(sandbox) if trial.status not in ("infra",) else None
    except anyio.get_cancelled_exc_class():
        interrupted = True
        raise
    finally:
        await manager.release(task_id, interrupted=interrupted)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.instruction}]
    if options.agent == "oracle":
        messages.append({"role": "assistant", "content": trial.agent_output})
    return TaskRun(trial, messages, tar)


async def _probe(
    tasks: Sequence[HarborTask], probe: ImageProbe | None, image_map: Mapping[str, str]
) -> Mapping[str, Mapping[str, str] | None] | None:
    if probe is None:
        return None
    names = sorted({image for task in tasks for image in task_images(task, image_map)})
    return await probe(names)


async def run_pass(
    tasks: Sequence[HarborTask],
    trial_fn: TrialFn,
    *,
    options: PassOptions,
    writer: JobWriter | None = None,
    probe: ImageProbe | None = None,
    model_name: str | None = None,
    invalid: Sequence[tuple[str, str]] = (),
) -> list[TrialResult]:
    """Run ``options.attempts`` trials of every task; write each as it finishes.

    Args:
        trial_fn: Runs one trial (``network``: the container may have the network).
        probe: What images the engine has (None: unchecked; build failures are ``infra``).
        invalid: ``(name, reason)`` of tasks the loader refused: each a ``task_invalid`` row.

    Returns:
        Every trial, resumed ones included, in task then attempt order, then refused rows.

    **Cancellation**: running trials are cancelled; every finished one is already written.
    """
    present = await _probe(tasks, probe, options.image_map)
    done = {row["item_key"]: row for row in writer.rows} if writer is not None else {}
    slots = [(task, attempt) for task in tasks for attempt in range(options.attempts)]
    results: dict[tuple[str, int], TrialResult] = {}
    limiter = anyio.CapacityLimiter(options.concurrency)

    async def one(task: HarborTask, attempt: int) -> None:
        started_wall = time.time()
        run = await _contained(task, attempt)
        trial = run.trial.with_notes(attempt=attempt)
        if present is not None:
            trial = trial.with_notes(*standin_notes(task, present, options.image_map))
        results[(task.name, attempt)] = trial
        if writer is not None:
            writer.write_trial(
                trial,
                started=started_wall,
                finished=time.time(),
                trajectory=atif_trajectory(
                    run.messages,
                    session_id=f"{task.name}-{options.agent}-{attempt}",
                    agent_name=f"hermes_async-{options.agent}",
                    model_name=model_name,
                ),
                verifier_tar=run.verifier_tar,
                task_path=task.path,
            )

    async def _contained(task: HarborTask, attempt: int) -> TaskRun:
        if options.agent == "oracle" and task.solution_dir is None:
            return TaskRun(
                TrialResult.failed(
                    task, "oracle", "task_invalid", "no solution/solve.sh: no oracle to run"
                )
            )
        if present is None:
            reasons = task.network_reasons
        else:
            reasons = offline_reasons(
                task, present, options.image_map, build_network=options.build_network
            )
        network = False
        notes: tuple[str, ...] = ()
        cpus = machine_cpus(task)
        if cpus is not None and cpus != task.environment.cpus:
            notes += (f"cpus {task.environment.cpus:g} -> {cpus:g} (this machine's)",)
        if reasons:
            if options.network_tasks == "skip":
                return TaskRun(
                    TrialResult.failed(
                        task,
                        options.agent,
                        "needs_network",
                        "not run (--env.allow_network_tasks skip): " + "; ".join(reasons),
                    )
                )
            network = True
            notes += ("ran with allow_network_tasks=run: " + "; ".join(reasons),)
        async with limiter:
            try:
                run = await trial_fn(task, attempt, network)
            except Exception as exc:  # one trial's failure is its row, never the pass's end
                logger.exception("trial %s (attempt %d) failed", task.name, attempt)
                run = TaskRun(
                    TrialResult.failed(task, options.agent, "infra", f"{type(exc).__name__}: {exc}")
                )
        return TaskRun(run.trial.with_notes(*notes), run.messages, run.verifier_tar)

    refused = []
    for name, reason in invalid:
        key = trial_key(name, options.agent, 0)
        row = TrialResult(name, "invalid", options.agent, "task_invalid", None, error=reason)
        if key not in done and writer is not None:
            now = time.time()
            writer.write_trial(row, started=now, finished=now)
        refused.append(trial_from_row(done[key]) if key in done else row)
    async with anyio.create_task_group() as tg:
        for task, attempt in slots:
            key = trial_key(task.name, options.agent, attempt)
            if key in done:
                results[(task.name, attempt)] = trial_from_row(done[key])
                continue
            tg.start_soon(one, task, attempt, name=f"trial {task.name} #{attempt}")
    return [results[(t.name, a)] for t, a in slots if (t.name, a) in results] + refused
