"""The namespaced local backend against the real kernel: what a hostile command can and cannot do.

Issue #15's acceptance on the local backend (asyncio and trio): the host's processes and secrets
are invisible, nothing escapes the close, the disk / pids / memory caps hold, the network is
off by default, a dead world is "gone" (not "your command failed"), isolation is explicit.
"""

from __future__ import annotations

import errno
import glob
import os
import pathlib
import secrets
import signal
import sys
from typing import Any

import anyio
import pytest

from hermes_async.errors import SandboxError
from hermes_async.limits import Limits, open_lag_monitor
from hermes_async.tools.registry import ToolRuntime, dispatch
from hermes_async.tools.sandbox.errors import SandboxUnavailableError
from hermes_async.tools.sandbox.local import LocalSandbox, local_factory
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.sandbox.namespaces import (
    INSIDE_ROOT,
    NamespaceOptions,
    processes_in_pid_namespace,
)
from tests.support import processes_mentioning, scaled

pytestmark = [pytest.mark.anyio, pytest.mark.namespaces]


async def _world(root: pathlib.Path, **options: Any) -> LocalSandbox:
    sandbox = await local_factory(
        str(root),
        isolation="namespaces",
        terminate_grace=0.5,
        namespace=NamespaceOptions(**options),
    )("ns-test")
    assert isinstance(sandbox, LocalSandbox) and sandbox.isolation == "namespaces"
    return sandbox


def _foreground_escapes(marker: str) -> str:
    """Two escapes from a command's process group (``setsid`` in the background, ``env -i
    setsid -f``) that the command waits for: each marks a file once it is in its own session.
    Without the wait, on a loaded machine the command could end, and its group be killed,
    before an escape had called setsid() (it then dies with the group, as it should, and the
    test would count one sleeper short)."""
    return (
        f"setsid sh -c ': > .esc1; exec sleep {marker}1' & "
        f"env -i setsid -f sh -c ': > .esc2; exec sleep {marker}2'; "
        "while [ ! -e .esc1 ] || [ ! -e .esc2 ]; do sleep 0.01; done; rm -f .esc1 .esc2"
    )


async def test_the_world_hides_the_host(tmp_path: pathlib.Path) -> None:
    sb = await _world(tmp_path)
    try:
        r = await sb.exec("id -u; pwd; echo $HOME; ls /; ps -e --no-headers | wc -l")
        uid, cwd, home, *rest = r.stdout.splitlines()
        roots, count = set(rest[:-1]), int(rest[-1])
        assert (uid, cwd, home) == ("65534", f"{INSIDE_ROOT}/work", f"{INSIDE_ROOT}/home")
        assert {"usr", "etc", "proc", "sandbox", "tmp"} <= roots
        assert not roots & {"root", "home", "work", "var", "run", "mnt", "srv"}, roots
        assert count <= 6, r.stdout  # PID 1, the keeper, this shell, ps, wc
        r = await sb.exec("cat /proc/1/environ; echo rc=$?")
        assert "Permission denied" in r.stderr and "rc=1" in r.stdout
        r = await sb.exec("touch /usr/x 2>&1; touch /etc/x 2>&1; echo hi > /tmp/x && cat /tmp/x")
        assert r.stdout.count("Read-only file system") == 2 and r.stdout.endswith("hi\n"), r
        # /tmp is the sandbox's own disk, not the host's /tmp.
        r = await sb.exec(f"stat -c %d /tmp {INSIDE_ROOT} | uniq | wc -l; ls /tmp")
        assert r.stdout.splitlines() == ["1", "x"], r
        r = await sb.exec("cat /proc/self/status | grep -E '^Cap(Eff|Prm)'")
        assert r.stdout.split() == ["CapPrm:", "0000000000000000", "CapEff:", "0000000000000000"]
        # The world's directories (from the disk image's template) are the sandbox user's.
        r = await sb.exec(
            f"cd {INSIDE_ROOT} && stat -c '%n %a %u' . work home tmp .state .state/bg"
        )
        assert r.stdout.splitlines() == [
            ". 755 0",
            "work 755 65534",
            "home 755 65534",
            "tmp 1777 65534",
            ".state 755 65534",
            ".state/bg 755 65534",
        ], r
    finally:
        await sb.aclose()
    assert sb.live_processes() == []


