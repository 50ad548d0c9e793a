"""The E2B backend against the e2b SDK double (no network, no credentials)."""

from __future__ import annotations

import importlib.util
import logging
import pathlib

import pytest

from hermes_async.errors import ConfigError, SandboxError
from hermes_async.testing.e2b_double import AuthenticationException, FakeE2B
from hermes_async.testing.sandbox_conformance import CONFORMANCE_CHECKS
from hermes_async.tools.sandbox._remote import HERMES_LABEL, RUN_LABEL, TASK_LABEL
from hermes_async.tools.sandbox.backends import make_backend_factory, preflight_backend
from hermes_async.tools.sandbox.e2b import E2BBackend, E2BSandboxConfig

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    # The e2b SDK is asyncio-only; the trio case below overrides this with parametrize.
    return ("asyncio", {"debug": True})


def backend(fake: FakeE2B, workdir: pathlib.Path, **overrides: object) -> E2BBackend:
    config = E2BSandboxConfig(workdir=str(workdir), home=str(workdir), **overrides)  # type: ignore[arg-type]
    return E2BBackend(config, e2b=fake)


@pytest.fixture
def fake(tmp_path: pathlib.Path) -> FakeE2B:
    return FakeE2B(workdir=str(tmp_path))


@pytest.mark.parametrize("name", sorted(CONFORMANCE_CHECKS))
async def test_conformance_on_the_double(tmp_path: pathlib.Path, fake: FakeE2B, name: str) -> None:
    factory = backend(fake, tmp_path)
    sb = await factory("conformance")
    try:
        await CONFORMANCE_CHECKS[name](sb)
    finally:
        await sb.aclose()
        await factory.aclose()
    assert fake.live == []


async def test_create_labels_and_settings(tmp_path: pathlib.Path, fake: FakeE2B) -> None:
    factory = backend(fake, tmp_path, template="py311", block_network=True, env={"A": "1"})
    sb = await factory("task-7")
    try:
        kwargs = fake.create_kwargs[0]
        assert kwargs["template"] == "py311"
        assert kwargs["allow_internet_access"] is False
        assert kwargs["envs"] == {"A": "1"}
        assert kwargs["metadata"] == {
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
    fake: FakeE2B,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("E2B_API_KEY", "e2b_sekrit_123")
    caplog.set_level(logging.DEBUG)
    factory = backend(fake, tmp_path, delete_timeout=0.2)
    sb = await factory("t")
    try:
        assert "e2b_sekrit_123" not in (await sb.exec("env")).stdout
    finally:
        fake.faults.hang.add("kill")  # a failing delete is logged: still without the key
        await sb.aclose()
        fake.faults.hang.discard("kill")
        await factory.aclose()
    assert "could not delete" in caplog.text
    assert "e2b_sekrit_123" not in caplog.text


async def test_create_failure_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    fake = FakeE2B(workdir=str(tmp_path), fail={"create": AuthenticationException("bad key")})
    with pytest.raises(SandboxError, match=r"not authenticated \(bad key\).*E2B_API_KEY"):
        await backend(fake, tmp_path)("t")
    assert fake.sandboxes == {}


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {}), id="trio")])
async def test_refused_under_trio(tmp_path: pathlib.Path, fake: FakeE2B) -> None:
    with pytest.raises(ConfigError, match=r"e2b sandbox backend needs asyncio.*'trio'"):
        await backend(fake, tmp_path)("t")
    assert fake.sandboxes == {}


async def test_registry_and_preflight(
    tmp_path: pathlib.Path, fake: FakeE2B, monkeypatch: pytest.MonkeyPatch
) -> None:
    factory = make_backend_factory(
        "e2b", e2b=fake, run_id="resumed-run", workdir=str(tmp_path), home=str(tmp_path)
    )
    assert isinstance(factory, E2BBackend)
    assert factory.run_id == "resumed-run"
    await preflight_backend("e2b", e2b=fake)  # a double brings its own credentials
    with pytest.raises(ConfigError, match=r"unknown option\(s\) colour"):
        make_backend_factory("e2b", colour="red")
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    if importlib.util.find_spec("e2b") is None:  # the [e2b] extra is not installed
        with pytest.raises(ConfigError, match=r"pip install 'hermes-async\[e2b\]'"):
            await preflight_backend("e2b")
        return
    with pytest.raises(SandboxError, match=r"terminal_backend='e2b'.*E2B_API_KEY"):
        await preflight_backend("e2b")
    monkeypatch.setenv("E2B_API_KEY", "x")
    await preflight_backend("e2b")
