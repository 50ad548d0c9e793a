"""The Daytona backend against the daytona SDK double (no network, no credentials)."""

from __future__ import annotations

import logging
import pathlib

import anyio
import pytest

from hermes_async.errors import ConfigError, SandboxError
from hermes_async.testing.daytona_double import DaytonaAuthenticationError, FakeDaytona
from hermes_async.testing.sandbox_conformance import CONFORMANCE_CHECKS
from hermes_async.tools.sandbox._remote import HERMES_LABEL, RUN_LABEL, TASK_LABEL
from hermes_async.tools.sandbox.backends import make_backend_factory, preflight_backend
from hermes_async.tools.sandbox.daytona import DaytonaBackend, DaytonaSandboxConfig
from hermes_async.tools.sandbox.errors import SandboxUnavailableError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    # The daytona SDK is asyncio-only (aiohttp); the trio case below overrides this with parametrize.
    return ("asyncio", {"debug": True})


def backend(fake: FakeDaytona, workdir: pathlib.Path, **overrides: object) -> DaytonaBackend:
    config = DaytonaSandboxConfig(workdir=str(workdir), home=str(workdir), **overrides)  # type: ignore[arg-type]
    return DaytonaBackend(config, daytona=fake)


@pytest.fixture
def fake(tmp_path: pathlib.Path) -> FakeDaytona:
    return FakeDaytona(workdir=str(tmp_path))


@pytest.mark.parametrize("name", sorted(CONFORMANCE_CHECKS))
async def test_conformance_on_the_double(
    tmp_path: pathlib.Path, fake: FakeDaytona, name: str
) -> None:
    factory = backend(fake, tmp_path)
    sb = await factory("conformance")
    try:
        await CONFORMANCE_CHECKS[name](sb)
    finally:
        await sb.aclose()
        await factory.aclose()
    assert fake.live == []


async def test_create_labels_and_settings(tmp_path: pathlib.Path, fake: FakeDaytona) -> None:
    factory = backend(
        fake,
        tmp_path,
        image="python:3.11-slim",
        block_network=True,
        env={"A": "1"},
        cpus=1.5,
        memory_mb=3000,
        sandbox_lifetime_seconds=600,
    )
    sb = await factory("task-7")
    try:
        params = fake.create_params[0]
        assert params.image == "python:3.11-slim"
        assert params.network_block_all is True
        assert params.env_vars == {"A": "1"}
        assert params.resources is not None
        assert (params.resources.cpu, params.resources.memory) == (2, 3)
        assert params.ttl_minutes == 10
        assert params.labels == {
            HERMES_LABEL: "1",
            RUN_LABEL: factory.run_id,
            TASK_LABEL: "task-7",
        }
        assert (await sb.exec("echo $A")).stdout == "1\n"
    finally:
        await sb.aclose()
    assert fake.live == []
    assert factory.live == set()


