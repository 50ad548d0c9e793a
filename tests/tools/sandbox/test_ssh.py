"""The ssh backend against a real sshd on loopback (``@pytest.mark.ssh``).

``scripts/ssh/sshd.sh up`` starts one and exports ``HERMES_ASYNC_SSH_*``; without it the
ssh-marked tests skip, unless ``HERMES_ASYNC_REQUIRE_SSH=1`` (CI) turns the skip into a failure.
The server runs on this machine, so the tests look at the remote side directly too: the
sandbox directories under a per-test ``remote_root`` and the processes in ``/proc``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import anyio
import pytest

from hermes_async.errors import ConfigError, SandboxError
from hermes_async.testing.sandbox_conformance import CONFORMANCE_CHECKS, ConformanceCheck
from hermes_async.tool_context import ToolContext
from hermes_async.tools.registry import ToolRuntime, dispatch
from hermes_async.tools.sandbox import ssh as ssh_module
from hermes_async.tools.sandbox.backends import (
    available_backends,
    make_backend_factory,
    preflight_backend,
)
from hermes_async.tools.sandbox.errors import SandboxUnavailableError
from hermes_async.tools.sandbox.manager import SandboxManager, use_sandbox_manager
from hermes_async.tools.sandbox.spec import SandboxSpec
from hermes_async.tools.sandbox.ssh import SshBackend, SshSandbox, SshSandboxConfig
from tests.conftest import SshServer

pytestmark = pytest.mark.anyio

ssh = pytest.mark.ssh


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    # asyncssh is asyncio-only; the trio cases below override this with parametrize.
    return ("asyncio", {"debug": True})


trio_only = pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {}), id="trio")])


def make_config(server: SshServer, **overrides: object) -> SshSandboxConfig:
    settings: dict[str, object] = {
        "host": server.host,
        "port": server.port,
        "user": server.user,
        "key_path": server.key_path,
        "known_hosts": server.known_hosts,
        "default_exec_timeout": 60.0,
        "connect_timeout": 10.0,
    }
    settings.update(overrides)
    return SshSandboxConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture
def remote_root(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "remote"
    root.mkdir()
    return root


@pytest.fixture
async def backend(ssh_server: SshServer, remote_root: pathlib.Path) -> AsyncIterator[SshBackend]:
    backend = SshBackend(make_config(ssh_server, remote_root=str(remote_root)))
    yield backend
    assert list(remote_root.iterdir()) == [], "sandbox directories left behind"


def processes_with(text: str) -> list[int]:
    """Pids on this machine (the sshd's) whose command line contains ``text``."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


# ----------------------------------------------------------------------------- conformance


@ssh
@pytest.mark.parametrize("check", CONFORMANCE_CHECKS.values(), ids=CONFORMANCE_CHECKS.keys())
async def test_conformance(backend: SshBackend, check: ConformanceCheck) -> None:
    sb = await backend("conformance")
    try:
        await check(sb)
    finally:
        with anyio.move_on_after(30, shield=True):
            await sb.aclose()


@trio_only
async def test_refused_under_trio(remote_root: pathlib.Path) -> None:
    backend = SshBackend(SshSandboxConfig(host="127.0.0.1", remote_root=str(remote_root)))
    with pytest.raises(ConfigError, match=r"ssh sandbox backend needs asyncio.*'trio'"):
        await backend("t")
    with pytest.raises(ConfigError, match=r"ssh sandbox backend needs asyncio.*'trio'"):
        await preflight_backend("ssh", host="127.0.0.1")


# ----------------------------------------------------------------------------- behaviour


@ssh
async def test_exec_semantics_and_layout(backend: SshBackend, remote_root: pathlib.Path) -> None:
    os.environ["HERMES_TEST_SECRET"] = "s3cret"
    try:
        async with await backend("layout") as sb:
            assert isinstance(sb, SshSandbox)
            assert pathlib.Path(sb.root).parent == remote_root
            assert oct(pathlib.Path(sb.root).stat().st_mode & 0o777) == "0o700"
            r = await sb.exec("echo out; echo err >&2; pwd; echo $HOME; exit 3")
            assert (r.stdout, r.stderr, r.exit_code) == (
                f"out\n{sb.root}/work\n{sb.root}/home\n",
                "err\n",
                3,
            )
            env = (await sb.exec("env")).stdout
            assert "s3cret" not in env and "SSH_CONNECTION" not in env, env
            assert f"HERMES_ASYNC_SANDBOX={sb.sandbox_id}" in env
            missing = await sb.exec("pwd", cwd="nope")
            assert missing.exit_code == 1 and "No such file or directory" in missing.stderr
            # A child left running in the group neither blocks exec nor survives it.
            started = await sb.exec("sleep 3301 & echo started")
            assert (started.stdout, started.exit_code) == ("started\n", 0)
            assert started.duration_seconds < 10
            assert processes_with("sleep 3301") == []
        assert not pathlib.Path(sb.root).exists()
    finally:
        del os.environ["HERMES_TEST_SECRET"]


@ssh
async def test_one_connection_for_many_sandboxes(backend: SshBackend) -> None:
    results: dict[int, str] = {}

    async def rollout(manager: SandboxManager, i: int) -> None:
        sb = await manager.get(f"r{i}")
        results[i] = (await sb.exec(f"echo {i}; sleep 0.2")).stdout
        # Timeouts at full capacity: each kill needs a channel while the others are busy.
        timed_out = await sb.exec("sleep 3310", timeout=0.3)
        assert timed_out.timed_out, timed_out
        await manager.release(f"r{i}")

    # More concurrent commands than the server's MaxSessions (10): they queue for channels.
    async with backend, SandboxManager(backend) as manager:
        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(rollout, manager, i)
        assert backend.connections_opened == 1
    assert results == {i: f"{i}\n" for i in range(16)}
    assert processes_with("sleep 3310") == []


@asynccontextmanager
async def _held_link(backend: SshBackend) -> AsyncIterator[ssh_module._Link]:
    """The backend's connection, held for the block."""
    async with backend:
        link = await backend.acquire()
        try:
            yield link
        finally:
            await backend.release(link)


def _refusals(caplog: pytest.LogCaptureFixture) -> int:
    return sum("refused a channel" in r.getMessage() for r in caplog.records)


@ssh
async def test_a_channel_the_server_refuses_waits_for_a_free_session(
    ssh_server: SshServer, remote_root: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A cap above what the server allows (12 channels; OpenSSH's MaxSessions is 10): the
    # channels past it are refused ("open failed") and wait until a session frees.
    caplog.set_level(logging.DEBUG, logger=ssh_module.__name__)
    backend = SshBackend(make_config(ssh_server, remote_root=str(remote_root), max_sessions=14))
    results: list[str] = []

    async def run(sb: SshSandbox, i: int) -> None:
        results.append((await sb.exec(f"sleep 1; echo {i}")).stdout)

    async with backend, await backend("refused") as sb, anyio.create_task_group() as tg:
        for i in range(12):
            tg.start_soon(run, sb, i)
    assert sorted(results) == sorted(f"{i}\n" for i in range(12))
    assert _refusals(caplog) > 0  # the server did refuse: the case was exercised


@ssh
async def test_a_channel_refused_past_the_call_timeout_names_max_sessions(
    ssh_server: SshServer, remote_root: pathlib.Path
) -> None:
    config = make_config(
        ssh_server, remote_root=str(remote_root), max_sessions=14, call_timeout=1.5
    )
    backend = SshBackend(config)
    outcomes: list[object] = []

    async def run(sb: SshSandbox) -> None:
        try:
            outcomes.append((await sb.exec("sleep 4", timeout=20)).exit_code)
        except SandboxError as exc:
            outcomes.append(exc)

    async with backend, await backend("refused-long") as sb, anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(run, sb)
    errors = [o for o in outcomes if isinstance(o, SandboxError)]
    assert errors and len(outcomes) == 12
    assert all("refused a channel" in str(e) and "max_sessions=14" in str(e) for e in errors)
    assert outcomes.count(0) == len(outcomes) - len(errors)


@ssh
async def test_the_sftp_session_waits_for_a_free_session_too(
    backend: SshBackend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=ssh_module.__name__)
    async with _held_link(backend) as link:
        # Every one of the server's 10 sessions taken, past our cap, for 1.5 s.
        held = [await link.conn.create_process("sleep 1.5") for _ in range(10)]
        with anyio.fail_after(20):
            sftp = await link.sftp()
        assert await sftp.exists("/")
        assert _refusals(caplog) > 0
        for process in held:
            await process.wait_closed()


@ssh
async def test_the_channel_of_a_cancelled_command_keeps_its_slot_until_it_closes(
    backend: SshBackend, caplog: pytest.LogCaptureFixture
) -> None:
    # OpenSSH keeps a session until its command exits: the channel of a cancelled command
    # nobody killed yet is still counted by the server, so it keeps its slot here.
    caplog.set_level(logging.DEBUG, logger=ssh_module.__name__)
    async with _held_link(backend) as link:
        for _ in range(3):
            with anyio.move_on_after(0.5):
                await ssh_module._remote_sh(link, "exec sleep 3311", timeout=30)
        assert link.stuck_channels == 3
        assert link.channels.total_tokens == 8 - 3
        # More commands at once than the slots left: they queue here, none is refused.
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(partial(ssh_module._remote_sh, link, "sleep 0.3", timeout=30))
        assert _refusals(caplog) == 0
        # Once those commands end, their channels close and the slots come back.
        for pid in processes_with("sleep 3311"):
            os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(10):
            while link.stuck_channels:
                await anyio.sleep(0.05)
                await ssh_module._remote_sh(link, "true", timeout=30)
        assert link.channels.total_tokens == 8


@ssh
async def test_a_timed_out_command_returns_without_waiting_for_its_channel(
    backend: SshBackend, caplog: pytest.LogCaptureFixture
) -> None:
    # The channel's close completes only once the command is killed, which comes after it:
    # waiting for it cost every timed-out command its 5 s bound (and an "overran" warning).
    async with await backend("timeout-fast") as sb:
        for _ in range(3):
            start = anyio.current_time()
            result = await sb.exec("sleep 3312", timeout=0.3)
            assert result.timed_out
            assert anyio.current_time() - start < 3.0
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    assert not [r for r in caplog.records if "overran" in r.getMessage()]
    assert processes_with("sleep 3312") == []


@ssh
async def test_cancelled_exec_kills_the_remote_group(backend: SshBackend) -> None:
    async with await backend("cancel-exec") as sb:
        with anyio.move_on_after(1.5) as scope:
            await sb.exec("touch started; sleep 3302 & sleep 3303")
        assert scope.cancelled_caught
        # A second channel: the command ran, and nothing of its group is left.
        assert (await sb.exec("test -e started")).exit_code == 0
        count = await sb.exec(
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
            " | grep -c '^sleep 330[23] *$' || true"
        )
        assert count.stdout.strip() == "0", count
        assert processes_with("sleep 3302") == [] and processes_with("sleep 3303") == []


@ssh
async def test_close_kills_escaped_processes_and_background(backend: SshBackend) -> None:
    sb = await backend("escape")
    proc = await sb.start_background("sleep 3304")
    assert (await sb.background_status(proc.session_id)).running
    # Leaves the exec's group and session; still found by its marker variable.
    # (the pause: until setsid() ran, the sleep is still in the group the exec's end kills)
    await sb.exec("setsid sleep 3305 </dev/null >/dev/null 2>&1 & sleep 0.5")
    assert processes_with("sleep 3304") and processes_with("sleep 3305")
    await sb.aclose()
    assert processes_with("sleep 3304") == [] and processes_with("sleep 3305") == []
    with pytest.raises(SandboxError, match="closed"):
        await sb.exec("true")


@ssh
async def test_close_leaves_alone_a_session_that_reused_a_recorded_pid(
    backend: SshBackend,
) -> None:
    # Every sandbox on an ssh host shares its pid space: the number a finished command
    # recorded can name another sandbox's command by the time this one closes.
    sb = await backend("pid-reuse")
    other = subprocess.Popen(["sleep", "3306"], start_new_session=True)
    try:
        await anyio.sleep(0.05)  # start times count in clock ticks (1/100 s): theirs must differ
        proc = await sb.start_background("sleep 3307")
        assert (await sb.exec(f"cat {proc.state_dir}/pid.start")).stdout.strip().isdigit()
        await sb.kill_background(proc.session_id)
        # The kernel gives the recorded number to a process in a session of its own, outside
        # the sandbox (no marker), as it would to another sandbox's command.
        await sb.exec(f"echo {other.pid} > {proc.state_dir}/pid")
        await sb.aclose()
        assert processes_with("sleep 3307") == []
        assert other.poll() is None, "the close killed a session outside its sandbox"
    finally:
        other.kill()
        other.wait()


async def _create_cancelled_after(backend: SshBackend, task_id: str, seconds: float) -> None:
    """Create a sandbox under a deadline; one that got made is closed as its owner would
    (shielded, bounded: a sandbox's ``aclose`` does not shield itself), outside the deadline."""
    made = None
    with anyio.move_on_after(seconds):
        made = await backend(task_id)
    if made is not None:
        with anyio.fail_after(30, shield=True):
            await made.aclose()


@ssh
async def test_cancelled_create_leaves_no_remote_directory(
    backend: SshBackend, remote_root: pathlib.Path
) -> None:
    # Cancel at many points of a creation (connecting, mktemp, the reply on its way).
    async with backend:
        for step in range(30):
            await _create_cancelled_after(backend, f"cancel-create-{step}", step * 0.005)
            assert list(remote_root.iterdir()) == [], f"left behind at step {step}"
    # Without the held connection every creation connects first: cancel during the handshake.
    for step in range(20):
        await _create_cancelled_after(backend, f"cancel-connect-{step}", step * 0.01)
        assert list(remote_root.iterdir()) == [], f"left behind at step {step}"
    assert backend._link is None  # every connection was closed with its last user


@ssh
async def test_spec_env_workdir_and_timeout(backend: SshBackend) -> None:
    spec = SandboxSpec(env={"GREETING": "hi"}, workdir="/app", exec_timeout=1.0)
    async with await backend("spec", spec=spec) as sb:
        r = await sb.exec('pwd; echo "$GREETING"')
        assert r.stdout == f"{sb.root}/work/app\nhi\n"
        r = await sb.exec("sleep 3306")
        assert (r.exit_code, r.timed_out) == (124, True)
        assert processes_with("sleep 3306") == []


def _connection_server_pid(pid: int) -> int:
    """The sshd process serving the connection a remote command ``pid`` runs on: the first
    ancestor whose command line starts with ``sshd``."""
    while pid > 1:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        if cmdline.startswith(b"sshd"):
            return pid
        pid = int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("no sshd ancestor found")


@ssh
async def test_connection_loss_is_sandbox_unavailable(
    ssh_server: SshServer, remote_root: pathlib.Path
) -> None:
    backend = SshBackend(make_config(ssh_server, remote_root=str(remote_root)))
    sb = await backend("drop")
    async with anyio.create_task_group() as tg:
        outcome: list[BaseException] = []

        async def long_command() -> None:
            try:
                await sb.exec("sleep 3307")
            except SandboxUnavailableError as exc:
                outcome.append(exc)

        tg.start_soon(long_command)
        with anyio.fail_after(10):
            while not processes_with("sleep 3307"):
                await anyio.sleep(0.05)
        server = _connection_server_pid(processes_with("sleep 3307")[0])
        os.kill(server, signal.SIGKILL)  # the connection drops mid-command
    assert outcome, "the command did not fail with SandboxUnavailableError"
    error = outcome[0]
    assert isinstance(error, SandboxUnavailableError)
    assert error.reason == "unreachable" and error.category == "infra"
    assert "SSH connection" in str(error)
    with pytest.raises(SandboxUnavailableError):
        await sb.exec("true")
    with pytest.raises(SandboxUnavailableError):
        await sb.read_bytes("x")
    # Closing reconnects to clean up: the directory and the orphaned sleep are gone.
    with anyio.fail_after(30):
        await sb.aclose()
    assert backend.connections_opened == 2
    assert list(remote_root.iterdir()) == []
    assert processes_with("sleep 3307") == []


@ssh
async def test_registry_builds_ssh_and_preflight_passes(
    ssh_server: SshServer, remote_root: pathlib.Path
) -> None:
    assert "ssh" in available_backends()
    options = {
        "host": ssh_server.host,
        "port": ssh_server.port,
        "user": ssh_server.user,
        "key_path": ssh_server.key_path,
        "known_hosts": ssh_server.known_hosts,
        "remote_root": str(remote_root),
    }
    await preflight_backend("ssh", **options)
    factory = make_backend_factory("ssh", **options)
    sb = await factory("registry")
    try:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    finally:
        await sb.aclose()


@ssh
async def test_host_key_checking_is_on_by_default(
    ssh_server: SshServer, tmp_path: pathlib.Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    options = {
        "host": ssh_server.host,
        "port": ssh_server.port,
        "user": ssh_server.user,
        "key_path": ssh_server.key_path,
        "known_hosts": str(empty),
        "remote_root": str(tmp_path),
    }
    with pytest.raises(SandboxError, match=r"terminal_backend='ssh'.*host key.*check_host_key"):
        await preflight_backend("ssh", **options)
    # The explicit opt-out accepts it.
    await preflight_backend("ssh", **{**options, "check_host_key": False})


@ssh
async def test_preflight_names_the_setting(ssh_server: SshServer, tmp_path: pathlib.Path) -> None:
    wrong_key = tmp_path / "key"
    wrong_key.write_text("not a key")
    base = {
        "host": ssh_server.host,
        "user": ssh_server.user,
        "known_hosts": ssh_server.known_hosts,
        "connect_timeout": 5.0,
    }
    with pytest.raises(SandboxError, match=r"terminal_backend='ssh'.*TERMINAL_SSH_PORT"):
        await preflight_backend("ssh", **base, port=1, key_path=ssh_server.key_path)
    with pytest.raises(SandboxError, match=r"terminal_backend='ssh'.*TERMINAL_SSH_KEY"):
        await preflight_backend("ssh", **base, port=ssh_server.port, key_path=str(wrong_key))


def test_config_from_reference_env_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERMINAL_SSH_HOST", "example.invalid")
    monkeypatch.setenv("TERMINAL_SSH_USER", "agent")
    monkeypatch.setenv("TERMINAL_SSH_PORT", "2222")
    monkeypatch.setenv("TERMINAL_SSH_KEY", "/keys/id_ed25519")
    config = SshSandboxConfig().resolved()
    assert (config.host, config.user, config.port, config.key_path) == (
        "example.invalid",
        "agent",
        2222,
        "/keys/id_ed25519",
    )
    # Explicit settings win over the variables.
    assert SshSandboxConfig(host="h", port=22).resolved().host == "h"
    monkeypatch.setenv("TERMINAL_SSH_PORT", "ssh")
    with pytest.raises(ConfigError, match="TERMINAL_SSH_PORT='ssh' is not a port"):
        SshSandboxConfig().resolved()


def test_config_needs_a_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TERMINAL_SSH_HOST", raising=False)
    with pytest.raises(ConfigError, match=r"needs a host.*TERMINAL_SSH_HOST"):
        make_backend_factory("ssh")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) hots for terminal_backend='ssh'"):
        make_backend_factory("ssh", hots="x")
    with pytest.raises(ConfigError, match="max_sessions must be an int >= 2"):
        SshSandboxConfig(host="h", max_sessions=1)


@ssh
async def test_sandbox_env_never_on_a_command_line(
    ssh_server: SshServer, remote_root: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "tok-" + os.urandom(8).hex()
    config = make_config(ssh_server, remote_root=str(remote_root), env={"API_TOKEN": secret})
    caplog.set_level("DEBUG", logger="asyncssh")
    async with await SshBackend(config)("env-file") as sb:
        r = await sb.exec('echo "$API_TOKEN"; echo "$EXTRA"', env={"EXTRA": "x y"})
        assert r.stdout == f"{secret}\nx y\n"
        assert caplog.records, "asyncssh logged nothing: the check below would prove nothing"
        assert secret not in caplog.text


async def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncssh", None)  # as if not installed
    backend = make_backend_factory("ssh", host="127.0.0.1")  # building needs no asyncssh
    with pytest.raises(ConfigError, match=r"pip install 'hermes-async\[ssh\]'"):
        await backend("t")


async def test_a_silent_server_is_bounded_by_connect_timeout(tmp_path: pathlib.Path) -> None:
    import socket

    # Accepts TCP connections (the kernel's backlog) and never says a word.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        options = {"host": "127.0.0.1", "port": port, "connect_timeout": 1.0}
        start = anyio.current_time()
        with pytest.raises(
            SandboxError, match=r"terminal_backend='ssh'.*did not answer within 1 s.*TERMINAL_SSH"
        ):
            await preflight_backend("ssh", **options)
        backend = make_backend_factory("ssh", **options, remote_root=str(tmp_path))
        with pytest.raises(SandboxError, match=r"did not answer within 1 s"):
            await backend("silent")
        assert anyio.current_time() - start < 10


# ----------------------------------------------------------------------------- tools on ssh


async def call(runtime: ToolRuntime, name: str, **args: object) -> dict[str, object]:
    outcome = await dispatch(name, args, runtime)
    result = json.loads(outcome.content)
    assert isinstance(result, dict)
    return result


@ssh
async def test_tools_and_tool_context_on_ssh(backend: SshBackend, tmp_path: pathlib.Path) -> None:
    blob = os.urandom(3 * 1024 * 1024)
    (tmp_path / "blob.bin").write_bytes(blob)
    async with SandboxManager(backend) as manager:
        with use_sandbox_manager(manager):
            rt = ToolRuntime(task_id="tools", sandboxes=manager)
            assert await call(rt, "terminal", command="echo out; echo err >&2; exit 2") == {
                "output": "out\nerr\n",
                "exit_code": 2,
                "error": None,
            }
            assert (await call(rt, "terminal", command="sleep 3311", timeout=1))["exit_code"] == 124
            started = await call(rt, "terminal", command="echo ready; sleep 3312", background=True)
            sid = str(started["session_id"])
            assert (await call(rt, "process", action="poll", session_id=sid))["status"] == "running"
            assert (await call(rt, "process", action="kill", session_id=sid)).get("error") is None
            assert (await call(rt, "process", action="poll", session_id=sid))["status"] == "exited"
            ctx = ToolContext("tools")
            up = await ctx.upload_file(str(tmp_path / "blob.bin"), "in/deep/blob copy.bin")
            assert up == {"exit_code": 0, "output": "", "bytes": len(blob)}
            sha = await ctx.terminal("sha256sum 'in/deep/blob copy.bin' | cut -c1-64")
            assert str(sha["output"]).split() == [hashlib.sha256(blob).hexdigest()]
            down = await ctx.download_file("in/deep/blob copy.bin", str(tmp_path / "down.bin"))
            assert down == {"success": True, "bytes": len(blob)}
            assert (tmp_path / "down.bin").read_bytes() == blob
            await ctx.write_file("notes/a.txt", "hello ssh\n")
            assert "hello ssh" in str((await ctx.read_file("notes/a.txt")).get("content"))
    assert processes_with("sleep 3311") == [] and processes_with("sleep 3312") == []
