"""The asynchronous-RL embedding examples run: asyncio's on asyncio, trio's on trio (#20)."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["async_rl_asyncio.py", "async_rl_trio.py"])
def test_embedding_example_runs_groups_through_aborts(name: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--seconds", "5", "--abort-every", "0.5"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    totals = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert totals["groups"] >= 1, done.stdout
    assert totals["version"] >= 2  # the trainer kept updating while groups ran
    assert totals["resumes"] >= 1  # and aborted generations were resumed, not failed
    assert not any(key.startswith("outcome_masked") for key in totals)
