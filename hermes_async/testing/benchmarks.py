"""Scripted policies for the benchmark environments: an oracle each, a null policy, a judge.

Each oracle is a :class:`~hermes_async.testing.scripted_server.ScriptedPolicy` factory that
solves its environment's built-in sample (:mod:`hermes_async.envs.samples`), so a run needs no
model: ``hermes-async eval swe --oracle hermes_async.testing.benchmarks:swe_oracle``.
:func:`null_policy` answers without a tool call (every environment scores it 0).
:func:`scripted_judge` plays WebResearchEnv's judge model; :func:`open_web_research_world`
serves it with a fake web provider for offline runs (``python -m
hermes_async.testing.benchmarks web-research-world``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hermes_async.envs.samples import SWE_SAMPLE
from hermes_async.testing.scripted_server import PolicyRequest

__all__ = ("null_policy", "swe_oracle")

Policy = Callable[[PolicyRequest], str]


def _tool_call(name: str, arguments: dict[str, Any]) -> str:
    # The hermes <tool_call> format the environments parse (one block per call).
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def _tool_results(request: PolicyRequest) -> list[str]:
    """The ``tool`` messages since the last ``user`` message: the oracle's progress."""
    start = 0
    for index, message in enumerate(request.messages):
        if message.get("role") == "user":
            start = index + 1
    return [
        str(m.get("content") or "") for m in request.messages[start:] if m.get("role") == "tool"
    ]


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def null_policy(request: PolicyRequest) -> str:
    """Answer at once, with no tool call."""
    del request
    return "I cannot help with that."


def swe_oracle(path: Path = SWE_SAMPLE) -> Policy:
    """HermesSweEnv's oracle for rows with a ``canonical_solution`` (the built-in sample's).

    Writes the solution file (the row's prompt and its canonical body), runs it once,
    then answers. A task it does not know gets a plain reply.
    """
    rows = [r for r in _rows(path) if r.get("canonical_solution")]

    def policy(request: PolicyRequest) -> str:
        text = request.last_user_text
        row = next((r for r in rows if str(r["prompt"]) in text), None)
        if row is None:
            return "I do not know this task."
        match = re.search(r"Save your solution as (\S+) in the working directory", text)
        path = match.group(1) if match else "solution.py"
        done = _tool_results(request)
        if not done:
            source = str(row["prompt"]) + str(row["canonical_solution"])
            return _tool_call("write_file", {"path": path, "content": source})
        if len(done) == 1:
            return _tool_call("terminal", {"command": f"python3 {path} && echo compiled"})
        return f"{row['entry_point']} is written to {path}."

    return policy
