"""The compute behind one sandbox of the E2B and Daytona doubles: local processes, host files.

Commands run as host subprocesses carrying a marker variable, so :meth:`LocalMachine.destroy`
kills all of them, like a provider ending the VM. Give the sandboxes a temporary ``workdir``.
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
    """Faults injected per operation name: ``hang`` waits forever, ``fail`` raises."""

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
    """One double sandbox's processes."""

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
    """Kill every process carrying ``marker`` at once and reap ``processes`` (shielded, bounded)."""
    with cleanup_scope(f"kill the processes of {name}", seconds, reason=reason):
        survivors = await terminate_members(
            sweeper, marker, (), grace=0.0, kill_wait=seconds / 2, graceful=False
        )
        if survivors:
            logger.warning("%s: %s survived SIGKILL", name, survivors)
        for process in processes:
            await process.aclose()


async def delay(value: _CreateDelay) -> None:
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
    """What both doubles' providers share: faults, create latency, counters, machines, books.

    A double sets up its books (``sandboxes``: id -> record) in :meth:`_open`.

    Args:
        hang: Operation names whose calls never return.
        fail: Operation name -> exception its calls raise.
        create_delay_seconds: Each create's latency (a number, or a function per create).
        extra_env: Variables every command sees (besides PATH, HOME, LANG).
        workdir: Where commands start when no ``cwd`` is given.

    Attributes:
        max_creates_in_flight: The most create calls seen at once.
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
        """One create: the sandbox exists at once and its id comes after the latency.

        Past ``timeout`` the SDK gives up and the sandbox stays; a ``fail`` registers nothing.
        """
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
