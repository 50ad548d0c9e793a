from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import time

import anyio
import pytest

from hermes_async.errors import ConfigError, SandboxError
from hermes_async.testing.sandbox_conformance import CONFORMANCE_CHECKS, ConformanceCheck, make_tar
from hermes_async.tools.sandbox import (
    base as base_module,
    local as local_module,
    namespaces as namespaces_module,
)
from hermes_async.tools.sandbox.backends import make_backend_factory, preflight_backend
from hermes_async.tools.sandbox.base import PID_REUSE_SH, check_tar_members
from hermes_async.tools.sandbox.local import (
    ISOLATION_ENV,
    SANDBOX_MARKER_ENV,
    LocalSandbox,
    find_sandbox_processes,
    local_factory,
    run_bounded,
)
from hermes_async.tools.sandbox.namespaces import NamespaceOptions
from hermes_async.tools.sandbox.processes import group_alive, process_tag

pytestmark = pytest.mark.anyio


ISOLATIONS = pytest.mark.parametrize("isolation", ["namespaces", "process"])


async def _sandbox(
    tmp_path: pathlib.Path, isolation: str = "process", **kwargs: object
) -> LocalSandbox:
    return await LocalSandbox.create(
        "t",
        root_dir=str(tmp_path),
        terminate_grace=0.5,
        isolation=isolation,  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


@ISOLATIONS
@pytest.mark.parametrize("check", list(CONFORMANCE_CHECKS.values()), ids=list(CONFORMANCE_CHECKS))
async def test_conformance(tmp_path: pathlib.Path, check: ConformanceCheck, isolation: str) -> None:
    sb = await _sandbox(tmp_path, isolation)
    assert sb.isolation == isolation
    try:
        await check(sb)
    finally:
        with anyio.move_on_after(10, shield=True):
            await sb.aclose()
    assert sb.live_processes() == []
    assert list(tmp_path.iterdir()) == []


@ISOLATIONS
async def test_secret_in_host_env_is_absent(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, isolation: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-should-not-leak")
    monkeypatch.setenv("MY_SECRET_TOKEN", "hunter2")
    sb = await _sandbox(tmp_path, isolation, extra_env={"VISIBLE": "yes"})
    try:
        r = await sb.exec("env")
        assert "sk-test-should-not-leak" not in r.stdout
        assert "hunter2" not in r.stdout
        assert "OPENAI_API_KEY" not in r.stdout
        assert "VISIBLE=yes" in r.stdout
        assert f"HOME={sb.home}" in r.stdout
        # Background processes get the same environment.
        proc = await sb.start_background("env")
        with anyio.fail_after(10):
            while (await sb.background_status(proc.session_id)).running:
                await anyio.sleep(0.05)
        status = await sb.background_status(proc.session_id)
        assert "hunter2" not in status.output and "VISIBLE=yes" in status.output
    finally:
        await sb.aclose()


async def test_home_file_lands_in_sandbox(tmp_path: pathlib.Path) -> None:
    sb = await _sandbox(tmp_path)
    try:
        await sb.exec("echo hi > ~/greeting.txt")
        assert (pathlib.Path(sb.home) / "greeting.txt").read_text() == "hi\n"
        assert await sb.read_bytes("~/greeting.txt") == b"hi\n"
    finally:
        await sb.aclose()


@ISOLATIONS
async def test_timed_out_background_pair_leaves_no_process(
    tmp_path: pathlib.Path, isolation: str
) -> None:
    sb = await _sandbox(tmp_path, isolation)
    try:
        r = await sb.exec("sleep 1000 & sleep 1000", timeout=0.5)
        assert r.exit_code == 124 and r.timed_out
        assert sb.live_processes() == []
    finally:
        await sb.aclose()


@ISOLATIONS
async def test_foreground_leftovers_are_killed_on_exit(
    tmp_path: pathlib.Path, isolation: str
) -> None:
    sb = await _sandbox(tmp_path, isolation)
    try:
        r = await sb.exec("sleep 1000 & echo started")
        assert r.stdout == "started\n" and r.exit_code == 0
        assert sb.live_processes() == []
    finally:
        await sb.aclose()


async def test_aclose_kills_escaped_sessions_and_removes_dir(tmp_path: pathlib.Path) -> None:
    sb = await _sandbox(tmp_path)
    # setsid escapes the command's process group and session; nohup ignores SIGHUP.
    r = await sb.exec("setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo ok")
    assert r.exit_code == 0
    await sb.start_background("sleep 1000")
    await sb.exec("chmod 000 work 2>/dev/null; mkdir -p locked/x && chmod 000 locked", cwd=sb.root)
    with anyio.fail_after(5):
        while not sb.live_processes():
            await anyio.sleep(0.02)
    await sb.aclose()
    assert sb.live_processes() == []
    assert not os.path.exists(sb.root)
    await sb.aclose()  # idempotent
    with pytest.raises(SandboxError, match="is closed"):
        await sb.exec("true")


@ISOLATIONS
async def test_sigterm_ignoring_command_is_killed(tmp_path: pathlib.Path, isolation: str) -> None:
    sb = await _sandbox(tmp_path, isolation)
    try:
        start = anyio.current_time()
        r = await sb.exec("trap '' TERM; sleep 1000", timeout=0.3)
        assert r.timed_out and r.exit_code == 124
        assert anyio.current_time() - start < 5
        assert sb.live_processes() == []
    finally:
        await sb.aclose()


@ISOLATIONS
async def test_cancellation_kills_process_group(tmp_path: pathlib.Path, isolation: str) -> None:
    sb = await _sandbox(tmp_path, isolation)
    try:
        with anyio.move_on_after(0.3):
            await sb.exec("sleep 1000 & sleep 1000 & wait")
        assert sb.live_processes() == []
    finally:
        await sb.aclose()


@ISOLATIONS
async def test_output_is_bounded_and_decoded(tmp_path: pathlib.Path, isolation: str) -> None:
    sb = await _sandbox(tmp_path, isolation)
    try:
        r = await sb.exec("yes | head -c 50000000", output_limit=4096)
        assert r.truncated and len(r.stdout) < 5000
        assert "bytes of output omitted" in r.stdout
        r = await sb.exec("printf '\\xff\\xfe'")
        assert r.stdout == "\ufffd\ufffd"
    finally:
        await sb.aclose()


async def test_invalid_env_name_rejected(tmp_path: pathlib.Path) -> None:
    sb = await _sandbox(tmp_path)
    try:
        with pytest.raises(ValueError, match="invalid environment variable"):
            await sb.exec("true", env={"A=B": "x"})
    finally:
        await sb.aclose()


@ISOLATIONS
async def test_create_in_missing_root_is_sandbox_error(
    tmp_path: pathlib.Path, isolation: str
) -> None:
    with pytest.raises(SandboxError, match="cannot create a local sandbox directory"):
        await _sandbox(tmp_path / "missing" / "deeper", isolation)


@pytest.mark.parametrize("n", [25, pytest.param(100, marks=pytest.mark.slow)])
async def test_concurrent_sandboxes(tmp_path: pathlib.Path, n: int) -> None:
    sandboxes: list[LocalSandbox] = []

    async def one(i: int) -> None:
        sb = await LocalSandbox.create(f"task-{i}", root_dir=str(tmp_path), isolation="process")
        sandboxes.append(sb)
        try:
            await sb.write_bytes("n.txt", str(i).encode())
            r = await sb.exec("cat n.txt; echo; yes | head -c 100000 | wc -c")
            assert r.stdout.split() == [str(i), "100000"]
            r = await sb.exec("sleep 1000 & sleep 1000", timeout=0.5)
            assert r.timed_out
        finally:
            with anyio.move_on_after(10, shield=True):
                await sb.aclose()

    start = anyio.current_time()
    with anyio.fail_after(90):
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
    elapsed = anyio.current_time() - start
    print(f"{n} concurrent sandboxes: {elapsed:.2f}s")
    assert len(sandboxes) == n
    assert find_sandbox_processes(None, ()) == []  # sanity: empty query finds nothing
    for sb in sandboxes:
        assert sb.live_processes() == []
    assert list(tmp_path.iterdir()) == []


async def test_run_bounded_reports_signal_exit() -> None:
    r = await run_bounded(["/bin/sh", "-c", "kill -TERM $$"], timeout=10)
    assert r.exit_code == 128 + signal.SIGTERM


def test_check_tar_members_rejects_hostile_archives() -> None:
    import io
    import tarfile

    assert check_tar_members(b"") == []
    assert [m.name for m in check_tar_members(make_tar({"a/b": b"x"}))] == ["a/b"]
    for name in ("../x", "/etc/x", "a/../../x"):
        with pytest.raises(ValueError, match="refusing"):
            check_tar_members(make_tar({name: b"x"}))
    for linkname in ("/etc/passwd", "../../outside"):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo("link")
            info.type = tarfile.SYMTYPE
            info.linkname = linkname
            tf.addfile(info)
        with pytest.raises(ValueError, match=r"symlink|escapes"):
            check_tar_members(buf.getvalue())
    with pytest.raises(ValueError, match="not a valid tar archive"):
        check_tar_members(b"definitely not a tar file" * 40)


def test_marker_env_constant() -> None:
    assert SANDBOX_MARKER_ENV == "HERMES_ASYNC_SANDBOX"


@pytest.mark.parametrize("interrupted", [False, True], ids=["graceful", "interrupted"])
async def test_close_is_graceful_unless_interrupted(
    tmp_path: pathlib.Path, interrupted: bool
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    # A long grace: a graceful close waits it out for processes that ignore TERM.
    sb = await LocalSandbox.create("t", root_dir=str(root), terminate_grace=4, isolation="process")
    trapped, ready = outside / "trapped", outside / "ready"
    await sb.start_background(
        f"trap 'echo TERM > {trapped}; exit 0' TERM; echo > {ready}-1; while :; do sleep 0.05; done"
    )
    await sb.start_background(f"trap '' TERM; echo > {ready}-2; sleep 1000")
    with anyio.fail_after(30):  # both traps are set (a loaded machine starts shells slowly)
        while not (outside / "ready-1").exists() or not (outside / "ready-2").exists():
            await anyio.sleep(0.02)
        while len(sb.live_processes()) < 4:
            await anyio.sleep(0.02)
    start = anyio.current_time()
    await sb.aclose(interrupted=interrupted)
    elapsed = anyio.current_time() - start
    assert sb.live_processes() == []
    assert not os.path.exists(sb.root)
    if interrupted:
        assert not trapped.exists()  # SIGKILL at once: no TERM handler ran
        assert elapsed < 3.5
    else:
        assert trapped.read_text() == "TERM\n"
        assert elapsed >= 3.5  # the TERM-ignoring sleep got the whole grace


async def test_closes_of_one_factory_share_sweeps_and_removals(tmp_path: pathlib.Path) -> None:
    from hermes_async.limits import open_lag_monitor
    from hermes_async.tools.sandbox.manager import SandboxManager

    n = 40
    factory = local_factory(str(tmp_path), terminate_grace=2.0, isolation="process")
    async with SandboxManager(factory, idle_timeout=None) as manager:
        inner: list[LocalSandbox] = []

        async def start(i: int) -> None:
            sb = await manager.get(f"t{i}")
            await sb.start_background("sleep 1000")
            assert isinstance(sb.inner, LocalSandbox)
            inner.append(sb.inner)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(start, i)
        sweeper, remover = inner[0].sweeper, inner[0].remover
        assert all(sb.sweeper is sweeper and sb.remover is remover for sb in inner)
        before = sweeper.statistics()
        async with open_lag_monitor() as monitor:
            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for i in range(n):
                        tg.start_soon(manager.release, f"t{i}")
            lag = monitor.statistics()
    after = sweeper.statistics()
    requests, sweeps = after.requests - before.requests, after.sweeps - before.sweeps
    print(f"{n} closes: {requests} kill rounds in {sweeps} sweeps, {remover.runs} rm; {lag}")
    assert requests >= 2 * n  # each close: a TERM round, then a round that finds nothing
    assert sweeps <= requests // 4  # shared, not one per close
    assert remover.runs <= n // 4
    # The old per-sandbox synchronous scans stalled the loop for seconds at this size; the
    # bound is generous for a loaded machine (bench/sandbox_close.py measures it properly).
    assert lag.max < 2.0
    for sb in inner:
        assert sb.live_processes() == []
    assert list(tmp_path.iterdir()) == []


async def test_isolation_is_explicit(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    with pytest.raises(ConfigError, match="isolation must be 'auto', 'namespaces' or 'process'"):
        local_factory(isolation="jail")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"unknown option\(s\)|invalid option"):
        make_backend_factory("local", isolaton="namespaces")
    with pytest.raises(ConfigError, match="must not be root"):
        local_factory(namespace=NamespaceOptions(uid=0))
    with pytest.raises(ConfigError, match="must not be root"):  # a config gives them flat
        make_backend_factory("local", isolation="process", uid=0)
    # Where bubblewrap is missing, the default and "namespaces" are one ConfigError: what is
    # missing, the install script, the explicit opt-out. Nothing falls back on its own.
    why = "bwrap not found on PATH (Debian packages: bubblewrap, util-linux)"
    monkeypatch.setattr(local_module, "namespace_support", lambda: why)
    for isolation in ("auto", "namespaces"):
        with pytest.raises(ConfigError) as raised:
            make_backend_factory("local", isolation=isolation)
        message = str(raised.value)
        assert f"cannot be isolated on this machine: {why}" in message
        assert "scripts/sandbox/install.sh" in message
        assert "isolation='process'" in message and "HERMES_SANDBOX_ISOLATION=process" in message
    # The explicit opt-outs: the argument, or the operator's variable for "auto". No warning.
    with caplog.at_level(logging.WARNING, logger="hermes_async.tools.sandbox.local"):
        factory = local_factory(str(tmp_path), isolation="process")
        monkeypatch.setenv(ISOLATION_ENV, "process")
        chosen = local_factory(str(tmp_path))
    assert not caplog.records
    for make in (factory, chosen):
        sb = await make("t")
        try:
            assert isinstance(sb, LocalSandbox) and sb.isolation == "process"
        finally:
            await sb.aclose()
    monkeypatch.setenv(ISOLATION_ENV, "jail")
    with pytest.raises(ConfigError, match="got 'jail'"):
        local_factory(str(tmp_path))


async def test_the_default_probes_bubblewrap_before_the_first_sandbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bwrap on PATH but unable to start (a container without user namespaces): the preflight
    and the first creation fail with the same error; the explicit opt-out passes."""
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    monkeypatch.setattr(namespaces_module, "_probe_result", ["bwrap failed (exit 1): no perms"])
    with pytest.raises(ConfigError, match=r"cannot be isolated on this machine: bwrap failed"):
        await preflight_backend("local")
    factory = local_factory()
    with pytest.raises(ConfigError, match=r"isolation='process'"):
        await factory("t")
    await preflight_backend("local", isolation="process")


def test_namespace_support_looks_up_the_tools_once_per_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every rollout's sandbox factory asks; 20,000 PATH scans at start-up stalled the loop.
    looked_up: list[str] = []

    def which(tool: str) -> str | None:
        looked_up.append(tool)
        return None if tool == "bwrap" else f"/usr/bin/{tool}"

    monkeypatch.setattr(namespaces_module.os, "geteuid", lambda: 0)
    monkeypatch.setattr(namespaces_module.shutil, "which", which)
    monkeypatch.setattr(namespaces_module, "_support", {})
    monkeypatch.setenv("PATH", "/nowhere")
    for _ in range(3):
        assert namespaces_module.namespace_support() == (
            "bwrap not found on PATH (Debian packages: bubblewrap, util-linux)"
        )
    assert looked_up == ["bwrap", "nsenter", "unshare"]
    monkeypatch.setenv("PATH", "/elsewhere")  # another PATH: looked up again
    namespaces_module.namespace_support()
    assert len(looked_up) == 6


# ------------------------------------------------------------------- recorded pids reused


def _shells() -> list[list[str]]:
    found = [[path] for path in ("/bin/dash", "/bin/bash") if os.path.exists(path)]
    busybox = shutil.which("busybox")
    return [*found, [busybox, "sh"]] if busybox else found


def _start_ticks(pid: int) -> str:
    return process_tag(pid).partition("-")[2]


@pytest.mark.parametrize("shell", _shells(), ids=lambda argv: argv[-1].rsplit("/", 1)[-1])
def test_pid_reuse_functions_tell_a_reused_pid_from_the_recorded_process(
    tmp_path: pathlib.Path, shell: list[str]
) -> None:
    recorded = subprocess.Popen(["sleep", "60"])
    time.sleep(0.05)  # start times count in clock ticks (1/100 s): the two must differ
    other = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    pid_file = tmp_path / "pid"
    lines = [
        f'note_start {recorded.pid} "{pid_file}"',
        f'reused {recorded.pid} "{pid_file}" && echo same:reused || echo same:ours',
        # The file names the recorded process; a live process with another start time has the
        # number now (as after the kernel reused it).
        f'reused {other.pid} "{pid_file}" && echo other:reused || echo other:ours',
        # The recorded process is gone: its number may still name its session's survivors.
        f'reused {gone.pid} "{pid_file}" && echo gone:reused || echo gone:ours',
        f'cp "{pid_file}.start" "{tmp_path}/kept"; rm "{pid_file}.start"',
        # No start time recorded (an older file): nothing counts as reused.
        f'reused {other.pid} "{pid_file}" && echo unknown:reused || echo unknown:ours',
        'echo "args:$1:$2"',
    ]
    try:
        out = subprocess.run(
            [*shell, "-c", "\n".join([PID_REUSE_SH, *lines]), "script", "a", "b"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        ticks = _start_ticks(recorded.pid)
    finally:
        for process in (recorded, other):
            process.kill()
            process.wait()
    assert out.stderr == ""
    # The functions keep their arguments to themselves: the script's own are unchanged.
    assert out.stdout.split() == [
        "same:ours",
        "other:reused",
        "gone:ours",
        "unknown:ours",
        "args:a:b",
    ]
    assert (tmp_path / "kept").read_text().strip() == ticks


async def test_a_background_pid_reused_by_another_process_is_never_signalled(
    tmp_path: pathlib.Path,
) -> None:
    sb = await _sandbox(tmp_path)
    other = subprocess.Popen(["sleep", "3311"], start_new_session=True)
    try:
        await anyio.sleep(0.05)  # start times count in clock ticks (1/100 s): theirs must differ
        proc = await sb.start_background("sleep 3310")
        state = pathlib.Path(proc.state_dir)
        assert (state / "pid.start").read_text().strip() == _start_ticks(proc.pid)
        assert (state / "keeper.start").read_text().strip().isdigit()
        # The wrapper dies without writing its exit status, and the kernel gives its number
        # (and the keeper's) to a process outside the sandbox, in a session of its own.
        os.killpg(proc.pid, signal.SIGKILL)
        with anyio.fail_after(10):
            while group_alive(proc.pid):
                await anyio.sleep(0.02)
        (state / "pid").write_text(f"{other.pid}\n")
        (state / "keeper").write_text(f"{other.pid}\n")
        # The sandbox's own record of the pid, as the launch read it from that file.
        sb._background_table()[proc.session_id] = dataclasses.replace(proc, pid=other.pid)
        assert not (await sb.background_status(proc.session_id)).running
        assert await sb.kill_background(proc.session_id) is False
        await sb.close_background_stdin(proc.session_id)
        with pytest.raises(OSError, match="stdin is closed"):
            await sb.write_background_stdin(proc.session_id, b"x\n")
        await sb.aclose()
        assert other.poll() is None, "a process outside the sandbox was signalled"
    finally:
        other.kill()
        other.wait()
        with anyio.move_on_after(10, shield=True):
            await sb.aclose()


async def test_a_command_cannot_pass_for_a_failed_entry(tmp_path: pathlib.Path) -> None:
    # What the entry steps print when they fail, printed by the command itself, is its result:
    # it once raised SandboxError ("could not enter"), as if the sandbox were lost.
    sb = await _sandbox(tmp_path, "namespaces")
    try:
        forged = {
            "echo 'nsenter: reassociate to namespace failed' >&2; exit 1": 1,
            "nsenter -t 1 -m true": 1,
            'echo "hermes-async: not this sandbox\'s namespaces" >&2; exit 125': 125,
            "echo 'cannot create cgroup.procs' >&2; exit 126": 126,
        }
        for command, code in forged.items():
            result = await sb.exec(command)
            assert result.exit_code == code, command
            assert "hermes-async: entered" not in result.stderr
        assert (await sb.exec("echo err >&2")).stderr == "err\n"
        assert (await sb.exec("true", output_limit=0)).stderr == ""
        # A real failed entry is still an error.
        assert sb.namespace is not None
        sb.namespace.hostname = "another-world"
        with pytest.raises(SandboxError, match="could not enter the namespaced sandbox"):
            await sb.exec("true")
    finally:
        with anyio.move_on_after(10, shield=True):
            await sb.aclose()


@ISOLATIONS
async def test_state_files_written_by_a_background_command_do_not_break_its_status(
    tmp_path: pathlib.Path, isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command can write every file the status probe reads: non-ASCII digits, thousands of
    # digits and extra lines once raised ValueError; a FIFO blocked the probe to its timeout.
    monkeypatch.setattr(base_module, "BACKGROUND_EXEC_TIMEOUT_SECONDS", 8.0)
    sb = await _sandbox(tmp_path, isolation)
    here = 'cd "$(dirname "$0")"'
    try:
        for content, code in (("\u00b2", -1), ("0" * 5000, -1), ("7\n12\nFAKE", 7)):
            proc = await sb.start_background(
                f"{here}; echo out; printf '%s' '{content}' > exit; sleep 1000"
            )
            with anyio.fail_after(10):
                while (status := await sb.background_status(proc.session_id)).running:
                    await anyio.sleep(0.05)
            assert (status.exit_code, status.dropped_bytes, status.output) == (code, 0, "out\n")
        proc = await sb.start_background(
            f"{here}; printf '\u00b2' > dropped; echo ready; sleep 1000"
        )
        with anyio.fail_after(10):
            while "ready" not in (status := await sb.background_status(proc.session_id)).output:
                await anyio.sleep(0.05)
        assert status.running and status.dropped_bytes == 0
        proc = await sb.start_background(
            f"{here}; rm -f log.0 dropped; mkfifo log.0 dropped; echo ready; sleep 1000"
        )
        await anyio.sleep(0.5)
        with anyio.fail_after(4):
            status = await sb.background_status(proc.session_id)
        assert status.running and status.output == "ready\n"
    finally:
        with anyio.move_on_after(10, shield=True):
            await sb.aclose()
