"""The singularity backend against the stand-in CLI (hermes_async.testing.apptainer_standin).

Not a real Apptainer: the stand-in runs commands as host processes (the local backend's
process isolation: a marker variable and /proc), so workdir and home point at private host
directories here. What these tests check is the backend's side: the CLI calls, timeouts and
kills, cancellation during start, the stop on close, and the conformance suite.
"""

from __future__ import annotations

import json
import pathlib

import anyio
import pytest

from hermes_async.errors import ConfigError, SandboxError
from hermes_async.testing.apptainer_standin import write_launcher
from hermes_async.testing.sandbox_conformance import CONFORMANCE_CHECKS, ConformanceCheck
from hermes_async.tools.sandbox.apptainer import (
    ApptainerBackend,
    ApptainerSandbox,
    ApptainerSandboxConfig,
)
from hermes_async.tools.sandbox.backends import make_backend_factory, preflight_backend
from hermes_async.tools.sandbox.errors import SandboxUnavailableError
from hermes_async.tools.sandbox.processes import find_sandbox_processes
from hermes_async.tools.sandbox.spec import SandboxSpec

pytestmark = pytest.mark.anyio


class World:
    def __init__(self, tmp_path: pathlib.Path) -> None:
        self.state = tmp_path / "instances"
        self.launcher = write_launcher(tmp_path / "bin", state_dir=self.state)
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.home = tmp_path / "home"
        self.scratch = tmp_path / "scratch"
        self.scratch.mkdir()

    def config(self, **overrides: object) -> ApptainerSandboxConfig:
        settings: dict[str, object] = {
            "executable": str(self.launcher),
            "image": "docker://busybox:latest",
            "workdir": str(self.work),
            "home": str(self.home),
            "scratch_dir": str(self.scratch),
            "default_exec_timeout": 60.0,
        }
        settings.update(overrides)
        return ApptainerSandboxConfig(**settings)  # type: ignore[arg-type]

    def instances(self) -> list[str]:
        return sorted(p.stem for p in self.state.glob("*.json"))

    def assert_clean(self) -> None:
        assert self.instances() == []
        assert list(self.scratch.iterdir()) == []


@pytest.fixture
def world(tmp_path: pathlib.Path) -> World:
    return World(tmp_path)


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS.values(), ids=CONFORMANCE_CHECKS.keys())
async def test_conformance(world: World, check: ConformanceCheck) -> None:
    sb = await ApptainerBackend(world.config())("conformance")
    try:
        await check(sb)
    finally:
        with anyio.move_on_after(30, shield=True):
            await sb.aclose()
    world.assert_clean()


async def test_start_exec_and_stop_through_the_cli(world: World) -> None:
    backend = ApptainerBackend(world.config(env={"GREETING": "hi"}))
    sb = await backend("task-1")
    assert isinstance(sb, ApptainerSandbox)
    info = json.loads((world.state / f"{sb.name}.json").read_text())
    assert info["image"] == "docker://busybox:latest"
    try:
        r = await sb.exec('echo "$GREETING $HOME"; pwd; echo err >&2; exit 3')
        assert (r.stdout, r.stderr, r.exit_code) == (
            f"hi {world.home}\n{world.work}\n",
            "err\n",
            3,
        )
        r = await sb.exec("sleep 3401 & sleep 3402", timeout=1)
        assert (r.exit_code, r.timed_out) == (124, True)
        assert find_sandbox_processes(sb.name)  # the instance's init
        r = await sb.exec("tr '\\0' ' ' < /proc/$$/environ")
        assert "HERMES_ASYNC_SANDBOX" in r.stdout
    finally:
        await sb.aclose()
    assert find_sandbox_processes(sb.name) == []
    world.assert_clean()
    with pytest.raises(SandboxError, match="closed"):
        await sb.exec("true")


async def test_cancel_during_start_still_stops_the_instance(world: World) -> None:
    backend = ApptainerBackend(world.config(start_args=["--standin-start-delay", "5"]))
    with anyio.move_on_after(1.0) as scope:
        await backend("slow")
    assert scope.cancelled_caught
    world.assert_clean()
    assert find_sandbox_processes("hermes-slow", marker_prefix=True) == []


async def test_failed_start_is_a_sandbox_error(world: World) -> None:
    backend = ApptainerBackend(world.config(start_args=["--standin-fail"]))
    with pytest.raises(SandboxError, match=r"instance start of 'docker://busybox:latest' failed"):
        await backend("fails")
    world.assert_clean()
    with pytest.raises(SandboxError, match="could not open image"):
        await ApptainerBackend(world.config(image=str(world.scratch / "missing.sif")))("x")


async def test_instance_stopped_from_outside_is_unavailable(world: World) -> None:
    backend = ApptainerBackend(world.config())
    sb = await backend("outside")
    try:
        assert await backend.stop(sb.name, force=True)
        with pytest.raises(SandboxUnavailableError, match="no longer running"):
            await sb.exec("true")
    finally:
        await sb.aclose()
    world.assert_clean()


async def test_registered_as_singularity_with_preflight(world: World) -> None:
    options = {
        "executable": str(world.launcher),
        "workdir": str(world.work),
        "home": str(world.home),
    }
    await preflight_backend("singularity", **options)
    factory = make_backend_factory("singularity", **options)
    sb = await factory("registry")
    try:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    finally:
        await sb.aclose()
    with pytest.raises(ConfigError, match=r"needs the /nonexistent/apptainer executable"):
        make_backend_factory("singularity", executable="/nonexistent/apptainer")
    with pytest.raises(ConfigError, match=r"needs the /nonexistent/apptainer executable"):
        await preflight_backend("singularity", executable="/nonexistent/apptainer")


async def test_cancelled_exec_kills_the_group_inside(world: World) -> None:
    backend = ApptainerBackend(world.config())
    sb = await backend("cancel-exec")
    try:
        init = set(find_sandbox_processes(sb.name))
        with anyio.move_on_after(1.5) as scope:
            await sb.exec("touch started; sleep 3403 & sleep 3404")
        assert scope.cancelled_caught
        assert (await sb.exec("test -e started")).exit_code == 0
        assert set(find_sandbox_processes(sb.name)) == init  # only the instance's init is left
    finally:
        await sb.aclose()
    world.assert_clean()


async def test_spec_image_env_workdir(world: World) -> None:
    sif = world.scratch.parent / "task.sif"
    sif.write_bytes(b"SIF")
    spec = SandboxSpec(image=str(sif), env={"X": "1"}, workdir=str(world.work / "app"))
    sb = await ApptainerBackend(world.config())("spec", spec=spec)
    try:
        assert json.loads((world.state / f"{sb.name}.json").read_text())["image"] == str(sif)
        assert (await sb.exec('pwd; echo "$X"')).stdout == f"{world.work}/app\n1\n"
    finally:
        await sb.aclose()
    world.assert_clean()
