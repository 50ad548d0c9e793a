"""The trainer examples in examples/trainers run and solve their task (docs/trainers/).

Each runs as a script, as a reader would run it, against the scripted model on loopback. The
verl example needs verl: tests/trainers/test_verl_package.py runs it in verl's venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "trainers"


def run_example(name: str) -> dict:
    """Run ``examples/trainers/<name>``; its last stdout line, as JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_nemo_gym_example() -> None:
    out = run_example("nemo_gym_example.py")
    assert out["reward"] == 1.0 and out["mask_sample"] is False
    assert out["turns"] == 3 and out["items"].count("function_call") == 2


def test_the_skyrl_example() -> None:
    out = run_example("skyrl_example.py")
    assert out["rewards"] == [1.0, 1.0] and out["stop_reasons"] == ["stop", "stop"]
    # Fewer sampled ids than response ids: tool results are in the response, masked.
    assert all(
        0 < s < r for s, r in zip(out["sampled_tokens"], out["response_tokens"], strict=True)
    )


def test_the_slime_example() -> None:
    out = run_example("slime_example.py")
    assert out["reward"] == 1.0 and out["status"] == "COMPLETED"
    assert 0 < out["sampled_tokens"] < out["response_length"]


def test_the_trl_example() -> None:
    out = run_example("trl_example.py")
    assert out["rewards"] == [1.0, 1.0] and out["statuses"] == ["completed", "completed"]
    assert all(
        0 < s < c for s, c in zip(out["sampled_tokens"], out["completion_tokens"], strict=True)
    )
