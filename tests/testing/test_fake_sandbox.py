from __future__ import annotations

import io
import tarfile

import anyio
import pytest

from hermes_async.errors import SandboxError
from hermes_async.testing.fake_sandbox import FakeSandbox, FakeSandboxFactory
from hermes_async.testing.sandbox_conformance import (
    check_archive_rejects_traversal,
    check_read_missing_raises,
    make_tar,
)
from hermes_async.tools.sandbox.base import ExecResult
from hermes_async.tools.sandbox.manager import SandboxManager

pytestmark = pytest.mark.anyio


async def test_scripted_exec_mapping_and_fallback() -> None:
    fake = FakeSandbox(
        exec_script={
            "pytest -q": ExecResult("1 passed\n", "", 0),
            "make": "built\n",
            "boom": SandboxError("lost"),
        }
    )
    assert (await fake.exec("pytest -q")).stdout == "1 passed\n"
    assert (await fake.exec("make")) == ExecResult("built\n", "", 0)
    r = await fake.exec("unknown")
    assert r.exit_code == 127 and "not scripted: unknown" in r.stderr
    with pytest.raises(SandboxError, match="lost"):
        await fake.exec("boom")
    assert fake.commands == ["pytest -q", "make", "unknown", "boom"]
    fallback = FakeSandbox(exec_script={"*": ExecResult("", "nope", 2)})
    assert (await fallback.exec("anything")).exit_code == 2


async def test_scripted_exec_callable_sync_and_async() -> None:
    sync_fake = FakeSandbox(exec_script=lambda cmd: cmd.upper())
    assert (await sync_fake.exec("echo")).stdout == "ECHO"

    async def script(cmd: str) -> ExecResult:
        await anyio.sleep(0)
        return ExecResult("", "failed", 1)

    r = await FakeSandbox(exec_script=script).exec("x", cwd="/w", env={"A": "1"}, stdin=b"in")
    assert r.exit_code == 1
    bad = FakeSandbox(exec_script=lambda cmd: 42)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="expected ExecResult or str"):
        await bad.exec("x")


async def test_faults() -> None:
    with pytest.raises(SandboxError, match="down"):
        await FakeSandbox(exec_error=SandboxError("down")).exec("x")
    hang = FakeSandbox(exec_hangs=True)
    with anyio.move_on_after(0.05) as scope:
        await hang.exec("x")
    assert scope.cancelled_caught
    slow = FakeSandbox(latency=10)
    r = await slow.exec("x", timeout=0.05)
    assert r.timed_out and r.exit_code == 124
    closed = FakeSandbox()
    await closed.aclose()
    await closed.aclose()
    assert closed.close_count == 2
    with pytest.raises(SandboxError, match="closed"):
        await closed.exec("x")


async def test_files_and_archives() -> None:
    fake = FakeSandbox(files={"a.txt": "alpha", "/abs/b": b"\0"}, exec_script={"*": "0\n"})
    assert await fake.read_bytes("/work/a.txt") == b"alpha"
    assert await fake.read_bytes("/abs/b") == b"\0"
    await fake.write_bytes("d/c.bin", b"\xff")
    await check_read_missing_raises(fake)
    await fake.put_archive("x", make_tar({"one": b"1", "sub/two": b"22"}))
    data = await fake.get_archive("x")
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert sorted(tf.getnames()) == ["./one", "./sub/two"]
    await check_archive_rejects_traversal(fake)


async def test_background_records() -> None:
    fake = FakeSandbox()
    proc = await fake.start_background("server")
    assert (await fake.background_status(proc.session_id)).running
    await fake.write_background_stdin(proc.session_id, b"hi")
    await fake.close_background_stdin(proc.session_id)
    assert fake.stdin_writes[proc.session_id] == [b"hi"] and proc.session_id in fake.stdin_closed
    fake.finish_background(proc.session_id, 2, "bye")
    status = await fake.background_status(proc.session_id)
    assert not status.running and status.exit_code == 2 and status.output == "bye"
    assert await fake.kill_background(proc.session_id) is False
    with pytest.raises(OSError, match="has exited"):
        await fake.write_background_stdin(proc.session_id, b"x")


async def test_factory_create_faults() -> None:
    factory = FakeSandboxFactory(fail_create=SandboxError("no capacity"), fail_times=1)
    async with SandboxManager(factory) as manager:
        with pytest.raises(SandboxError, match="no capacity"):
            await manager.get("t")
        sb = await manager.get("t")
        assert sb.inner is factory.created[0] and factory.attempts == 2


class TestVirtualClock:
    """Scripted latency is anyio.sleep, so trio's autojumping MockClock makes it instant."""

    @pytest.fixture
    def anyio_backend(self) -> tuple[str, dict[str, object]]:
        import trio.testing

        return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})

    async def test_minutes_of_latency_in_no_time(self) -> None:
        import time

        fake = FakeSandbox(exec_script={"*": "ok"}, latency=lambda cmd: 60.0)
        factory = FakeSandboxFactory(sandbox=fake, create_latency=120)
        wall = time.monotonic()
        async with SandboxManager(factory, idle_timeout=None) as manager:
            sb = await manager.get("t")
            virtual = anyio.current_time()
            for _ in range(5):
                assert (await sb.exec("x")).stdout == "ok"
            assert anyio.current_time() - virtual == pytest.approx(300)
        assert time.monotonic() - wall < 5


async def test_output_limit_and_recorded_requests_and_closes() -> None:
    fake = FakeSandbox(exec_script={"*": "a" * 100 + "b" * 100})
    r = await fake.exec("big", output_limit=20, env={"K": "v"})
    assert r.truncated
    assert r.stdout == "a" * 10 + "\n\n... [180 bytes of output omitted] ...\n\n" + "b" * 10
    (call,) = fake.calls
    assert (call.command, call.env, call.output_limit) == ("big", {"K": "v"}, 20)
    assert not (await fake.exec("big")).truncated
    await fake.aclose(interrupted=True)
    await fake.aclose()
    assert fake.closes == [True, False] and fake.close_count == 2
