"""The Docker backend against a real engine (``@pytest.mark.docker``).

The engine is whatever ``DOCKER_HOST`` (or the default socket) reaches; without one the
docker-marked tests are skipped with the reason shown (``-ra``), unless
``HERMES_ASYNC_REQUIRE_DOCKER=1`` (CI) turns the skip into a failure. ``scripts/docker/engine.sh up``
starts a private engine and builds the test image (``HERMES_ASYNC_DOCKER_TEST_IMAGE``, default
``hermes-async-busybox:local``).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import pathlib
import random
import socket
import tarfile
import urllib.parse
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from hermes_async.errors import ConfigError, SandboxError
from hermes_async.limits import Limits
from hermes_async.testing.sandbox_conformance import CONFORMANCE_CHECKS, ConformanceCheck
from hermes_async.tool_context import ToolContext
from hermes_async.tools.registry import ToolRuntime, dispatch
from hermes_async.tools.sandbox.docker import (
    LABEL,
    DockerBackend,
    DockerSandbox,
    DockerSandboxConfig,
    owner_id,
    reap_orphan_containers,
)
from hermes_async.tools.sandbox.manager import SandboxManager, use_sandbox_manager

pytestmark = pytest.mark.anyio

TEST_IMAGE = os.environ.get("HERMES_ASYNC_DOCKER_TEST_IMAGE", "hermes-async-busybox:local")
PING_TIMEOUT_SECONDS = 3.0


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    # aiodocker is asyncio-only; the trio case below overrides this with parametrize.
    return ("asyncio", {"debug": True})


# ----------------------------------------------------------------------------- engine access


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()  # no engine: don't leak the socket (a ResourceWarning is an error)
            raise
        self.sock = sock


def _engine_url() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _request(url: str, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """A synchronous engine request (fixtures run outside the event loop)."""
    if url.startswith("unix://"):
        conn: http.client.HTTPConnection = _UnixConnection(url[len("unix://") :], timeout)
    else:
        parsed = urllib.parse.urlparse(url.replace("tcp://", "http://"))
        conn = http.client.HTTPConnection(
            parsed.hostname or "localhost", parsed.port, timeout=timeout
        )
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _our_containers(url: str) -> list[str]:
    filters = json.dumps({"label": [f"{LABEL}.owner={owner_id()}"]})
    status, body = _request(url, f"/containers/json?all=1&filters={urllib.parse.quote(filters)}")
    assert status == 200, body
    return [c["Id"][:12] + " " + "/".join(c["Names"]) for c in json.loads(body)]


def running_commands(url: str, sandbox: object) -> str:
    """Command lines of every process in the sandbox's container, from the engine (``docker
    top``), so the check does not depend on the image having ``ps``."""
    inner = getattr(sandbox, "inner", sandbox)
    assert isinstance(inner, DockerSandbox)
    status, body = _request(url, f"/containers/{inner.container_id}/top?ps_args=-eo%20pid,args")
    assert status == 200, body
    rows = json.loads(body)["Processes"] or []
    commands = "\n".join(" ".join(row) for row in rows)
    assert "sleep infinity" in commands  # the listing works: the keep-alive process is there
    return commands


@pytest.fixture(scope="module")
def docker_engine() -> Iterator[str]:
    """The engine URL; skips (or fails under HERMES_ASYNC_REQUIRE_DOCKER=1) when none answers.

    At module end, asserts that no container of this process is left behind.
    """
    url = _engine_url()
    reason = None
    try:
        status, _ = _request(url, "/_ping", timeout=PING_TIMEOUT_SECONDS)
        if status != 200:
            reason = f"the Docker engine at {url} answered /_ping with HTTP {status}"
        else:
            status, _ = _request(url, f"/images/{TEST_IMAGE}/json")
            if status != 200:
                reason = (
                    f"test image {TEST_IMAGE!r} is not on the engine at {url}; "
                    "build it with `scripts/docker/engine.sh up`"
                )
    except OSError as exc:
        reason = (
            f"no Docker engine answers at {url} ({exc}); start one with "
            '`eval "$(scripts/docker/engine.sh up)"` or set DOCKER_HOST'
        )
    if reason is not None:
        if os.environ.get("HERMES_ASYNC_REQUIRE_DOCKER") == "1":
            pytest.fail(f"HERMES_ASYNC_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)
    yield url
    leftovers = _our_containers(url)
    assert leftovers == [], f"containers left behind by this test module: {leftovers}"


def make_config(**overrides: object) -> DockerSandboxConfig:
    settings: dict[str, object] = {
        "image": TEST_IMAGE,
        "memory_mb": 256,
        "pids_limit": 128,
        "pull_missing": False,
        "default_exec_timeout": 60.0,
    }
    settings.update(overrides)
    return DockerSandboxConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture
async def sandbox(docker_engine: str) -> AsyncIterator[DockerSandbox]:
    sb = await DockerBackend(make_config())("test-task")
    try:
        yield sb
    finally:
        await sb.aclose()


docker = pytest.mark.docker


# ----------------------------------------------------------------------------- tests


@docker
async def test_exec_streams_exit_code_cwd_env_stdin(
    sandbox: DockerSandbox, docker_engine: str
) -> None:
    result = await sandbox.exec("echo out; echo err >&2; pwd; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n/root\n", "err\n", 3)
    assert not result.timed_out and not result.truncated
    result = await sandbox.exec('cat; echo "$GREETING"', stdin=b"piped\n", env={"GREETING": "hi"})
    assert (result.stdout, result.exit_code) == ("piped\nhi\n", 0)
    assert (await sandbox.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    missing = await sandbox.exec("pwd", cwd="nope")
    assert missing.exit_code == 1
    assert "/root/nope: No such file or directory" in missing.stderr
    # A background child that outlives the command neither blocks exec nor survives it.
    started = await sandbox.exec("sleep 300 & echo started")
    assert (started.stdout, started.exit_code) == ("started\n", 0)
    assert started.duration_seconds < 10
    assert "sleep 300" not in running_commands(docker_engine, sandbox)


@docker
async def test_container_is_hardened_and_labelled(
    sandbox: DockerSandbox, docker_engine: str
) -> None:
    status, body = _request(docker_engine, f"/containers/{sandbox.container_id}/json")
    assert status == 200
    info = json.loads(body)
    host = info["HostConfig"]
    assert host["CapDrop"] == ["ALL"]
    assert "SYS_ADMIN" not in host["CapAdd"] and "NET_ADMIN" not in host["CapAdd"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert (host["PidsLimit"], host["Memory"], host["NanoCpus"]) == (128, 256 << 20, 10**9)
    assert host["NetworkMode"] == "none"
    labels = info["Config"]["Labels"]
    assert labels[LABEL] == "1"
    assert labels[f"{LABEL}.task-id"] == "test-task"
    assert labels[f"{LABEL}.owner"] == owner_id()
    assert info["Config"]["WorkingDir"] == "/root"
    status_file = (await sandbox.exec("cat /proc/self/status")).stdout
    assert "NoNewPrivs:\t1" in status_file
    # Host secrets never reach the container.
    os.environ["HERMES_TEST_SECRET"] = "s3cret"
    try:
        assert "s3cret" not in (await sandbox.exec("env")).stdout
    finally:
        del os.environ["HERMES_TEST_SECRET"]


@docker
async def test_timeout_kills_the_whole_group(sandbox: DockerSandbox, docker_engine: str) -> None:
    result = await sandbox.exec("sleep 301 & sleep 302; echo never", timeout=1)
    assert (result.exit_code, result.timed_out) == (124, True)
    assert "never" not in result.stdout
    assert result.duration_seconds < 15
    processes = running_commands(docker_engine, sandbox)
    assert "sleep 301" not in processes and "sleep 302" not in processes


@docker
async def test_cancelled_exec_kills_the_group(sandbox: DockerSandbox, docker_engine: str) -> None:
    with anyio.move_on_after(1.5):
        await sandbox.exec("touch /root/started; sleep 303 & sleep 304")
    assert (await sandbox.exec("test -e /root/started")).exit_code == 0
    processes = running_commands(docker_engine, sandbox)
    assert "sleep 303" not in processes and "sleep 304" not in processes


@docker
async def test_output_is_capped_head_and_tail(sandbox: DockerSandbox) -> None:
    result = await sandbox.exec(
        "echo START; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END >&1", output_limit=2000
    )
    assert result.truncated
    assert result.stdout.startswith("START\n") and result.stdout.endswith("END\n")
    assert "bytes of output omitted" in result.stdout
    assert len(result.stdout) < 2200


@docker
async def test_files_round_trip(sandbox: DockerSandbox) -> None:
    blob = os.urandom(5 * 1024 * 1024)
    await sandbox.write_bytes("deep/dir/blob.bin", blob)
    assert await sandbox.read_bytes("/root/deep/dir/blob.bin") == blob
    digest = await sandbox.exec("md5sum deep/dir/blob.bin")
    assert digest.exit_code == 0
    await sandbox.write_bytes("empty", b"")
    assert await sandbox.read_bytes("~/empty") == b""
    await sandbox.exec("ln -s deep/dir/blob.bin link")
    assert await sandbox.read_bytes("link") == blob
    with pytest.raises(FileNotFoundError):
        await sandbox.read_bytes("missing")
    with pytest.raises(FileNotFoundError):
        await sandbox.read_bytes("deep")  # a directory

    archive = await sandbox.get_archive("deep")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
    assert "./dir/blob.bin" in names
    await sandbox.put_archive("/srv/copy", archive)
    assert await sandbox.read_bytes("/srv/copy/dir/blob.bin") == blob
    single = await sandbox.get_archive("empty")
    with tarfile.open(fileobj=io.BytesIO(single)) as tar:
        assert tar.getnames() == ["empty"]
    with pytest.raises(FileNotFoundError):
        await sandbox.get_archive("nothing-here")


@docker
@pytest.mark.parametrize(
    "name, link",
    [("../evil", None), ("/etc/evil", None), ("a/../../evil", None), ("link", "/etc/passwd")],
)
async def test_put_archive_rejects_traversal(
    sandbox: DockerSandbox, name: str, link: str | None
) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        if link is None:
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
        else:
            info.type = tarfile.SYMTYPE
            info.linkname = link
            tar.addfile(info)
    with pytest.raises(ValueError, match=r"absolute|escapes"):
        await sandbox.put_archive("/root/x", buf.getvalue())
    assert (await sandbox.exec("ls /root/x /evil /root/evil")).exit_code != 0


@docker
async def test_background_processes_work_on_exec_only_backend(
    sandbox: DockerSandbox, docker_engine: str
) -> None:
    proc = await sandbox.start_background("echo hello; sleep 305")
    status = await sandbox.background_status(proc.session_id)
    assert status.running
    assert await sandbox.kill_background(proc.session_id)
    status = await sandbox.background_status(proc.session_id)
    assert not status.running
    assert "sleep 305" not in running_commands(docker_engine, sandbox)


@docker
async def test_32_concurrent_rollouts(docker_engine: str) -> None:
    limits = Limits(sandbox_create=16)
    results: dict[str, str] = {}

    async def rollout(manager: SandboxManager, i: int) -> None:
        task_id = f"rollout-{i}"
        sb = await manager.get(task_id)
        result = await sb.exec(f"echo {i} > n.txt && cat n.txt")
        results[task_id] = result.stdout
        await manager.release(task_id)

    async with (
        SandboxManager(DockerBackend(make_config()), limits=limits) as manager,
        anyio.create_task_group() as tg,
    ):
        for i in range(32):
            tg.start_soon(rollout, manager, i)
    assert results == {f"rollout-{i}": f"{i}\n" for i in range(32)}
    assert limits.sandbox_create.statistics().acquisitions == 32
    assert _our_containers(docker_engine) == []


@docker
async def test_cancelled_group_leaves_no_container(docker_engine: str) -> None:
    backend = DockerBackend(make_config())
    running = 0
    enough = anyio.Event()

    async def rollout(i: int) -> None:
        nonlocal running
        async with await backend(f"cancel-{i}") as sb:
            running += 1
            if running == 3:
                enough.set()
            await sb.exec("sleep 306")

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(rollout, i)
            await enough.wait()
            # Some rollouts are in a command, others are still creating their container.
            scope.cancel()
    assert scope.cancelled_caught
    assert _our_containers(docker_engine) == []


@docker
async def test_orphans_of_dead_owners_are_reaped(docker_engine: str) -> None:
    import aiodocker

    host = socket.gethostname()
    client = aiodocker.Docker(url=docker_engine)
    try:
        orphan = await client.containers.create(
            {
                "Image": TEST_IMAGE,
                "Cmd": ["sleep", "infinity"],
                "Labels": {LABEL: "1", f"{LABEL}.owner": f"{host}/999999999/1"},
            },
            name="hermes-async-orphan-test",
        )
        foreign = await client.containers.create(
            {
                "Image": TEST_IMAGE,
                "Cmd": ["sleep", "infinity"],
                "Labels": {LABEL: "1", f"{LABEL}.owner": "another-host/1/1"},
            },
            name="hermes-async-foreign-test",
        )
        try:
            assert await reap_orphan_containers(docker_engine) >= 1
            names = {c["Names"][0] for c in await client.containers.list(all=True) for _ in [0]}
            assert "/hermes-async-orphan-test" not in names
            assert "/hermes-async-foreign-test" in names  # another host's: not ours to judge
        finally:
            for container in (orphan, foreign):
                try:
                    await container.delete(force=True)
                except aiodocker.DockerError as exc:
                    if exc.status != 404:
                        raise
    finally:
        await client.close()


@docker
async def test_missing_image_is_a_clear_error(docker_engine: str) -> None:
    backend = DockerBackend(
        make_config(image="hermes-async-no-such-image:none", pull_missing=False)
    )
    with pytest.raises(
        SandboxError, match="refused to create a container from 'hermes-async-no-such"
    ):
        await backend("no-image")


async def test_missing_socket_names_it_and_docker_host(tmp_path: pathlib.Path) -> None:
    backend = DockerBackend(make_config(docker_host=f"unix://{tmp_path}/none/docker.sock"))
    with pytest.raises(
        SandboxError, match=r"no Docker socket at .*/none/docker\.sock.*DOCKER_HOST"
    ):
        await backend("t")


async def test_unreachable_socket_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    dead = tmp_path / "dead.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(dead))
    listener.close()  # the socket file exists, nobody listens
    backend = DockerBackend(make_config(docker_host=f"unix://{dead}"))
    with pytest.raises(
        SandboxError, match=r"cannot reach the Docker engine at unix://.*dead\.sock.*DOCKER_HOST"
    ):
        await backend("t")


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {}), id="trio")])
async def test_refused_under_trio() -> None:
    with pytest.raises(ConfigError, match=r"docker sandbox backend needs asyncio.*'trio'"):
        await DockerBackend(make_config())("t")


@docker
@pytest.mark.parametrize("check", CONFORMANCE_CHECKS.values(), ids=CONFORMANCE_CHECKS.keys())
async def test_conformance(docker_engine: str, check: ConformanceCheck) -> None:
    sb = await DockerBackend(make_config())("conformance")
    try:
        await check(sb)
    finally:
        with anyio.move_on_after(30, shield=True):
            await sb.aclose()


# ----------------------------------------------------------------------------- tools on Docker
# The tool-level tests of the local backend (terminal, process, ToolContext, cancellation),
# run on a Docker sandbox through the manager, as an environment would.


@pytest.fixture
async def docker_manager(docker_engine: str) -> AsyncIterator[SandboxManager]:
    async with SandboxManager(DockerBackend(make_config())) as manager:
        with use_sandbox_manager(manager):
            yield manager


async def call(runtime: ToolRuntime, name: str, **args: object) -> dict[str, object]:
    outcome = await dispatch(name, args, runtime)
    result = json.loads(outcome.content)
    assert isinstance(result, dict)
    return result


@docker
async def test_terminal_and_process_tools(
    docker_manager: SandboxManager, docker_engine: str
) -> None:
    rt = ToolRuntime(task_id="tools", sandboxes=docker_manager)
    assert await call(rt, "terminal", command="echo out; echo err >&2; exit 2") == {
        "output": "out\nerr\n",
        "exit_code": 2,
        "error": None,
    }
    timed = await call(rt, "terminal", command="sleep 309", timeout=1)
    assert timed["exit_code"] == 124
    started = await call(rt, "terminal", command="echo ready; sleep 310", background=True)
    sid = str(started["session_id"])
    assert sid.startswith("proc_")
    polled = await call(rt, "process", action="poll", session_id=sid)
    assert polled["status"] == "running"
    killed = await call(rt, "process", action="kill", session_id=sid)
    assert killed.get("error") is None
    polled = await call(rt, "process", action="poll", session_id=sid)
    assert polled["status"] == "exited"
    processes = running_commands(docker_engine, await docker_manager.get("tools"))
    assert "sleep 309" not in processes and "sleep 310" not in processes


@docker
async def test_tool_context_on_docker(
    docker_manager: SandboxManager, tmp_path: pathlib.Path
) -> None:
    blob = random.Random(7).randbytes(5 * 1024 * 1024)
    (tmp_path / "blob.bin").write_bytes(blob)
    (tmp_path / "empty").write_bytes(b"")
    rt = ToolRuntime(task_id="ctx", sandboxes=docker_manager)
    await call(rt, "terminal", command="echo model-was-here > out.txt")
    ctx = ToolContext("ctx")
    result = await ctx.terminal("cat out.txt", timeout=30)
    assert result == {"output": "model-was-here\n", "exit_code": 0, "error": None}
    up = await ctx.upload_file(str(tmp_path / "blob.bin"), "in/deep/blob copy.bin")
    assert up == {"exit_code": 0, "output": "", "bytes": len(blob)}
    assert (await ctx.upload_file(str(tmp_path / "empty"), "in/empty"))["bytes"] == 0
    sha = await ctx.terminal("sha256sum 'in/deep/blob copy.bin' | cut -c1-64; wc -c < in/empty")
    assert str(sha["output"]).split() == [hashlib.sha256(blob).hexdigest(), "0"]
    down = await ctx.download_file("in/deep/blob copy.bin", str(tmp_path / "out" / "blob.bin"))
    assert down == {"success": True, "bytes": len(blob)}
    assert (tmp_path / "out" / "blob.bin").read_bytes() == blob
    await ctx.write_file("notes/a.txt", "hello docker\n")
    read = await ctx.read_file("notes/a.txt")
    assert "hello docker" in str(read.get("content"))


@docker
async def test_cancelled_tool_call_leaves_no_process(
    docker_manager: SandboxManager, docker_engine: str
) -> None:
    rt = ToolRuntime(task_id="cancel", sandboxes=docker_manager)
    sandbox = await docker_manager.get("cancel")
    with anyio.move_on_after(1.5):
        await call(rt, "terminal", command="sleep 311 & sleep 311 & wait")
    assert "sleep 311" not in running_commands(docker_engine, sandbox)


# ------------------------------------------------------------------- issue #15 acceptance


@docker
async def test_disk_cap_stops_writers_and_the_watchdog_ends_the_container(
    docker_engine: str,
) -> None:
    """``yes > f`` and ``head -c 10G /dev/zero > f`` stop at the cap (the ``fsize`` ulimit, or
    the storage driver's own cap); many files that together pass it get the container killed
    by the watchdog, and the sandbox is then gone (reason ``"disk"``), not "command failed"."""
    cap_mb = 16
    # First the per-file cap, with a watchdog too slow to interfere.
    backend = DockerBackend(make_config(disk_limit_mb=cap_mb, disk_check_interval_seconds=600))
    async with SandboxManager(backend, idle_timeout=None) as manager:
        sb = await manager.get("disk")
        yes = await sb.exec("yes > runaway.txt; echo rc=$?; wc -c < runaway.txt", timeout=60)
        zero = await sb.exec("head -c 10G /dev/zero > z; echo rc=$?; wc -c < z", timeout=60)
        for r in (yes, zero):
            rc, size = r.stdout.split()
            assert rc != "rc=0" and int(size) <= cap_mb << 20, r
        inner = sb.inner
        assert isinstance(inner, DockerSandbox)
        watchdog = inner.watchdog
    if not watchdog:
        return  # the storage driver caps the writable layer itself
    # Then the total: files under the per-file cap that together pass it.
    backend = DockerBackend(make_config(disk_limit_mb=cap_mb, disk_check_interval_seconds=0.3))
    async with SandboxManager(backend, idle_timeout=None) as manager:
        sb = await manager.get("disk")
        with anyio.fail_after(60), pytest.raises(SandboxError) as info:
            # Killed mid-way (then this exec raises) or after (then the next one does).
            r = await sb.exec(
                f"for i in 1 2 3; do head -c {(cap_mb - 4) << 20} /dev/zero > f$i; done"
            )
            assert r.exit_code == 0, r
            while True:
                await sb.exec("true")
                await anyio.sleep(0.2)
        error = info.value
        assert getattr(error, "reason", None) == "disk", error
        assert "disk cap" in str(error) and "not a failure of your command" in str(error)
        assert manager.sandbox_failure("disk") is error


async def _count_connections(task_status: anyio.abc.TaskStatus[tuple[int, list[int]]]) -> None:
    accepted = [0]
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        accepted[0] += 1
        await stream.aclose()

    async with listener:
        task_status.started((listener.extra(anyio.abc.SocketAttribute.local_port), accepted))
        await listener.serve(serve)


@docker
async def test_container_sees_no_host_process_secret_or_network(
    sandbox: DockerSandbox,
) -> None:
    """The container's /proc holds only its own processes (none has the host's environment),
    and with the default network mode a loopback server on the host sees 0 connections."""
    with open("/proc/self/environ", "rb") as f:  # what this process was started with
        ours = [e.decode() for e in f.read().split(b"\0") if e.startswith((b"PWD=", b"DOCKER"))]
    assert ours, "the test process has no PWD/DOCKER* variable to look for"
    procs = await sandbox.exec(
        "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null; "
        "ls -d /proc/[0-9]* | wc -l"
    )
    assert not [e for e in ours if e in procs.stdout.splitlines()], procs.stdout
    assert int(procs.stdout.split()[-1]) < 10, procs.stdout
    async with anyio.create_task_group() as tg:
        port, accepted = await tg.start(_count_connections)
        r = await sandbox.exec(f"wget -q -T 3 -O - http://127.0.0.1:{port}/; echo rc=$?")
        assert "rc=0" not in r.stdout, r
        tg.cancel_scope.cancel("checked")
    assert accepted == [0]


@docker
async def test_a_warm_pool_of_containers_hands_out_live_ones(docker_engine: str) -> None:
    from hermes_async.tools.sandbox.warm_pool import WarmPoolOptions

    pool = WarmPoolOptions(size=2, fill_concurrency=2)
    async with SandboxManager(DockerBackend(make_config()), warm_pool=pool) as manager:
        with anyio.fail_after(120):
            while (stats := manager.statistics().warm_pool) is None or stats.ready < 2:
                await anyio.sleep(0.05)
        assert manager.warm_pool is not None
        first, second = (s for s, _ in manager.warm_pool._warm[""].ready)
        assert isinstance(first, DockerSandbox) and await first.alive()
        await first._container.kill()  # dies while it waits in the pool
        assert not await first.alive()
        handed = await manager.get("rollout")
        assert handed.inner is second  # the dead one was skipped (and closed)
        assert (await handed.exec("echo hi")).stdout == "hi\n"
        stats = manager.statistics().warm_pool
        assert stats is not None and stats.failed_checks == 1
    assert _our_containers(docker_engine) == []


@docker
async def test_a_snapshot_starts_containers_from_the_files_and_is_deleted(
    docker_engine: str,
) -> None:
    from hermes_async.tools.sandbox.docker import SNAPSHOT_LABEL

    async with SandboxManager(DockerBackend(make_config())) as manager:
        template = await manager.get("template")
        assert template.can_snapshot()
        await template.exec("mkdir -p data && echo prepared > data/f")
        snapshot = await template.snapshot()
        await manager.release("template")
        image = snapshot.spec.image
        assert image is not None and image.startswith("hermes-async-snapshot:")
        status, body = _request(docker_engine, f"/images/{urllib.parse.quote(image)}/json")
        assert status == 200
        assert json.loads(body)["Config"]["Labels"][SNAPSHOT_LABEL] == "1"
        for task in ("a", "b"):
            manager.assign_spec(task, snapshot.spec)
            sandbox = await manager.get(task)
            assert (await sandbox.exec("cat data/f")).stdout == "prepared\n"
            await sandbox.exec("echo mine > data/f")  # each its own copy
        b = await manager.get("b")
        assert (await b.exec("cat data/f")).stdout == "mine\n"
        await manager.release("a")
        await manager.release("b")
        await snapshot.aclose()
    status, _ = _request(docker_engine, f"/images/{urllib.parse.quote(image)}/json")
    assert status == 404
    assert _our_containers(docker_engine) == []


@docker
async def test_snapshot_images_of_dead_owners_are_reaped(docker_engine: str) -> None:
    from hermes_async.tools.sandbox.docker import SNAPSHOT_LABEL, SNAPSHOT_REPOSITORY

    host = socket.gethostname()
    async with SandboxManager(DockerBackend(make_config())) as manager:
        sandbox = await manager.get("t")
        inner = sandbox.inner
        assert isinstance(inner, DockerSandbox)
        owners = {"dead": f"{host}/999999999/1", "foreign": "another-host/1/1"}
        for tag, owner in owners.items():
            await inner._container.commit(
                repository=SNAPSHOT_REPOSITORY,
                tag=f"reap-test-{tag}",
                changes=[f"LABEL {SNAPSHOT_LABEL}=1", f"LABEL {LABEL}.owner={owner}"],
            )
        mine = await inner.snapshot()  # this process's: alive, kept
    try:
        assert await reap_orphan_containers(docker_engine) >= 1

        def exists(ref: str) -> bool:
            return _request(docker_engine, f"/images/{urllib.parse.quote(ref)}/json")[0] == 200

        assert not exists(f"{SNAPSHOT_REPOSITORY}:reap-test-dead")
        assert exists(f"{SNAPSHOT_REPOSITORY}:reap-test-foreign")
        assert mine.spec.image is not None and exists(mine.spec.image)
    finally:
        await mine.aclose()
        import aiodocker

        client = aiodocker.Docker(url=docker_engine)
        try:
            await client.images.delete(f"{SNAPSHOT_REPOSITORY}:reap-test-foreign", force=True)
        finally:
            await client.close()
