"""Hidden checks for fix-python-bug (run against the agent's /app/stats.py)."""

import importlib.util
import subprocess
import sys

import pytest

spec = importlib.util.spec_from_file_location("stats", "/app/stats.py")
stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stats)


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([5], 5),
        ([1, 2], 1.5),
        ([9, 1, 5, 3], 4.0),
        ([2, 2, 2, 2], 2),
        ([-1, 1], 0.0),
        ([7, 3, 5], 5),
    ],
)
def test_median(values, want):
    assert stats.median(values) == want


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([1], 1),
        ([4, 4, 2, 2], 2),
        ([5, 1, 5, 1, 0], 1),
        ([3, 9, 9], 9),
        (["b", "a", "b", "a"], "a"),
    ],
)
def test_mode(values, want):
    assert stats.mode(values) == want


@pytest.mark.parametrize("fn", ["mean", "median", "mode"])
def test_empty_raises(fn):
    with pytest.raises(ValueError):
        getattr(stats, fn)([])


def test_visible_suite_passes():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "/app/tests"],
        cwd="/app",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
