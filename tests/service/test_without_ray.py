"""Ray is an extra: the core and the worker service import and run without it."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import hermes_async

BLOCK_RAY = """
import sys
class _NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None
sys.meta_path.insert(0, _NoRay())
"""

CHECK = """
import anyio, hermes_async
import hermes_async.agent, hermes_async.inference, hermes_async.parsers, hermes_async.tools
import hermes_async.service.worker, hermes_async.service.app, hermes_async.service.dispatch
import hermes_async.service.serve, hermes_async.service.config, hermes_async.service.ray
from hermes_async.service import RayWorkerPool, WorkerConfig
assert not any(m == "ray" or m.startswith("ray.") for m in sys.modules)

async def main():
    config = WorkerConfig(("echo=hermes_async.testing.worker_tasks:echo_task",), ("http://x",))
    try:
        async with RayWorkerPool(config, workers=1):
            pass
    except hermes_async.ConfigError as exc:
        print(exc)

anyio.run(main)
"""


def test_core_and_service_import_without_ray() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_RAY + CHECK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "the Ray worker mode needs Ray: pip install 'hermes-async[ray]'" in done.stdout


def test_only_the_ray_module_imports_ray() -> None:
    root = pathlib.Path(hermes_async.__file__).parent
    importers = sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if re.search(r"^\s*(import ray\b|from ray\b)", path.read_text(), re.M)
    )
    assert importers == ["service/ray.py"]
