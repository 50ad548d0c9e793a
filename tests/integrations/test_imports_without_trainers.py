"""The core, and each adapter module's name, import where no trainer package can.

A fresh interpreter whose import system refuses the trainers and their heavy dependencies
(nemo_gym, verl, skyrl, skyrl_gym, trl, slime, torch, ray) imports the core packages and every
``hermes_async.integrations`` module. Only the verl adapter subclasses its trainer's class at
import time; it must fail naming the extra to install. Nothing else may need a trainer until
used, and Gym's own agent class, asked for, names its extra too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("nemo_gym", "verl", "skyrl", "skyrl_gym", "trl", "slime", "torch", "ray")
MODULES = (
    "hermes_async",
    "hermes_async.agent",
    "hermes_async.inference",
    "hermes_async.parsers",
    "hermes_async.tools",
    "hermes_async.integrations",
    "hermes_async.integrations._rollouts",
    "hermes_async.integrations.nemo_gym",
    "hermes_async.integrations.skyrl",
    "hermes_async.integrations.slime",
    "hermes_async.integrations.trl",
    "hermes_async.integrations.verl",
)

SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.abc, json, sys

    BLOCKED = {blocked!r}


    class NoTrainers(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked for this test: {{name}}")
            return None


    sys.meta_path.insert(0, NoTrainers())
    results = {{}}
    for name in {modules!r}:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            results[name] = str(exc)
        else:
            results[name] = None
    try:
        from hermes_async.integrations.nemo_gym import HermesGymAgent  # noqa: F401
    except ImportError as exc:
        results["HermesGymAgent"] = str(exc)
    else:
        results["HermesGymAgent"] = None
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps({{"results": results, "loaded": loaded}}))
    """
)


def test_no_trainer_package_is_needed_until_an_adapter_is_used() -> None:
    script = SCRIPT.format(blocked=BLOCKED, modules=MODULES)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    results = report["results"]
    verl_error = results.pop("hermes_async.integrations.verl")
    gym_error = results.pop("HermesGymAgent")
    assert results == {name: None for name in MODULES if name != "hermes_async.integrations.verl"}
    assert verl_error is not None and "pip install 'hermes-async[verl]'" in verl_error
    assert gym_error is not None and "pip install 'hermes-async[nemo-gym]'" in gym_error
    assert report["loaded"] == []
