"""Host processes of local sandboxes: who belongs to which sandbox, and killing them all.

Membership is read from ``/proc``: the sandbox's marker variable, or a tracked session that
still holds a marked process. One sweep serves every concurrent closer, in slices (costs:
docs/decisions/024-local-host-processes.md).
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

from hermes_async.tools.sandbox._batch import Batcher

__all__ = (
    "SANDBOX_MARKER_ENV",
    "ProcessEntry",
    "ProcessSweeper",
    "ProcessTable",
    "SweeperStatistics",
    "find_sandbox_processes",
    "group_alive",
    "process_tag",
    "read_process_table",
    "signal_group",
    "sweep_process_table",
    "tag_alive",
    "terminate_members",
)

#: Environment variable carrying the sandbox id into every process it starts; ``aclose`` uses it
#: to find processes that left the sandbox's sessions (``setsid``). Not a secret.
SANDBOX_MARKER_ENV = "HERMES_ASYNC_SANDBOX"

#: Longest stretch of ``/proc`` reading between two yields to the event loop (2 ms: a tenth of
#: the 20 ms lag budget, and ~90 processes read per slice).
_SWEEP_SLICE_SECONDS = 0.002

#: Pause between kill rounds (a SIGKILL takes a moment to land on a busy machine).
_ROUND_PAUSE_SECONDS = 0.02

#: A user process's environment reads empty for a moment while it execs (~15 us here, longer
#: when the machine is loaded): such a process is read again after this pause, a few times.
#: One that stays empty has no environment (``env -i``), so no marker either.
_UNSETTLED_PAUSE_SECONDS = 0.005
_UNSETTLED_TRIES = 3

#: ``PF_KTHREAD`` in ``/proc/<pid>/stat``'s flags: a kernel thread, which has no environment.
_PF_KTHREAD = 0x00200000

_MARKER_KEY = f"{SANDBOX_MARKER_ENV}=".encode()
_DEAD_STATES = ("Z", "X")


@dataclass(frozen=True, slots=True)
class ProcessEntry:
    """One live host process as a sweep saw it.

    Attributes:
        start_ticks: Start time in clock ticks since boot (tells a reused pid apart).
        markers: Values of :data:`SANDBOX_MARKER_ENV` in its environment.
    """

    pid: int
    state: str
    pgrp: int
    session: int
    start_ticks: int
    markers: tuple[str, ...] = ()


class ProcessTable:
    """A snapshot of the host's live processes (no zombies, not this one), indexed on first use."""

    __slots__ = ("_by_marker", "_by_session", "entries")

    def __init__(self, entries: tuple[ProcessEntry, ...]) -> None:
        self.entries = entries
        self._by_marker: dict[str, list[ProcessEntry]] | None = None
        self._by_session: dict[int, list[ProcessEntry]] = {}

    def _index(self) -> dict[str, list[ProcessEntry]]:
        if self._by_marker is None:
            self._by_marker = {}
            for entry in self.entries:
                for value in set(entry.markers):
                    self._by_marker.setdefault(value, []).append(entry)
                self._by_session.setdefault(entry.session, []).append(entry)
        return self._by_marker

    def members(
        self,
        marker: str | None = None,
        sessions: Iterable[int] = (),
        *,
        marker_prefix: bool = False,
    ) -> list[ProcessEntry]:
        """The entries that belong to a sandbox.

        Args:
            marker: The sandbox's marker value; ``None``: only ``sessions`` count.
            sessions: Session ids the sandbox started.
            marker_prefix: Match marker values that start with ``marker``.
        """
        by_marker = self._index()
        wanted = set(sessions)
        if marker is None:
            return [e for s in wanted for e in self._by_session.get(s, ())]
        if marker_prefix:
            keys = [k for k in by_marker if k.startswith(marker)]
        else:
            keys = [marker] if marker in by_marker else []
        seen: set[int] = set()
        marked = []
        for key in keys:
            for entry in by_marker[key]:
                if entry.pid not in seen:
                    seen.add(entry.pid)
                    marked.append(entry)
        confirmed = {e.session for e in marked} & wanted
        others = [e for s in confirmed for e in self._by_session.get(s, ()) if e.pid not in seen]
        return marked + others


