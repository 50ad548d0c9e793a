"""Host secrets never reach a sandbox, nor the groups JSONL / HTML (issue #15, acceptance 1).

The trainer process is started with fake secrets in its environment *before* it starts (so
they are in its ``/proc/<pid>/environ``, which no later ``os.environ`` change can scrub). A
hostile scripted model then tries every way the issue lists: ``/proc/$PPID/environ``,
``/proc/*/environ``, ``ps e``, and the file tools on ``/proc`` paths. Everything the run wrote
(JSONL of the scored groups, its HTML view, the eval samples) is searched for the values.

The same run in process mode is the control: there the probes DO read the secrets (that is
what the namespaces exist for), which proves the probe commands would find them; the record
still holds only their redacted forms.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

SECRETS = {
    "OPENAI_API_KEY": "fake-openai-4f1c2e9a7b",
    "AWS_SECRET_ACCESS_KEY": "fake-aws-8d3b5c1e0f",
    "WANDB_API_KEY": "fake-wandb-2a6e9c4d1b",
    "HF_TOKEN": "fake-hf-7c0d2b8e5a",
    "DATABASE_URL": "postgres://trainer:fake-db-3e9f1a6c2d@db.internal/prod",
}

HOSTILE = (
    "echo PARENT; tr '\\0' '\\n' < /proc/$PPID/environ; "
    "echo ALL; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\"; done 2>/dev/null; "
    "echo PS; ps e -e -ww 2>&1 | head -c 20000; echo END"
)

_RUNNER = """
import json, sys
from hermes_async import cli
from hermes_async.envs import terminal_test

out, isolation, hostile = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

def call(name, arguments):
    return "<tool_call>\\n" + json.dumps({"name": name, "arguments": arguments}) + "\\n</tool_call>"

def oracle():
    def policy(request):
        steps = sum(1 for m in request.messages if m.get("role") == "tool")
        if steps < len(hostile):
            name, arguments = hostile[steps]
            return f"Let me look around ({steps}).\\n" + call(name, arguments)
        return "Nothing to see."
    return policy

build = cli._build_configs

def build_with_isolation(env_over, openai_over, path):
    config, server = build(env_over, openai_over, path)
    config.sandbox_options = {"isolation": isolation}
    return config, server

cli._build_configs = build_with_isolation
terminal_test.terminal_test_oracle = oracle
argv = ["demo", "--out", out, "--no-progress", "--env.total_steps", "1", "--env.group_size", "2"]
argv += ["--env.eval_size", "1"]
sys.exit(cli.main(argv))
"""

STEPS = [
    ["terminal", {"command": HOSTILE}],
    ["terminal", {"command": HOSTILE, "background": True}],
    ["read_file", {"path": "/proc/1/environ"}],
    ["read_file", {"path": "//proc/self/../1/environ"}],
    ["read_file", {"path": "../../../../../proc/1/environ"}],
    ["search_files", {"pattern": "fake-", "path": "/proc/1", "target": "content"}],
]


def _run(tmp_path: pathlib.Path, isolation: str) -> str:
    out = tmp_path / isolation
    env = {**os.environ, **SECRETS, "PYTHONPATH": os.getcwd()}
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(out), isolation, json.dumps(STEPS)],
        env=env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    # Exit 1: the hostile model solves no task (the demo wants reward 1.0); 0 would be odd.
    assert done.returncode == 1, done.stderr.decode()[-3000:]
    assert "3 rollouts, mean reward 0.00" in done.stdout.decode(), done.stdout.decode()
    written = sorted(p for p in out.rglob("*") if p.is_file())
    names = {p.name for p in written}
    assert {"terminal_test.jsonl", "terminal_test.html"} <= names, names
    text = "\n".join(p.read_text(errors="replace") for p in written)
    # The probes ran and their output is in the record (not an empty run).
    assert text.count("PARENT") >= 3 and "Let me look around (5)" in text, text[:2000]
    return text + done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")


@pytest.mark.namespaces
def test_secrets_never_reach_a_namespaced_sandbox_or_the_record(tmp_path: pathlib.Path) -> None:
    text = _run(tmp_path, "namespaces")
    leaked = [name for name, value in SECRETS.items() if value in text]
    assert leaked == [], f"leaked into the run's output: {leaked}"
    assert "are blocked" in text  # the file tools refused the /proc paths


def test_control_process_mode_leaks_through_proc(tmp_path: pathlib.Path) -> None:
    """Process mode (the documented fallback) keeps the environment allowlist but not /proc:
    the same probes read the trainer's secrets, and only the record's redaction (issue #16)
    keeps their values out of the JSONL / HTML. If the redacted names stop appearing, the
    probes above have stopped probing."""
    text = _run(tmp_path, "process")
    for name in ("OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "HF_TOKEN"):
        assert f"{name}=[REDACTED]" in text, name
    assert "DATABASE_URL=postgres://[REDACTED]@db.internal/prod" in text
    leaked = [name for name, value in SECRETS.items() if value in text]
    assert leaked == [], f"redaction missed: {leaked}"
