"""Checks for git-recover."""

import subprocess
from pathlib import Path

REPO = Path("/app/repo")


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout


def test_history_order():
    subjects = git("log", "--format=%s", "main").splitlines()
    assert subjects == ["update app", "add notes", "hotfix", "initial"]


def test_files():
    assert (REPO / "notes.txt").read_text() == "secret plan\n"
    assert (REPO / "app.txt").read_text() == "v2\n"
    assert (REPO / "hotfix.txt").read_text() == "fixed\n"


def test_clean_on_main():
    assert git("status", "--porcelain") == ""
    assert git("rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
