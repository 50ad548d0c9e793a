"""Host processes of local sandboxes: who belongs to which sandbox, and killing them all.

The local backend (process isolation) cannot ask the kernel "everything in this sandbox": a
command may ``setsid`` out of its process group and session. So membership is read from
``/proc``: a process belongs to a sandbox if its environment carries the sandbox's marker
variable (:data:`SANDBOX_MARKER_ENV`), or if it sits in one of the sandbox's tracked sessions
*and* that session still holds a marked process (a session id reused by an unrelated process
after a long run is never mistaken for ours). :class:`ProcessTable` is one snapshot of
``/proc``; :meth:`ProcessTable.members` applies the rule to it (pure, no I/O).

Cost, and why a sweep is shared. Reading ``/proc/<pid>/stat`` and ``/proc/<pid>/environ`` costs
about 23 µs per host process, so a snapshot of a host running 2,000 processes is ~50 ms of CPU.
The close of one sandbox needs a few snapshots (find, signal, confirm). Done per sandbox and
synchronously, closing 500 sandboxes at once blocked the event loop for over a minute, in
stalls of ~50 ms each. Two changes make it cheap:

* **One sweep serves every closer** (:class:`ProcessSweeper`): a sandbox asks for a snapshot
  taken entirely *after* its request (so it sees the effect of the signals it just sent);
  every request that arrives while a sweep runs is served by the next sweep, together. 500
  sandboxes closing at once cost a handful of sweeps, not 1,500.
* **A sweep yields to the event loop** every :data:`SWEEP_SLICE_SECONDS` of work, so no other
  task waits longer than that for it (plain ``await`` checkpoints, no thread).

Signals are sent only to processes found in the snapshot, after re-reading the process's
``stat`` and checking that its start time (and group) are still the ones seen: a pid that died
and was reused by an unrelated process between the sweep and the signal is left alone.

The namespaced local backend (issue #15) puts each sandbox in its own PID namespace and will not
need any of this; the process mode keeps it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import anyio
import anyio.lowlevel

__all__ = (
    "SANDBOX_MARKER_ENV",
    "SWEEP_SLICE_SECONDS",
    "ProcessEntry",
    "ProcessSweeper",
    "ProcessTable",
    "SweeperStatistics",
    "find_sandbox_processes",
    "group_alive",
    "read_process_table",
    "signal_group",
    "sweep_process_table",
    "terminate_members",
)

#: Environment variable carrying the sandbox id into every process it starts; ``aclose`` uses it
#: to find processes that left the sandbox's sessions (``setsid``). Not a secret.
SANDBOX_MARKER_ENV = "HERMES_ASYNC_SANDBOX"

#: Longest stretch of ``/proc`` reading between two yields to the event loop (2 ms: a tenth of
#: the 20 ms lag budget, and ~90 processes read per slice).
SWEEP_SLICE_SECONDS = 0.002

#: Pause between kill rounds (a SIGKILL takes a moment to land on a busy machine).
_ROUND_PAUSE_SECONDS = 0.02

_MARKER_KEY = f"{SANDBOX_MARKER_ENV}=".encode()
_DEAD_STATES = ("Z", "X")


@dataclass(frozen=True, slots=True)
class ProcessEntry:
    """One live host process as a sweep saw it.

    Attributes:
        pid: Process id.
        state: Kernel state letter (``R``, ``S``, ``Z``, ...).
        pgrp: Process group id.
        session: Session id.
        start_ticks: Start time in clock ticks since boot (tells a reused pid apart).
        markers: Values of :data:`SANDBOX_MARKER_ENV` in its environment (usually 0 or 1).
    """

    pid: int
    state: str
    pgrp: int
    session: int
    start_ticks: int
    markers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessTable:
    """A snapshot of the host's live (non-zombie) processes, this process excluded."""

    entries: tuple[ProcessEntry, ...]

    def members(
        self,
        marker: str | None = None,
        sessions: Iterable[int] = (),
        *,
        marker_prefix: bool = False,
    ) -> list[ProcessEntry]:
        """The entries that belong to a sandbox (see the module docstring for the rule).

        Args:
            marker: The sandbox's marker value; ``None``: only ``sessions`` count.
            sessions: Session ids the sandbox started (exec shells, background wrappers).
            marker_prefix: Match marker values that start with ``marker``.
        """
        wanted = set(sessions)
        marked: list[ProcessEntry] = []
        by_session: list[ProcessEntry] = []
        confirmed: set[int] = set()
        for entry in self.entries:
            if marker is not None and any(
                m == marker or (marker_prefix and m.startswith(marker)) for m in entry.markers
            ):
                marked.append(entry)
                confirmed.add(entry.session)
            elif entry.session in wanted:
                by_session.append(entry)
        if marker is None:
            return by_session
        return marked + [e for e in by_session if e.session in confirmed]