def _read_stat(pid: str) -> tuple[str, int, int, int, int] | None:
    """``(state, pgrp, session, start_ticks, flags)`` of ``pid``, or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[2]), int(fields[3]), int(fields[19]), int(fields[6])
    except (IndexError, ValueError):
        return None


def _markers(environ: bytes) -> tuple[str, ...]:
    """Every value of the marker variable in a NUL-separated environment block."""
    return tuple(
        item[len(_MARKER_KEY) :].decode(errors="replace")
        for item in environ.split(b"\0")
        if item.startswith(_MARKER_KEY)
    )


def _read_entry(name: str, unsettled: list[str]) -> ProcessEntry | None:
    """The entry of pid ``name``, or ``None`` if it is gone or a zombie.

    A user process whose environment reads empty is appended to ``unsettled``: it may be in
    the middle of an exec (its marker would be missed), so the caller reads it again.
    """
    stat = _read_stat(name)
    if stat is None or stat[0] in _DEAD_STATES:
        return None
    try:
        with open(f"/proc/{name}/environ", "rb") as f:
            environ = f.read()
    except OSError:  # gone, or another user's process (not ours either way)
        return ProcessEntry(int(name), stat[0], stat[1], stat[2], stat[3])
    if not environ and not stat[4] & _PF_KTHREAD:
        unsettled.append(name)
    markers = _markers(environ) if _MARKER_KEY in environ else ()
    return ProcessEntry(int(name), stat[0], stat[1], stat[2], stat[3], markers)


def _read_into(entries: dict[str, ProcessEntry], names: Iterable[str]) -> list[str]:
    """Read ``names`` into ``entries`` (dropping the gone); return those left unsettled."""
    unsettled: list[str] = []
    for name in names:
        entry = _read_entry(name, unsettled)
        if entry is None:
            entries.pop(name, None)
        else:
            entries[name] = entry
    return unsettled


def _settling(entries: dict[str, ProcessEntry], unsettled: list[str]) -> Iterator[float]:
    """Read the unsettled processes again, a few times: yields the pause to take before each
    read (the caller sleeps its own way)."""
    for _ in range(_UNSETTLED_TRIES):
        if not unsettled:
            return
        yield _UNSETTLED_PAUSE_SECONDS
        unsettled = _read_into(entries, unsettled)


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
    entries: dict[str, ProcessEntry] = {}
    for pause in _settling(entries, _read_into(entries, _proc_names())):
        time.sleep(pause)
    return ProcessTable(tuple(entries.values()))


async def sweep_process_table(slice_seconds: float = _SWEEP_SLICE_SECONDS) -> ProcessTable:
    """A snapshot of ``/proc`` that yields to the event loop every ``slice_seconds`` of work.

    **Cancellation**: abandoned at the next yield; nothing to clean up.
    """
    entries: dict[str, ProcessEntry] = {}
    unsettled: list[str] = []
    budget_end = time.perf_counter() + slice_seconds
    for name in _proc_names():
        entry = _read_entry(name, unsettled)
        if entry is not None:
            entries[name] = entry
        if time.perf_counter() >= budget_end:
            await anyio.lowlevel.checkpoint()
            budget_end = time.perf_counter() + slice_seconds
    for pause in _settling(entries, unsettled):
        await anyio.sleep(pause)
    return ProcessTable(tuple(entries.values()))


def find_sandbox_processes(
    marker: str | None = None, sessions: Iterable[int] = (), *, marker_prefix: bool = False
) -> list[int]:
    """Pids of a sandbox's live processes, in one synchronous ``/proc`` read (tests)."""
    table = read_process_table()
    return [e.pid for e in table.members(marker, sessions, marker_prefix=marker_prefix)]


@dataclass(frozen=True, slots=True)
class SweeperStatistics:
    """Counts of a :class:`ProcessSweeper`: kill-round requests and the sweeps that served them."""

    requests: int
    sweeps: int


