"""The compute behind one sandbox of the E2B and Daytona doubles: local processes, host files.

Each double sandbox is a :class:`LocalMachine`: its commands run as subprocesses of this host
(process isolation only: the host filesystem, a minimal environment), every one carrying a
marker variable so :meth:`LocalMachine.destroy` kills all of them, the detached ones included,
like a provider ending the VM. So the backends' process-group wrapper, timeouts, kills and
background processes are exercised for real. Give the sandboxes a temporary ``workdir``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import anyio
from anyio.abc import Process

from hermes_async._cleanup import cleanup_scope
from hermes_async.tools.sandbox.host import start_process
from hermes_async.tools.sandbox.processes import (
    SANDBOX_MARKER_ENV,
    ProcessSweeper,
    find_sandbox_processes,
    terminate_members,
)

__all__ = ("CreateDelay", "Faults", "LocalMachine", "RunOutcome", "delay")

logger = logging.getLogger(__name__)

#: How long destroying a machine may take to kill its processes (the provider's side: it
#: completes whether or not the client waits, so it runs shielded).
_DESTROY_SECONDS = 10.0

#: Seconds each create takes: a number, or a function called per create (random latency).
CreateDelay = float | Callable[[], float]


class Faults:
    """Faults injected per operation name: ``hang`` waits forever, ``fail`` raises.

    Args:
        hang: Operation names whose calls never return.
        fail: Operation name -> exception its calls raise.
    """

    def __init__(
        self, hang: Collection[str] = (), fail: Mapping[str, BaseException] | None = None
    ) -> None:
        self.hang = set(hang)
        self.fail = dict(fail or {})

    async def check(self, op: str) -> None:
        """Apply the faults of ``op`` (raise or hang), else return at once."""
        if op in self.fail:
            raise self.fail[op]
        if op in self.hang:
            await anyio.sleep_forever()


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one command did: exit code (``None``: killed by the timeout) and its output."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes


@dataclass
class LocalMachine:
    """One double sandbox's processes (see the module docstring)."""

    sandbox_id: str
    workdir: str
    env: Mapping[str, str]
    sweeper: ProcessSweeper
    processes: list[Process] = field(default_factory=list)
    destroyed: bool = False

    @property
    def marker(self) -> str:
        """The marker variable's value every process of this machine carries."""
        return f"remote-double-{self.sandbox_id}"

    def environment(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        """A command's environment: a minimal base, the sandbox's, the command's, the marker."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.workdir,
            "LANG": "C.UTF-8",
            **self.env,
            **(extra or {}),
            SANDBOX_MARKER_ENV: self.marker,
        }

    async def run(
        self,
        argv: list[str],
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        timeout: float | None,
        merge_stderr: bool = False,
    ) -> RunOutcome:
        """Run ``argv`` to completion (``timeout``: kill it, ``exit_code=None``).

        **Cancellation**: the process keeps running, as a provider's would when its client
        goes away; :meth:`destroy` kills it.
        """
        process = await start_process(
            argv,
            cwd=cwd or self.workdir,
            env=self.environment(env),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            start_new_session=True,
        )
        self.processes.append(process)
        out, err = bytearray(), bytearray()

        async def drain(stream: object, into: bytearray) -> None:
            if stream is None:
                return
            async for chunk in stream:  # type: ignore[attr-defined]
                into.extend(chunk)

        code: int | None = None
        with anyio.move_on_after(timeout if timeout else float("inf")):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain, process.stdout, out)
                tg.start_soon(drain, process.stderr, err)
            code = await process.wait()
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        return RunOutcome(code, bytes(out), bytes(err))

    def live_processes(self) -> list[int]:
        """Pids of live processes started in this machine."""
        return find_sandbox_processes(self.marker)

    async def destroy(self) -> None:
        """Kill every process of the machine (shielded, bounded). Idempotent."""
        if self.destroyed:
            return
        self.destroyed = True
        if not self.processes:
            return
        with cleanup_scope(
            f"destroy the remote double's sandbox {self.sandbox_id}",
            _DESTROY_SECONDS,
            reason="the sandbox was deleted",
        ):
            survivors = await terminate_members(
                self.sweeper,
                self.marker,
                (),
                grace=0.0,
                kill_wait=_DESTROY_SECONDS / 2,
                graceful=False,
            )
            if survivors:
                logger.warning("remote double %s: %s survived SIGKILL", self.sandbox_id, survivors)
            for process in self.processes:
                await process.aclose()


async def delay(value: CreateDelay) -> None:
    """Sleep for a create's latency."""
    seconds = value() if callable(value) else value
    if seconds > 0:
        await anyio.sleep(seconds)
