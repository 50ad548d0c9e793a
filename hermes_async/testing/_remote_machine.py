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
import math
import os
import signal
import subprocess
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

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

__all__ = ("ControlPlane", "Faults", "LocalMachine", "delay")

_R = TypeVar("_R")
_Rec = TypeVar("_Rec", bound="SandboxRecord")

logger = logging.getLogger(__name__)

#: How long destroying a machine may take to kill its processes (the provider's side: it
#: completes whether or not the client waits, so it runs shielded).
_DESTROY_SECONDS = 10.0

#: Seconds each create takes: a number, or a function called per create (random latency).
_CreateDelay = float | Callable[[], float]


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
class _RunOutcome:
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
    ) -> _RunOutcome:
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
        return _RunOutcome(code, bytes(out), bytes(err))

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
        await kill_sandbox_processes(
            self.sweeper,
            self.marker,
            self.processes,
            f"remote double {self.sandbox_id}",
            reason="the sandbox was deleted",
        )


async def kill_sandbox_processes(
    sweeper: ProcessSweeper,
    marker: str,
    processes: Iterable[Process],
    name: str,
    *,
    reason: str,
    seconds: float = _DESTROY_SECONDS,
) -> None:
    """Kill every process carrying ``marker`` at once (no grace) and reap ``processes``:
    shielded and bounded by ``seconds``; survivors are logged under ``name``."""
    with cleanup_scope(f"kill the processes of {name}", seconds, reason=reason):
        survivors = await terminate_members(
            sweeper, marker, (), grace=0.0, kill_wait=seconds / 2, graceful=False
        )
        if survivors:
            logger.warning("%s: %s survived SIGKILL", name, survivors)
        for process in processes:
            await process.aclose()


async def delay(value: _CreateDelay) -> None:
    """Sleep for a create's latency."""
    seconds = value() if callable(value) else value
    if seconds > 0:
        await anyio.sleep(seconds)


class SandboxRecord(Protocol):
    """What the control plane needs of a double's record of one sandbox."""

    @property
    def sandbox_id(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    @property
    def machine(self) -> LocalMachine: ...


class ControlPlane(Generic[_Rec]):
    """What both doubles' providers share: faults, create latency, counters, machines, the
    books of sandboxes (``sandboxes``: id -> record). A double sets up its own books in
    :meth:`_open`, called at the end of ``__init__``.

    Args:
        hang: Operation names whose calls never return.
        fail: Operation name -> exception its calls raise.
        create_delay_seconds: Each create's latency (a number, or a function per create).
        extra_env: Variables every command sees (besides PATH, HOME, LANG).
        workdir: Where commands start when no ``cwd`` is given.

    Attributes:
        creates_in_flight: Create calls under way now.
        max_creates_in_flight: The most seen at once (for the backends' rate limiter).
        create_start_times: ``anyio.current_time()`` at each create call's start.
    """

    def __init__(
        self,
        *,
        hang: Collection[str] = (),
        fail: Mapping[str, BaseException] | None = None,
        create_delay_seconds: _CreateDelay = 0.0,
        extra_env: Mapping[str, str] | None = None,
        workdir: str = "/tmp",
    ) -> None:
        self.faults = Faults(hang, fail)
        self.create_delay_seconds = create_delay_seconds
        self.extra_env = dict(extra_env or {})
        self.workdir = workdir
        self.sweeper = ProcessSweeper()
        self.creates_in_flight = 0
        self.max_creates_in_flight = 0
        self.create_start_times: list[float] = []
        self.sandboxes: dict[str, _Rec] = {}
        self._open()

    def _open(self) -> None:
        """Set up the double's own books (a hook for subclasses)."""

    @property
    def live(self) -> list[_Rec]:
        """Sandboxes created and not deleted (the leak books)."""
        return [r for r in self.sandboxes.values() if r.alive]

    def _machine(self, sandbox_id: str, env: Mapping[str, str]) -> LocalMachine:
        return LocalMachine(sandbox_id, self.workdir, {**self.extra_env, **env}, self.sweeper)

    async def _creating(
        self,
        register: Callable[[], _R],
        timeout: float | None,
        timed_out: Callable[[], Exception],
    ) -> _R:
        """One create call: the provider makes the sandbox (``register``) at once, the id
        reaches the client after the latency; past ``timeout`` the SDK gives up with
        ``timed_out()`` and the sandbox stays. A ``fail`` fault registers nothing."""
        self.creates_in_flight += 1
        self.max_creates_in_flight = max(self.max_creates_in_flight, self.creates_in_flight)
        self.create_start_times.append(anyio.current_time())
        try:
            if "create" in self.faults.fail:
                raise self.faults.fail["create"]
            made = register()
            with anyio.move_on_after(timeout or math.inf) as scope:
                if "create" in self.faults.hang:
                    await anyio.sleep_forever()
                await delay(self.create_delay_seconds)
            if scope.cancelled_caught:
                raise timed_out()
            return made
        finally:
            self.creates_in_flight -= 1