class _Request:
    __slots__ = ("found", "marker", "sessions", "sig")

    def __init__(self, marker: str, sessions: frozenset[int], sig: int | None) -> None:
        self.marker = marker
        self.sessions = sessions
        self.sig = sig
        self.found: list[int] = []


class ProcessSweeper:
    """Serve many concurrent kill rounds with as few ``/proc`` sweeps as possible.

    A request is served by the first sweep that starts after it. One per ``local_factory``; a
    sandbox made on its own gets a private one.
    """

    def __init__(self, *, slice_seconds: float = _SWEEP_SLICE_SECONDS) -> None:
        if not slice_seconds > 0:
            raise ValueError(f"slice_seconds must be > 0, got {slice_seconds!r}")
        self.slice_seconds = slice_seconds
        self._batches: Batcher[_Request] = Batcher()
        self._requests = 0

    def statistics(self) -> SweeperStatistics:
        """How many kill rounds were requested and how many sweeps served them."""
        return SweeperStatistics(self._requests, self._batches.runs)

    async def kill_round(
        self, marker: str, sessions: Iterable[int], sig: int | None = None
    ) -> list[int]:
        """Find a sandbox's live processes in a sweep that starts after this call; signal them.

        ``sig`` goes to each process found (and its group, if unchanged); ``None``: only look.
        Returns the pids found.

        **Cancellation**: a cancelled requester running a sweep hands over to the waiters.
        """
        self._requests += 1
        request = _Request(marker, frozenset(sessions), sig)
        await self._batches.submit(request, self._sweep)
        return request.found

    async def _sweep(self, requests: list[_Request]) -> None:
        table = await sweep_process_table(self.slice_seconds)
        await self._serve(table, requests)

    async def _serve(self, table: ProcessTable, requests: list[_Request]) -> None:
        budget_end = time.perf_counter() + self.slice_seconds
        for request in requests:
            found = table.members(request.marker, request.sessions)
            if request.sig is not None:
                for entry in found:
                    _signal_entry(entry, request.sig)
            request.found = [e.pid for e in found]
            if time.perf_counter() >= budget_end:
                await anyio.lowlevel.checkpoint()
                budget_end = time.perf_counter() + self.slice_seconds


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group that is gone (or not ours) is ignored.

    Never this process's own group: that group holds the caller and whatever started it.
    """
    if pgid <= 1 or pgid == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_entry(entry: ProcessEntry, sig: int) -> None:
    """Signal ``entry`` and its group, if the pid still names the process the sweep saw."""
    stat = _read_stat(str(entry.pid))
    if stat is None or stat[3] != entry.start_ticks or stat[0] in _DEAD_STATES:
        return  # exited (or the pid now names another process)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(entry.pid, sig)
    # The group only outside our session: a marked process can be seen before its own setsid()
    # has run, still in its starter's group, which holds the starter and whatever started it.
    if stat[1] == entry.pgrp and stat[2] != os.getsid(0):
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

    Graceful: SIGTERM, up to ``grace``, then SIGKILL, up to ``kill_wait``; else SIGKILL at once.
    Each round is a fresh sweep, so a process forking while killed does not slip through.

    **Cancellation**: stops between rounds; run it under the release's cleanup scope.
    """
    tracked = tuple(sessions)
    stages = [(signal.SIGTERM, grace)] if graceful else []
    stages.append((signal.SIGKILL, kill_wait))
    for sig, wait in stages:
        deadline = anyio.current_time() + wait
        while True:
            if not await sweeper.kill_round(marker, tracked, sig):
                return []
            if anyio.current_time() >= deadline:
                break
            await anyio.sleep(_ROUND_PAUSE_SECONDS)
    return await sweeper.kill_round(marker, tracked)


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie."""
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


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_tag(pid: int | None = None) -> str:
    """``"<pid>-<start time>"``: names one process for good (tags leftovers' owners)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_ticks(pid) or 0}"


def tag_alive(tag: str) -> bool:
    """Whether the process a :func:`process_tag` named is still running (False if malformed)."""
    pid_text, _, start_text = tag.strip().partition("-")
    if not pid_text.isdigit():
        return False
    start = _start_ticks(int(pid_text))
    return start is not None and str(start) == start_text