async def test_secrets_reach_neither_the_sandbox_nor_the_logs(
    tmp_path: pathlib.Path,
    fake: FakeDaytona,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DAYTONA_API_KEY", "dtn_sekrit_123")
    caplog.set_level(logging.DEBUG)
    factory = backend(fake, tmp_path, delete_timeout_seconds=0.2)
    sb = await factory("t")
    try:
        assert "dtn_sekrit_123" not in (await sb.exec("env")).stdout
    finally:
        fake.faults.hang.add("delete")  # a failing delete is logged: still without the key
        await sb.aclose()
        fake.faults.hang.discard("delete")
        await factory.aclose()
    assert "could not delete" in caplog.text
    assert "dtn_sekrit_123" not in caplog.text


async def test_cancel_during_create_deletes_the_sandbox(
    tmp_path: pathlib.Path,
) -> None:
    fake = FakeDaytona(workdir=str(tmp_path), create_delay_seconds=0.5)
    factory = backend(fake, tmp_path)
    with anyio.move_on_after(0.1) as scope:
        await factory("t")
    assert scope.cancelled_caught
    # The create was under way (the provider had made the sandbox) when the cancel came.
    assert len(fake.sandboxes) == 1
    assert fake.live == []
    assert factory.live == set()


async def test_create_timeout_is_an_error_and_sweeps_the_leftover(tmp_path: pathlib.Path) -> None:
    fake = FakeDaytona(workdir=str(tmp_path), hang={"create"})
    factory = backend(fake, tmp_path, create_timeout_seconds=0.3)
    start = anyio.current_time()
    with pytest.raises(SandboxError, match=r"did not finish within 0\.3 s.*DAYTONA_API_KEY"):
        await factory("t")
    assert anyio.current_time() - start < 5
    # The hung create had made a sandbox server-side; the sweep by task label removed it.
    assert len(fake.sandboxes) == 1
    assert fake.live == []


async def test_sdk_create_timeout_is_an_error(tmp_path: pathlib.Path) -> None:
    # The SDK's own create timeout (the create deadline) fires before ours returns.
    fake = FakeDaytona(workdir=str(tmp_path), create_delay_seconds=5)
    factory = backend(fake, tmp_path, create_timeout_seconds=0.2)
    with pytest.raises(SandboxError, match="did not finish within"):
        await factory("t")
    assert fake.live == []


async def test_create_failure_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    fake = FakeDaytona(
        workdir=str(tmp_path), fail={"create": DaytonaAuthenticationError("bad key", 401)}
    )
    with pytest.raises(SandboxError, match=r"not authenticated \(bad key\).*DAYTONA_API_KEY"):
        await backend(fake, tmp_path)("t")
    assert fake.sandboxes == {}


async def test_sandbox_dying_mid_rollout_is_unavailable(
    tmp_path: pathlib.Path, fake: FakeDaytona
) -> None:
    factory = backend(fake, tmp_path)
    sb = await factory("t")
    try:
        assert (await sb.exec("echo alive")).stdout == "alive\n"
        await fake.die(sb.sandbox_id)
        with pytest.raises(SandboxUnavailableError, match="gone") as info:
            await sb.exec("echo again")
        assert info.value.category == "infra"
        # Every later operation says the same.
        with pytest.raises(SandboxUnavailableError):
            await sb.read_bytes("x")
    finally:
        await sb.aclose()


async def test_sandbox_dying_during_a_command(tmp_path: pathlib.Path, fake: FakeDaytona) -> None:
    factory = backend(fake, tmp_path)
    sb = await factory("t")
    try:
        async with anyio.create_task_group() as tg:

            async def kill_soon() -> None:
                await anyio.sleep(0.3)
                await fake.die(sb.sandbox_id)

            tg.start_soon(kill_soon)
            with pytest.raises(SandboxUnavailableError):
                await sb.exec("sleep 30")
    finally:
        await sb.aclose()


async def test_hung_calls_hit_their_deadlines(tmp_path: pathlib.Path, fake: FakeDaytona) -> None:
    factory = backend(fake, tmp_path, call_timeout_seconds=0.3, delete_timeout_seconds=0.3)
    sb = await factory("t")
    fake.faults.hang.add("fs.upload_file")
    with pytest.raises(SandboxError, match=r"write .* did not answer within 0\.3 s"):
        await sb.write_bytes("x", b"1")
    fake.faults.hang.add("delete")
    start = anyio.current_time()
    await sb.aclose()
    assert anyio.current_time() - start < 5
    fake.faults.hang.clear()
    await factory.aclose()  # the reaper deletes what the hung kill left
    assert fake.live == []


async def test_creation_is_rate_limited(tmp_path: pathlib.Path) -> None:
    fake = FakeDaytona(workdir=str(tmp_path), create_delay_seconds=0.05)
    factory = backend(fake, tmp_path, max_creates_per_second=40.0, max_concurrent_creates=3)
    begin = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for i in range(9):
            tg.start_soon(factory, f"t{i}")
    assert fake.max_creates_in_flight <= 3
    assert max(fake.create_start_times) - begin >= 0.95 * 8 / 40
    await factory.aclose()  # the reaper deletes all nine (nobody held them)
    assert fake.live == []


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {}), id="trio")])
async def test_refused_under_trio(tmp_path: pathlib.Path, fake: FakeDaytona) -> None:
    with pytest.raises(ConfigError, match=r"daytona sandbox backend needs asyncio.*'trio'"):
        await backend(fake, tmp_path)("t")
    assert fake.sandboxes == {}


async def test_registry_and_preflight(
    tmp_path: pathlib.Path, fake: FakeDaytona, monkeypatch: pytest.MonkeyPatch
) -> None:
    factory = make_backend_factory(
        "daytona", daytona=fake, workdir=str(tmp_path), home=str(tmp_path)
    )
    assert isinstance(factory, DaytonaBackend)
    await preflight_backend("daytona", daytona=fake)  # a double brings its own credentials
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    monkeypatch.delenv("DAYTONA_JWT_TOKEN", raising=False)
    with pytest.raises(SandboxError, match=r"terminal_backend='daytona'.*DAYTONA_API_KEY"):
        await preflight_backend("daytona")
    monkeypatch.setenv("DAYTONA_API_KEY", "x")
    await preflight_backend("daytona")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) colour"):
        make_backend_factory("daytona", colour="red")