def _read_stat(pid: str) -> tuple[str, int, int, int] | None:
    """``(state, pgrp, session, start_ticks)`` of ``pid``, or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[2]), int(fields[3]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _markers(environ: bytes) -> tuple[str, ...]:
    """Every value of the marker variable in a NUL-separated environment block."""
    return tuple(
        item[len(_MARKER_KEY) :].decode(errors="replace")
        for item in environ.split(b"\0")
        if item.startswith(_MARKER_KEY)
    )


def _read_entry(name: str) -> ProcessEntry | None:
    stat = _read_stat(name)
    if stat is None or stat[0] in _DEAD_STATES:
        return None
    try:
        with open(f"/proc/{name}/environ", "rb") as f:
            environ = f.read()
    except OSError:  # gone, or another user's process (not ours either way)
        environ = b""
    markers = _markers(environ) if _MARKER_KEY in environ else ()
    return ProcessEntry(int(name), stat[0], stat[1], stat[2], stat[3], markers)


def _proc_names() -> Iterator[str]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    me = str(os.getpid())
    for name in names:
        if name.isdigit() and name != me:
            yield name


def read_process_table() -> ProcessTable:
    """A snapshot of ``/proc``, read synchronously (tests and one-off checks; see the sweeper)."""
    return ProcessTable(tuple(e for e in map(_read_entry, _proc_names()) if e is not None))


async def sweep_process_table(slice_seconds: float = SWEEP_SLICE_SECONDS) -> ProcessTable:
    """A snapshot of ``/proc`` that yields to the event loop every ``slice_seconds`` of work.

    **Cancellation**: abandoned at the next yield; nothing to clean up.
    """
    entries: list[ProcessEntry] = []
    budget_end = time.perf_counter() + slice_seconds
    for name in _proc_names():
        entry = _read_entry(name)
        if entry is not None:
            entries.append(entry)
        if time.perf_counter() >= budget_end:
            await anyio.lowlevel.checkpoint()
            budget_end = time.perf_counter() + slice_seconds
    return ProcessTable(tuple(entries))


def find_sandbox_processes(
    marker: str | None = None, sessions: Iterable[int] = (), *, marker_prefix: bool = False
) -> list[int]:
    """Pids of live processes that belong to a sandbox (synchronous, one full read of ``/proc``).

    See :meth:`ProcessTable.members` for the rule. For tests and diagnostics; closing sandboxes
    goes through a :class:`ProcessSweeper`.
    """
    table = read_process_table()
    return [e.pid for e in table.members(marker, sessions, marker_prefix=marker_prefix)]


@dataclass(frozen=True, slots=True)
class SweeperStatistics:
    """Counts of a :class:`ProcessSweeper`: snapshot requests and the sweeps that served them."""

    requests: int
    sweeps: int


class _Sweep:
    __slots__ = ("done", "table")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.table: ProcessTable | None = None


class ProcessSweeper:
    """Serve many concurrent snapshot requests with as few ``/proc`` sweeps as possible.

    A request is served by the first sweep that *starts* after it: if no sweep is running, the
    requester runs one at once; if one is running, the requester joins the next one (and the
    first to join runs it, once the current one is done). So at most two sweeps are ever in
    the picture, and everything that arrives during a sweep shares the next.

    One sweeper per ``local_factory`` (so one per ``SandboxManager``); a sandbox created on its
    own gets a private one.

    Args:
        slice_seconds: Work between yields to the event loop during a sweep.
    """

    def __init__(self, *, slice_seconds: float = SWEEP_SLICE_SECONDS) -> None:
        if not slice_seconds > 0:
            raise ValueError(f"slice_seconds must be > 0, got {slice_seconds!r}")
        self.slice_seconds = slice_seconds
        self._running: _Sweep | None = None
        self._next: _Sweep | None = None
        self._requests = 0
        self._sweeps = 0

    def statistics(self) -> SweeperStatistics:
        """How many snapshots were requested and how many sweeps served them."""
        return SweeperStatistics(self._requests, self._sweeps)

    async def snapshot(self) -> ProcessTable:
        """A :class:`ProcessTable` read entirely after this call began.

        **Cancellation**: a cancelled requester that was running a sweep hands over: the
        requests waiting on it start a new one.
        """
        self._requests += 1
        while True:
            sweep = self._next
            if sweep is not None:
                await sweep.done.wait()
                if sweep.table is not None:
                    return sweep.table
                continue  # the sweep's runner was cancelled: ask again
            sweep = self._next = _Sweep()
            try:
                while self._running is not None:
                    await self._running.done.wait()
                # From here on, new requests need the sweep after this one.
                self._next = None
                self._running = sweep
                self._sweeps += 1
                sweep.table = await sweep_process_table(self.slice_seconds)
                return sweep.table
            finally:
                if self._next is sweep:
                    self._next = None
                if self._running is sweep:
                    self._running = None
                sweep.done.set()


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group that is gone (or not ours) is ignored."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_entry(entry: ProcessEntry, sig: int) -> None:
    """Signal ``entry`` and its group, if the pid still names the process the sweep saw."""
    stat = _read_stat(str(entry.pid))
    if stat is None or stat[3] != entry.start_ticks or stat[0] in _DEAD_STATES:
        return  # exited (or the pid now names another process)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(entry.pid, sig)
    if stat[1] == entry.pgrp:  # the group was ours when the sweep saw it, and still is
        signal_group(entry.pgrp, sig)


async def terminate_members(
    sweeper: ProcessSweeper,
    marker: str,
    sessions: Iterable[int],
    *,
    grace: float,
    kill_wait: float,
    graceful: bool = True,
) -> list[int]:
    """Kill every process of a sandbox; return the pids still alive at the end (normally none).

    Graceful: SIGTERM every member, up to ``grace`` seconds for them to go, then SIGKILL the
    rest, up to ``kill_wait``; not graceful (an interrupted release): SIGKILL at once. Each
    round takes a fresh snapshot and signals what it finds (a process that forks while it is
    being killed does not slip through).

    **Cancellation**: stops between rounds; run it under the release's cleanup scope.
    """
    tracked = tuple(sessions)
    stages = [(signal.SIGTERM, grace)] if graceful else []
    stages.append((signal.SIGKILL, kill_wait))
    found: list[ProcessEntry] = []
    for sig, wait in stages:
        deadline = anyio.current_time() + wait
        while True:
            found = (await sweeper.snapshot()).members(marker, tracked)
            if not found:
                return []
            for entry in found:
                _signal_entry(entry, sig)
            if anyio.current_time() >= deadline:
                break
            await anyio.sleep(_ROUND_PAUSE_SECONDS)
    found = (await sweeper.snapshot()).members(marker, tracked)
    return [e.pid for e in found]


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie.

    One ``killpg(pgid, 0)`` answers the common case (the group is gone); only when members
    remain is ``/proc`` read (``stat`` only), because SIGKILLed processes stay visible (and
    signalable) as zombies until reaped, and a SIGKILL takes a moment to land on a busy machine.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    for name in _proc_names():
        stat = _read_stat(name)
        if stat is not None and stat[1] == pgid and stat[0] not in _DEAD_STATES:
            return True
    return False
