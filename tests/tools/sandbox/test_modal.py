"""The Modal backend against the modal 1.6 double (no network, no credentials)."""

from __future__ import annotations

import io
import os
import pathlib
import tarfile

import anyio
import pytest

from hermes_async.errors import ConfigError, SandboxError
from hermes_async.testing.modal_double import AuthError, FakeModal, FakeSandbox
from hermes_async.testing.sandbox_conformance import CONFORMANCE_CHECKS, make_tar
from hermes_async.tools.sandbox.backends import make_backend_factory
from hermes_async.tools.sandbox.docker import DockerBackend
from hermes_async.tools.sandbox.modal import (
    CreationRateLimiter,
    ModalBackend,
    ModalSandbox,
    ModalSandboxConfig,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    # modal's client is asyncio-only; the trio case below overrides this with parametrize.
    return ("asyncio", {"debug": True})


def config(workdir: str, **overrides: object) -> ModalSandboxConfig:
    return ModalSandboxConfig(workdir=workdir, **overrides)  # type: ignore[arg-type]


async def create(fake: FakeModal, workdir: str, **overrides: object) -> ModalSandbox:
    return await ModalBackend(config(workdir, **overrides), modal=fake)("task-1")


def fake_handle(sb: ModalSandbox) -> FakeSandbox:
    handle = sb._sb
    assert isinstance(handle, FakeSandbox)
    return handle


async def test_create_exec_and_terminate(tmp_path: pathlib.Path) -> None:
    fake = FakeModal()
    sb = await create(fake, str(tmp_path), image="python:3.11-slim", cpus=2.0, memory_mb=1024)
    kwargs = fake.create_kwargs[0]
    assert kwargs["workdir"] == str(tmp_path)
    assert (kwargs["cpu"], kwargs["memory"], kwargs["block_network"]) == (2.0, 1024, False)
    assert fake.sandboxes[0].command == ["sleep", "infinity"]
    try:
        result = await sb.exec("echo out; echo err >&2; pwd; exit 3")
        assert (result.stdout, result.stderr, result.exit_code) == (
            f"out\n{tmp_path}\n",
            "err\n",
            3,
        )
        assert not result.timed_out
        result = await sb.exec('cat; echo "$GREETING"', stdin=b"piped\n", env={"GREETING": "hi"})
        assert result.stdout == "piped\nhi\n"
        (tmp_path / "sub").mkdir()
        assert (await sb.exec("pwd", cwd="sub")).stdout == f"{tmp_path}/sub\n"
        missing = await sb.exec("pwd", cwd="nope")
        assert missing.exit_code == 1
        assert "nope: No such file or directory" in missing.stderr
        # The host's secrets are not in the command's environment.
        os.environ["HERMES_TEST_SECRET"] = "s3cret"
        try:
            assert "s3cret" not in (await sb.exec("env")).stdout
        finally:
            del os.environ["HERMES_TEST_SECRET"]
    finally:
        await sb.aclose()
    assert fake.sandboxes[0].terminated
    assert fake.live_sandboxes == []
    await sb.aclose()  # idempotent
    with pytest.raises(SandboxError, match="closed"):
        await sb.exec("true")


async def test_timeout_kills_the_process_group(tmp_path: pathlib.Path) -> None:
    fake = FakeModal()
    async with await create(fake, str(tmp_path)) as sb:
        result = await sb.exec("sleep 30 & sleep 30; echo never", timeout=0.5)
        assert result.exit_code == 124
        assert result.timed_out
        assert "never" not in result.stdout
        assert fake_handle(sb).live_processes() == []
        assert result.duration_seconds < 10


async def test_cancelled_exec_kills_the_group(tmp_path: pathlib.Path) -> None:
    fake = FakeModal()
    async with await create(fake, str(tmp_path)) as sb:
        marker = tmp_path / "started"
        with anyio.move_on_after(0.8):
            await sb.exec(f"touch {marker}; sleep 30 & sleep 30")
        assert marker.exists()
        assert fake_handle(sb).live_processes() == []


async def test_output_is_capped_head_and_tail(tmp_path: pathlib.Path) -> None:
    async with await create(FakeModal(), str(tmp_path)) as sb:
        result = await sb.exec(
            "echo START; head -c 200000 /dev/zero | tr '\\0' x; echo; echo END", output_limit=1000
        )
        assert result.truncated
        assert result.stdout.startswith("START\n")
        assert result.stdout.endswith("END\n")
        assert "bytes of output omitted" in result.stdout
        assert len(result.stdout) < 1200


async def test_files_round_trip_and_archives(tmp_path: pathlib.Path) -> None:
    async with await create(FakeModal(), str(tmp_path)) as sb:
        blob = os.urandom(1 << 20)
        await sb.write_bytes("a/b/blob.bin", blob)
        assert await sb.read_bytes(f"{tmp_path}/a/b/blob.bin") == blob
        await sb.write_bytes("empty", b"")
        assert await sb.read_bytes("empty") == b""
        with pytest.raises(FileNotFoundError):
            await sb.read_bytes("missing.txt")
        with pytest.raises(FileNotFoundError):
            await sb.read_bytes("a")  # a directory

        archive = await sb.get_archive("a")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            assert "./b/blob.bin" in tar.getnames()
        await sb.put_archive("copy", archive)
        assert await sb.read_bytes("copy/b/blob.bin") == blob
        with pytest.raises(FileNotFoundError):
            await sb.get_archive("nothing-here")


async def test_a_cancelled_put_archive_removes_its_staged_tar(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled between upload and extraction, put_archive leaves no staged tar behind (the
    extracting script removes it only if it runs)."""
    async with await create(FakeModal(), str(tmp_path)) as sb:
        extracting = anyio.Event()
        real_sh = sb._sh

        async def extraction_hangs(script: str, *args: str) -> tuple[int, str, str]:
            if "tar -x" in script:
                extracting.set()
                await anyio.sleep_forever()
            return await real_sh(script, *args)

        monkeypatch.setattr(sb, "_sh", extraction_hangs)

        def staged() -> set[pathlib.Path]:
            return set(pathlib.Path(sb.exec_dir).glob("*.tar"))

        before = staged()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sb.put_archive, "copy", make_tar({"a.txt": b"x"}))
            with anyio.fail_after(30):
                await extracting.wait()
            assert len(staged() - before) == 1  # uploaded, not extracted yet
            tg.cancel_scope.cancel("test: the rollout ends mid-transfer")
        assert staged() - before == set()
        assert not (tmp_path / "copy").exists()


@pytest.mark.parametrize("name", ["../evil.txt", "/etc/evil.txt", "ok/../../evil.txt"])
async def test_put_archive_rejects_traversal(tmp_path: pathlib.Path, name: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    async with await create(FakeModal(), str(tmp_path / "w")) as sb:
        with pytest.raises(ValueError, match=r"escapes|absolute"):
            await sb.put_archive(".", buf.getvalue())


async def test_creation_respects_rate_and_concurrency(tmp_path: pathlib.Path) -> None:
    fake = FakeModal(create_delay_seconds=0.05)
    backend = ModalBackend(
        config(str(tmp_path), max_creates_per_second=40.0, max_concurrent_creates=3), modal=fake
    )
    sandboxes: list[ModalSandbox] = []

    async def one(i: int) -> None:
        sandboxes.append(await backend(f"task-{i}"))

    begin = anyio.current_time()
    try:
        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
    finally:
        for sb in sandboxes:
            await sb.aclose()
    assert len(fake.sandboxes) == 12
    assert fake.max_creates_in_flight <= 3
    assert backend.rate_limiter.max_in_flight == 3
    # Start slots are spaced 1/rate apart, so the 12th start cannot come before 11/40 s.
    # (Gaps between individual starts are not asserted: scheduling jitter on a loaded machine
    # can delay one start and bring it closer to the next.)
    assert max(fake.create_start_times) - begin >= 0.95 * 11 / 40


async def test_rate_limiter_releases_on_cancel() -> None:
    limiter = CreationRateLimiter(rate=1.0, concurrency=1)
    async with limiter:
        pass
    with anyio.move_on_after(0.1):
        async with limiter:  # waits ~1 s for its start slot: cancelled while waiting
            pytest.fail("the second start must wait for its slot")
    assert limiter.in_flight == 0
    assert limiter._limiter is not None and limiter._limiter.borrowed_tokens == 0


async def test_hung_create_hits_the_deadline(tmp_path: pathlib.Path) -> None:
    fake = FakeModal(hang={"Sandbox.create"})
    start = anyio.current_time()
    with pytest.raises(SandboxError, match=r"did not finish within 0\.3 s.*modal token"):
        await create(fake, str(tmp_path), create_timeout=0.3)
    assert anyio.current_time() - start < 5
    assert fake.creates_in_flight == 0


async def test_hung_calls_hit_their_deadline(tmp_path: pathlib.Path) -> None:
    fake = FakeModal()
    async with await create(fake, str(tmp_path), call_timeout=0.3) as sb:
        fake.faults.hang.add("filesystem.read_bytes")
        with pytest.raises(SandboxError, match=r"did not answer a read of .* within 0\.3 s"):
            await sb.read_bytes("x")
        fake.faults.hang.add("exec")
        with pytest.raises(SandboxError, match=r"did not answer an exec within 0\.3 s"):
            await sb.exec("true")


async def test_hung_terminate_is_bounded(tmp_path: pathlib.Path) -> None:
    fake = FakeModal(hang={"terminate"})
    sb = await create(fake, str(tmp_path), terminate_timeout=0.2)
    start = anyio.current_time()
    await sb.aclose()
    assert anyio.current_time() - start < 5


async def test_auth_failure_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    fake = FakeModal(fail={"App.lookup": AuthError("Token missing")})
    with pytest.raises(SandboxError, match=r"not authenticated.*MODAL_TOKEN_ID"):
        await create(fake, str(tmp_path))


async def test_double_refuses_the_blocking_interface() -> None:
    with pytest.raises(RuntimeError, match=r"Sandbox\.create\.aio"):
        FakeModal().Sandbox.create("sleep", "infinity")


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {}), id="trio")])
async def test_refused_under_trio(tmp_path: pathlib.Path) -> None:
    fake = FakeModal()
    with pytest.raises(ConfigError, match=r"modal sandbox backend needs asyncio.*'trio'"):
        await create(fake, str(tmp_path))
    assert fake.create_start_times == []


async def test_backend_selector_builds_each_kind(tmp_path: pathlib.Path) -> None:
    fake = FakeModal()
    factory = make_backend_factory("modal", modal=fake, workdir=str(tmp_path), cpus=0.5)
    sb = await factory("selected")
    try:
        assert isinstance(sb, ModalSandbox)
        assert (await sb.exec("echo ok")).stdout == "ok\n"
        assert fake.create_kwargs[0]["cpu"] == 0.5
    finally:
        await sb.aclose()
    docker_factory = make_backend_factory("docker", image="busybox:local", network_mode="bridge")
    assert isinstance(docker_factory, DockerBackend)
    assert docker_factory.config.network_mode == "bridge"
    assert callable(make_backend_factory("local"))


def test_backend_selector_rejects_unknown_kinds_and_options() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown terminal_backend 'dokcer'; available: local, docker, modal"
    ):
        make_backend_factory("dokcer")
    with pytest.raises(
        ConfigError,
        match=r"unknown option\(s\) colour for terminal_backend='docker'; valid: .*image",
    ):
        make_backend_factory("docker", colour="red")
    with pytest.raises(ConfigError, match=r"ModalSandboxConfig.call_timeout must be > 0"):
        make_backend_factory("modal", call_timeout=0)


@pytest.mark.parametrize("name", sorted(CONFORMANCE_CHECKS))
async def test_conformance_on_the_double(tmp_path: pathlib.Path, name: str) -> None:
    """The same conformance checks as local and Docker (bounded output and background logs,
    streamed transfers, unsafe archives refused), on the Modal double."""
    sb = await create(FakeModal(), str(tmp_path))
    try:
        await CONFORMANCE_CHECKS[name](sb)
    finally:
        await sb.aclose()
