"""Checks for nonroot-user (the verifier runs as root)."""

import os
import pwd
import subprocess
from pathlib import Path

AGENT = pwd.getpwnam("agent")
HOME = Path(AGENT.pw_dir)


def test_verifier_is_root_and_cwd_is_workdir():
    assert os.geteuid() == 0
    assert os.getcwd() == "/home/agent/project"


def test_whoami():
    path = HOME / "whoami.txt"
    assert path.read_text().strip() == "agent"
    assert path.stat().st_uid == AGENT.pw_uid


def test_greet():
    path = HOME / "project" / "greet.sh"
    assert path.stat().st_uid == AGENT.pw_uid
    assert os.access(path, os.X_OK)
    done = subprocess.run([str(path)], capture_output=True, text=True, check=True)
    assert done.stdout == "hello from agent\n"
