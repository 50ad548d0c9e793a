"""The backend registry behind ``terminal_backend``."""

from __future__ import annotations

import pytest

from hermes_async.errors import ConfigError
from hermes_async.testing.fake_sandbox import FakeSandboxFactory
from hermes_async.tools.sandbox import backends
from hermes_async.tools.sandbox.backends import (
    BACKEND_KINDS,
    available_backends,
    make_backend_factory,
    register_backend,
)
from hermes_async.tools.sandbox.manager import SandboxFactory, SandboxManager

pytestmark = pytest.mark.anyio


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test are forgotten after it."""
    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))


def test_builtins_are_registered_in_order() -> None:
    assert available_backends()[:7] == BACKEND_KINDS
    assert BACKEND_KINDS == ("local", "docker", "modal", "ssh", "singularity", "e2b", "daytona")


@pytest.mark.usefixtures("registry")
async def test_a_registered_backend_is_built_with_its_options() -> None:
    seen: dict[str, object] = {}

    def build_fake(*, latency: float = 0.0) -> SandboxFactory:
        seen["latency"] = latency
        return FakeSandboxFactory(exec_script={"*": "from the fake backend"})

    register_backend("fake", build_fake)
    assert "fake" in available_backends()
    factory = make_backend_factory("fake", latency=0.5)
    assert seen == {"latency": 0.5}
    async with SandboxManager(factory) as manager:
        sandbox = await manager.get("t")
        assert (await sandbox.exec("x")).stdout == "from the fake backend"
    with pytest.raises(ConfigError, match=r"invalid option for terminal_backend='fake'.*colour"):
        make_backend_factory("fake", colour="red")
    with pytest.raises(ValueError, match="'fake' is already registered; pass replace=True"):
        register_backend("fake", build_fake)
    register_backend("fake", lambda: FakeSandboxFactory(), replace=True)
    with pytest.raises(ConfigError, match=r"unknown terminal_backend 'nope'; available: .*fake"):
        make_backend_factory("nope")
    with pytest.raises(ValueError, match="non-empty name"):
        register_backend("", build_fake)


def test_bad_local_option_is_config_error() -> None:
    with pytest.raises(ConfigError, match=r"invalid option for terminal_backend='local'"):
        make_backend_factory("local", image="python")


@pytest.mark.parametrize(
    ("kind", "field"),
    [("docker", "image"), ("modal", "image"), ("e2b", "template"), ("daytona", "image")],
)
@pytest.mark.parametrize("bad", ["", "   ", 3])
def test_what_sandboxes_are_built_from_must_be_named(kind: str, field: str, bad: object) -> None:
    # Before: an empty Modal / Daytona image or E2B template (and a non-string Docker image)
    # was accepted and failed at the first creation, inside a rollout.
    with pytest.raises(ConfigError, match=rf"\.{field} must be a non-empty string"):
        make_backend_factory(kind, **{field: bad})
