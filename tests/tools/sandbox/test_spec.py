"""Per-item sandboxes: a SandboxSpec reaches the backend through the manager (local, Modal)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_async.errors import ConfigError
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.local import local_factory
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.sandbox.spec import SandboxSpec, accepts_spec

pytestmark = pytest.mark.anyio


async def test_local_spec_sets_env_and_workdir_and_is_forgotten_on_release(
    tmp_path: Path,
) -> None:
    spec = SandboxSpec(workdir="/app/src", env={"TASK_MODE": "strict"})
    async with SandboxManager(local_factory(str(tmp_path))) as manager:
        manager.assign_spec("a", spec)
        sandbox = await manager.get("a")
        done = await sandbox.exec('pwd; echo "$TASK_MODE"')
        assert done.stdout.split() == [sandbox.workdir, "strict"]
        assert sandbox.workdir.endswith("/work/app/src")
        other = await manager.get("b")  # no spec: the factory's defaults
        assert (await other.exec('echo "[$TASK_MODE]"')).stdout.strip() == "[]"
        await manager.release("a")
        assert manager.spec_for("a") is None
        again = await manager.get("a")  # a new sandbox for the id, from the defaults
        assert (await again.exec('echo "[$TASK_MODE]"')).stdout.strip() == "[]"


async def test_a_factory_without_spec_keyword_is_refused_by_name(tmp_path: Path) -> None:
    inner = local_factory(str(tmp_path))

    async def plain(task_id: str) -> Sandbox:
        return await inner(task_id)

    assert not accepts_spec(plain) and accepts_spec(inner)
    async with SandboxManager(plain) as manager:
        with pytest.raises(ConfigError, match="takes no spec= keyword"):
            manager.assign_spec("a", SandboxSpec(cpus=1))


def test_spec_validates_its_fields(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="workdir must be absolute"):
        SandboxSpec(workdir="app")
    with pytest.raises(ConfigError, match="has no Dockerfile"):
        SandboxSpec(build_context=tmp_path)
    with pytest.raises(ConfigError, match="cpus must be > 0"):
        SandboxSpec(cpus=0)
    with pytest.raises(ConfigError, match="memory_mb must be >= 1"):
        SandboxSpec(memory_mb=0)


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {}), id="asyncio")])
async def test_modal_spec_reaches_the_create_call(anyio_backend: object) -> None:
    from hermes_async.testing.modal_double import FakeModal
    from hermes_async.tools.sandbox.modal import ModalBackend, ModalSandboxConfig

    modal = FakeModal()
    backend = ModalBackend(ModalSandboxConfig(), modal=modal)
    spec = SandboxSpec(image="task:1", cpus=0.5, memory_mb=768, network_mode="none", workdir="/srv")
    async with SandboxManager(backend) as manager:
        manager.assign_spec("t", spec)
        sandbox = await manager.get("t")
        assert sandbox.workdir == "/srv"
        default = await manager.get("u")
    first, second = modal.create_kwargs
    assert (first["cpu"], first["memory"], first["block_network"]) == (0.5, 768, True)
    assert first["workdir"] == "/srv" and getattr(first["image"], "tag", None) == "task:1"
    assert (second["cpu"], second["memory"]) == (1.0, 5120) and default.workdir == "/root"


def test_modal_refuses_a_local_build_context(tmp_path: Path) -> None:
    from hermes_async.tools.sandbox.modal import ModalSandboxConfig, modal_config_for

    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(ConfigError, match="cannot build"):
        modal_config_for(ModalSandboxConfig(), SandboxSpec(build_context=tmp_path))
