"""The Daytona backend against the daytona SDK double (no network, no credentials)."""

from __future__ import annotations

import importlib.util
import logging
import pathlib

import pytest

from hermes_async.errors import ConfigError, SandboxError
from hermes_async.testing.daytona_double import DaytonaAuthenticationError, FakeDaytona
from hermes_async.testing.sandbox_conformance import CONFORMANCE_CHECKS
from hermes_async.tools.sandbox._remote import HERMES_LABEL, RUN_LABEL, TASK_LABEL
from hermes_async.tools.sandbox.backends import make_backend_factory, preflight_backend
from hermes_async.tools.sandbox.daytona import DaytonaBackend, DaytonaSandboxConfig

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
    factory = backend(fake, tmp_path, delete_timeout=0.2)
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


async def test_create_failure_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    fake = FakeDaytona(
        workdir=str(tmp_path), fail={"create": DaytonaAuthenticationError("bad key", 401)}
    )
    with pytest.raises(SandboxError, match=r"not authenticated \(bad key\).*DAYTONA_API_KEY"):
        await backend(fake, tmp_path)("t")
    assert fake.sandboxes == {}


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
    with pytest.raises(ConfigError, match=r"unknown option\(s\) colour"):
        make_backend_factory("daytona", colour="red")
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    monkeypatch.delenv("DAYTONA_JWT_TOKEN", raising=False)
    if importlib.util.find_spec("daytona") is None:  # the [daytona] extra is not installed
        with pytest.raises(ConfigError, match=r"pip install 'hermes-async\[daytona\]'"):
            await preflight_backend("daytona")
        return
    with pytest.raises(SandboxError, match=r"terminal_backend='daytona'.*DAYTONA_API_KEY"):
        await preflight_backend("daytona")
    monkeypatch.setenv("DAYTONA_API_KEY", "x")
    await preflight_backend("daytona")