async def test_close_kills_every_escape_without_a_proc_scan(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_async.tools.sandbox import processes

    def no_scan(*args: object, **kwargs: object) -> object:
        raise AssertionError("the namespaced close scanned /proc")

    monkeypatch.setattr(processes, "sweep_process_table", no_scan)
    monkeypatch.setattr(processes, "read_process_table", no_scan)
    sb = await _world(tmp_path)
    marker = "7777123"
    try:
        # Foreground escapes leave the command's process group (whatever stays in it dies
        # with the command); background ones run in their own session until close.
        r = await sb.exec(_foreground_escapes(marker), timeout=60)
        assert r.exit_code == 0, r
        await sb.start_background(
            f"nohup sleep {marker}3 >/dev/null 2>&1 & (sleep {marker}4 &); "
            f"sh -c 'sleep {marker}5 & exec sleep {marker}6' & trap '' TERM HUP; sleep {marker}7"
        )
        with anyio.fail_after(30):  # a loaded machine starts shells slowly
            while len(processes_mentioning(marker)) < 7:
                await anyio.sleep(0.05)
        namespace = sb.namespace
        assert namespace is not None
    finally:
        await sb.aclose()  # also when an assertion failed: nothing left for the next case
    assert processes_mentioning(marker) == []
    # Not a bare count of the namespace's inode: the kernel gives a dead namespace's number to
    # the next one made, perhaps by a test on another worker. live_processes() checks cgroups.
    assert sb.live_processes() == []
    assert not os.path.exists(sb.root)
    for cgroup in namespace.cgroups:
        assert not os.path.exists(os.path.dirname(cgroup))


_CRASHER = """
import os, sys, anyio
from hermes_async.tools.sandbox.local import local_factory

async def main():
    sb = await local_factory(sys.argv[1], isolation="namespaces")("crash")
    await sb.start_background("setsid sleep 6666123 & sleep 6666124")
    await anyio.sleep(0.5)
    print(sb.namespace.pid_namespace, flush=True)
    os._exit(3)  # no cleanup at all: as if the trainer crashed

anyio.run(main)
"""


async def test_a_crashed_host_process_takes_its_worlds_with_it(tmp_path: pathlib.Path) -> None:
    result = await anyio.run_process(
        [sys.executable, "-c", _CRASHER, str(tmp_path)],
        check=False,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert result.returncode == 3, result.stderr.decode()
    inode = int(result.stdout.decode().split()[-1])
    with anyio.fail_after(10):
        while processes_in_pid_namespace(inode) or processes_mentioning("666612"):
            await anyio.sleep(0.05)


_CRASH_WHILE_BUILDING = """
import os, sys, anyio
from hermes_async.tools.sandbox.local import local_factory

async def main():
    factory = local_factory(sys.argv[1], isolation="namespaces")
    made = 0

    async def build_and_close():
        nonlocal made
        while True:
            sandbox = await factory("building")
            made += 1
            if made == 16:
                os._exit(3)  # no cleanup, while the other loops' worlds are being built
            await sandbox.aclose()

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(build_and_close)

anyio.run(main)
"""


async def test_a_host_process_killed_mid_creation_leaves_no_world(tmp_path: pathlib.Path) -> None:
    # A world whose bubblewrap dies before it wakes the world's PID 1 is not covered by
    # --die-with-parent: the supervisor ends it (this left PID 1s behind when a Ray actor died).
    for _ in range(2):
        result = await anyio.run_process(
            [sys.executable, "-c", _CRASH_WHILE_BUILDING, str(tmp_path)],
            check=False,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        assert result.returncode == 3, result.stderr.decode()
    with anyio.move_on_after(15):
        while processes_mentioning(str(tmp_path)):
            await anyio.sleep(0.05)
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.parametrize("interrupted", [False, True], ids=["graceful", "interrupted"])
async def test_close_is_graceful_unless_interrupted(
    tmp_path: pathlib.Path, interrupted: bool
) -> None:
    sandbox = await local_factory(str(tmp_path), isolation="namespaces", terminate_grace=5)("t")
    assert isinstance(sandbox, LocalSandbox)
    await sandbox.start_background("trap '' TERM; sleep 1000")  # ignores TERM: waits out the grace
    await sandbox.start_background("trap 'exit 0' TERM; while :; do sleep 0.05; done")
    start = anyio.current_time()
    await sandbox.aclose(interrupted=interrupted)
    elapsed = anyio.current_time() - start
    assert sandbox.live_processes() == []
    assert elapsed < 4.5 if interrupted else elapsed >= 4.5, elapsed  # the grace is 5 s


@pytest.mark.parametrize("n", scaled(20, 50, 500, timeout=1200))
async def test_many_sandboxes_of_escapes_leave_nothing(tmp_path: pathlib.Path, n: int) -> None:
    """Acceptance: 500 sandboxes, each with setsid / nohup / double-fork / env -i escapes and a
    background sleeper; after release, 0 of their processes are alive (counted from the host).
    (20 in every run, 50 in CI; the 500 take ~1-3 min on the shared 2-core box: a soak.)"""
    # Unique per run: a fixed marker counted the sleepers of this test's other variant when
    # pytest-xdist ran the two at once on two workers (the "leftovers" of an earlier note).
    marker = f"88{secrets.randbelow(10**6):06d}"
    factory = local_factory(
        str(tmp_path), isolation="namespaces", namespace=NamespaceOptions(disk_limit_mb=64)
    )
    worlds: list[LocalSandbox] = []
    start = anyio.current_time()
    async with SandboxManager(factory, limits=Limits(sandbox_create=32), idle_timeout=None) as m:

        async def one(i: int) -> None:
            sb = await m.get(f"esc-{i}")
            inner = sb.inner
            assert isinstance(inner, LocalSandbox) and inner.namespace is not None
            worlds.append(inner)
            r = await sb.exec(_foreground_escapes(marker) + "; echo ok", timeout=120)
            assert r.stdout == "ok\n", r
            await sb.start_background(
                f"nohup sleep {marker}3 >/dev/null 2>&1 & (sleep {marker}4 &); sleep {marker}5"
            )

        with anyio.fail_after(600):
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
        with anyio.fail_after(120):  # the background sleepers start on their own time
            while (alive := len(processes_mentioning(marker))) < 4 * n:
                await anyio.sleep(0.1)
        started = anyio.current_time() - start
        release_start = anyio.current_time()
        async with open_lag_monitor() as monitor:
            with anyio.fail_after(600):
                await m.release_all()
            lag = monitor.statistics()
        released = anyio.current_time() - release_start
    left = processes_mentioning(marker)
    # By cgroup too, not by the namespaces' inodes alone: the kernel gives a dead namespace's
    # number to the next one made, perhaps by a test on the other worker (six "leftovers" once).
    in_worlds = sum(len(world.live_processes()) for world in worlds)
    print(
        f"{n} sandboxes: up with escapes in {started:.1f}s ({alive} sleepers alive), released "
        f"in {released:.1f}s, {len(left)} left, {in_worlds} in their PID namespaces; {lag}"
    )
    assert alive >= 4 * n
    assert left == [] and in_worlds == 0
    assert list(tmp_path.iterdir()) == []


def _loop_devices_backed_under(directory: pathlib.Path) -> list[str]:
    """Loop devices whose backing file is under ``directory`` (sysfs)."""
    found = []
    for path in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if f.read().startswith(str(directory)):
                    found.append(path.split("/")[3])
        except OSError:
            continue
    return found


@pytest.mark.parametrize("attach", ["here", "mount-o-loop"])
async def test_the_loop_disk_is_capped_and_its_device_freed_at_close(
    tmp_path: pathlib.Path, attach: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host attaches the image to a loop device itself; where it cannot (an old kernel, no
    /dev/loopN), the start falls back to ``mount -o loop``. Both give the capped disk, and the
    device clears itself once the world is gone."""
    from hermes_async.tools.sandbox import namespaces

    if attach == "mount-o-loop":

        def no_attach(image: str) -> tuple[int, str]:
            raise OSError(errno.ENOTTY, "LOOP_CONFIGURE not supported")

        monkeypatch.setattr(namespaces, "_attach_loop", no_attach)
    sb = await _world(tmp_path, disk_limit_mb=64, disk_backend="loop")
    try:
        assert sb.namespace is not None and sb.namespace.disk == "loop"
        total_kb = int((await sb.exec("df -k /sandbox | tail -1")).stdout.split()[1])
        assert 50_000 < total_kb <= 65_536, total_kb
        assert len(_loop_devices_backed_under(tmp_path)) == 1
    finally:
        await sb.aclose()
    with anyio.fail_after(10):
        while _loop_devices_backed_under(tmp_path):
            await anyio.sleep(0.05)


async def test_disk_cap_stops_runaway_writers(tmp_path: pathlib.Path) -> None:
    """Acceptance: background ``yes > file`` and ``head -c 10G /dev/zero > f`` stop at the cap;
    the sandbox stays usable; the host loop stays responsive."""
    cap_mb = 64
    sb = await _world(tmp_path, disk_limit_mb=cap_mb)
    try:
        async with open_lag_monitor() as monitor:
            proc = await sb.start_background("yes > runaway.txt")
            with anyio.fail_after(120):
                while (await sb.background_status(proc.session_id, tail_chars=2000)).running:
                    await anyio.sleep(0.1)
            status = await sb.background_status(proc.session_id, tail_chars=2000)
            r = await sb.exec("head -c 10G /dev/zero > zeros.bin; echo rc=$?", timeout=120)
            lag = monitor.statistics()
        assert status.exit_code != 0 and "No space left on device" in status.output, status
        assert "No space left on device" in r.stderr and "rc=1" in r.stdout, r
        r = await sb.exec("du -sm --apparent-size runaway.txt zeros.bin | cut -f1")
        sizes = [int(x) for x in r.stdout.split()]
        assert sum(sizes) <= cap_mb, sizes
        r = await sb.exec("rm runaway.txt zeros.bin && echo fine > ok.txt && cat ok.txt")
        assert r.stdout == "fine\n", r  # the disk is usable again
        print(f"disk cap {cap_mb} MiB held: {sizes} MiB written; {lag}")
        assert lag.max < 2.0
    finally:
        await sb.aclose()


async def test_fork_storm_stops_at_the_pids_limit(tmp_path: pathlib.Path) -> None:
    sb = await _world(tmp_path, pids_limit=64)
    namespace = sb.namespace
    assert namespace is not None
    try:
        async with open_lag_monitor() as monitor:
            await sb.start_background("bomb() { bomb | bomb & }; bomb")
            peak = 0
            with anyio.move_on_after(3):
                while True:
                    peak = max(peak, namespace.tasks() or 0)
                    await anyio.sleep(0.05)
            lag = monitor.statistics()
        print(f"fork storm: at most {peak} tasks (limit 64); {lag}")
        assert 32 < peak <= 64
        assert lag.max < 2.0
    finally:
        with anyio.fail_after(30):
            await sb.aclose()
    assert sb.live_processes() == []


async def test_memory_limit_kills_the_hog_not_the_sandbox(tmp_path: pathlib.Path) -> None:
    sb = await _world(tmp_path, memory_limit_mb=64)
    try:
        r = await sb.exec("python3 -c 'x = bytearray(512 << 20); print(len(x))'")
        assert r.exit_code == 137 and "killed by the sandbox's memory limit (64 MiB)" in r.stderr
        assert (await sb.exec("echo alive")).stdout == "alive\n"
    finally:
        await sb.aclose()


async def _count_connections(
    host: str, task_status: anyio.abc.TaskStatus[tuple[int, list[int]]]
) -> None:
    accepted = [0]
    listener = await anyio.create_tcp_listener(local_host=host, local_port=0)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        accepted[0] += 1
        async with stream:
            await stream.send(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi")

    async with listener:
        task_status.started((listener.extra(anyio.abc.SocketAttribute.local_port), accepted))
        await listener.serve(serve)


@pytest.mark.parametrize("network", ["none", "host"])
async def test_network_is_off_by_default(tmp_path: pathlib.Path, network: str) -> None:
    """Acceptance: curl / python socket.connect to a loopback server on the host fail from a
    default sandbox and the server sees 0 connections; ``network="host"`` reaches it."""
    sb = await _world(tmp_path, network=network)
    try:
        async with anyio.create_task_group() as tg:
            port, accepted = await tg.start(_count_connections, "127.0.0.1")
            curl = await sb.exec(f"curl -sS -m 5 http://127.0.0.1:{port}/")
            py = await sb.exec(
                'python3 -c \'import socket; socket.create_connection(("127.0.0.1", '
                f'{port}), 5); print("connected")\''
            )
            tg.cancel_scope.cancel("checked")
    finally:
        await sb.aclose()
    if network == "none":
        assert curl.exit_code == 7 and "Couldn't connect" in curl.stderr, curl
        assert py.exit_code == 1 and "ConnectionRefusedError" in py.stderr, py
        assert accepted == [0]
    else:
        assert curl.stdout == "hi" and py.stdout == "connected\n", (curl, py)
        assert accepted == [2]


async def test_a_dead_world_is_gone_not_a_failed_command(tmp_path: pathlib.Path) -> None:
    async with SandboxManager(
        local_factory(str(tmp_path), isolation="namespaces"), idle_timeout=None
    ) as manager:
        sb = await manager.get("t")
        assert (await sb.exec("echo hi")).stdout == "hi\n"
        inner = sb.inner
        assert isinstance(inner, LocalSandbox) and inner.namespace is not None
        assert manager.sandbox_failure("t") is None
        os.kill(inner.namespace.init_pid, signal.SIGKILL)  # the world's init dies (as in an OOM)
        with anyio.fail_after(10):
            while inner.namespace.alive():
                await anyio.sleep(0.01)
        with pytest.raises(SandboxUnavailableError, match="the local sandbox is gone") as info:
            await sb.exec("echo hi")
        assert info.value.reason == "exited" and info.value.category == "infra"
        assert isinstance(info.value, SandboxError)
        runtime = ToolRuntime("t", sandboxes=manager)
        terminal = await dispatch("terminal", {"command": "ls"}, runtime)
        assert "SandboxUnavailableError" in terminal.content and "is gone" in terminal.content
        read = await dispatch("read_file", {"path": "x"}, runtime)
        assert "Sandbox unavailable: the local sandbox is gone" in read.content
        failure = manager.sandbox_failure("t")
        assert failure is not None and failure.reason == "exited"
        await manager.release("t")
        assert manager.sandbox_failure("t") is failure  # kept for the rollout's record
        await manager.get("t")  # a new sandbox: the record is forgotten
        assert manager.sandbox_failure("t") is None
    assert list(tmp_path.iterdir()) == []


async def test_file_tools_resolve_paths_before_the_block_list(tmp_path: pathlib.Path) -> None:
    sb = await _world(tmp_path)
    try:

        class One:
            async def get(self, task_id: str) -> LocalSandbox:
                return sb

            async def release(self, task_id: str, *, interrupted: bool = False) -> None:
                pass  # the test closes its world itself

        runtime = ToolRuntime("t", sandboxes=One())
        await sb.exec("ln -s /proc/1/environ env.txt; ln -s /proc proc-dir; echo ok > fine.txt")
        for path in (
            "/proc/1/environ",
            "//proc/self/environ",
            "///proc/1/environ",
            "../../proc/1/environ",
            "env.txt",
            "proc-dir/self/environ",
            "/sandbox/../dev/zero",
        ):
            out = await dispatch("read_file", {"path": path}, runtime)
            assert "are blocked" in out.content, (path, out.content)
        out = await dispatch("write_file", {"path": "proc-dir/x", "content": "x"}, runtime)
        assert "are blocked" in out.content
        out = await dispatch("search_files", {"pattern": "PATH", "path": "proc-dir/self"}, runtime)
        assert "are blocked" in out.content
        out = await dispatch("read_file", {"path": "fine.txt"}, runtime)
        assert "ok" in out.content and "error" not in out.content
    finally:
        await sb.aclose()


async def test_a_read_only_bind_is_reachable_through_parents_nothing_shows() -> None:
    # A tool installed under a path whose parents the world does not show (/var/...): bwrap
    # made those parents 0700 and root's, so the sandbox user could not reach the tool.
    import shutil
    import tempfile

    host = tempfile.mkdtemp(prefix="hermes-ro-bind-", dir="/var/tmp")
    try:
        os.chmod(host, 0o755)
        tool = os.path.join(host, "tool")
        os.mkdir(tool)
        with open(os.path.join(tool, "hello"), "w") as f:
            f.write("hi\n")
        root = tempfile.mkdtemp(prefix="hermes-ro-bind-root-")
        sb = await _world(pathlib.Path(root), ro_binds=[tool])
        try:
            r = await sb.exec(f"cat {tool}/hello; stat -c %a /var {host}; touch {tool}/x")
            assert r.stdout.split() == ["hi", "755", "755"], r
            assert "Read-only file system" in r.stderr, r
            r = await sb.exec("ls /var")
            assert r.stdout.split() == ["tmp"], r  # only the path to the bind, nothing else
        finally:
            await sb.aclose()
            shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(host, ignore_errors=True)


async def test_cancelled_starts_leave_nothing(tmp_path: pathlib.Path) -> None:
    """Cancelling a namespaced sandbox's creation at any moment leaves no process, no cgroup
    and no directory (the cancellation matrix's 'during sandbox start' on the real kernel)."""
    from hermes_async.tools.sandbox.namespaces import _host

    factory = local_factory(
        str(tmp_path), isolation="namespaces", namespace=NamespaceOptions(disk_limit_mb=64)
    )
    await (await factory("warm-up")).aclose()  # probe + disk template outside the matrix
    outcomes = []
    for delay in (0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3):
        with anyio.move_on_after(delay) as scope:
            sb = await factory("cancelstart")
        outcomes.append(scope.cancelled_caught)
        if not scope.cancelled_caught:
            await sb.aclose()
    assert any(outcomes), outcomes  # at least some starts were really cut short
    with anyio.fail_after(15):
        while processes_mentioning(str(tmp_path)):
            await anyio.sleep(0.05)
    assert list(tmp_path.iterdir()) == []
    for base in (_host().cgroups.memory, _host().cgroups.pids):
        if base is not None:
            left = [n for n in os.listdir(base) if "cancelstart" in n]
            procs = [(pathlib.Path(base) / n / "cgroup.procs").read_text() for n in left]
            assert left == [], (outcomes, procs)
