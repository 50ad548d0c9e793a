"""No credential survives a rollout (issue 16): generated secrets in every field, none found.

A secret of a generated shape (an ``sk-`` key, a URL password, a JWT, a PEM block, an ini line,
an ``Authorization: Basic`` credential, the value of a secret-named environment variable) is
planted in the prompt, the model's reply and tool-call arguments, the tool's output, the
reward's exception and the model server's URL (userinfo, with a 500 so the retry is logged).
Then every surface that leaves the process is searched for it: the scored group as written to
JSONL (messages, overrides; ``tokens`` stay exact, as trainers need), the HTML atroposlib renders
from that JSONL, eval samples, wandb rows and tool-error details, every log line (tracebacks
included) and every error text.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import tempfile

import anyio
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hermes_async.agent import AgentResult, FailurePolicy, RolloutSetup, ToolContext, run_group
from hermes_async.envs._eval import rollout_sample
from hermes_async.envs.display import tool_error_entry, wandb_rows
from hermes_async.envs.viewer import render_html
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.testing import (
    FakeSandboxFactory,
    Fault,
    PolicyRequest,
    ScriptedModelServer,
    open_app_endpoint,
)
from hermes_async.tools.registry import get_tool_definitions
from hermes_async.tools.sandbox.base import ExecResult
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import FAST, TOKENIZER

TOOLS = get_tool_definitions(["terminal"])
ENV_NAME = "HERMES_ASYNC_TEST_SECRET_TOKEN"

SHAPES = {
    "sk": lambda core: f"sk-{core}",
    "url": lambda core: f"postgres://app:{core}@db.internal:5432/prod",
    "jwt": lambda core: f"eyJ{core}.eyJ{core[::-1]}.{core}",
    "pem": lambda core: f"-----BEGIN PRIVATE KEY-----\n{core}\n-----END PRIVATE KEY-----",
    "ini": lambda core: f"aws_secret_access_key = {core}",
    "auth": lambda core: f"Authorization: Basic {core}",
    "env": lambda core: core,  # the value of ENV_NAME, whatever its shape
}

cores = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    min_size=14,
    max_size=28,
).map(lambda text: "Zq" + text)  # never a substring of the surrounding text


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


async def _scenario(secret: str, core: str, out: pathlib.Path) -> list[tuple[str, str]]:
    """Run a group of 2 with ``secret`` everywhere; return ``(surface, text)`` to search."""

    def policy(request: PolicyRequest) -> str:
        if any(m.get("role") == "tool" for m in request.messages):
            return f"Logged in with {secret}."
        arguments = {"command": f"login --with '{secret}'"}
        return (
            f"I will use {secret}.\n<tool_call>\n"
            + json.dumps({"name": "terminal", "arguments": arguments})
            + "\n</tool_call>"
        )

    async def reward(result: AgentResult, ctx: ToolContext) -> float:
        await ctx.terminal("check")
        if ctx.task_id == "r1":
            raise RuntimeError(f"verifier could not log in with {secret}")
        return 1.0

    def answer(command: str) -> ExecResult:
        return ExecResult(f"welcome; your credential is {secret}\n", f"warn {secret}", 1)

    scripted = ScriptedModelServer(
        policy,
        tokenizer=TOKENIZER,
        fault_plan=lambda number, body: Fault.http_error(500) if number == 1 else None,
    )
    prompt = [{"role": "user", "content": f"Log in to the box; the password is {secret}"}]
    async with open_app_endpoint(scripted, loopback=False) as (url, transport):
        url = url.replace("://", f"://admin:{core}@", 1)
        async with (
            VLLMGenerateClient(url, transport=transport, options=FAST) as client,
            SandboxManager(FakeSandboxFactory(exec_script=answer), close_timeout=1.0) as manager,
        ):
            group = await run_group(
                client,
                prompt,
                TOOLS,
                size=2,
                task_ids=["r0", "r1"],
                setup=RolloutSetup(
                    reward=reward,
                    tokenizer=TOKENIZER,
                    sandboxes=manager,
                    failure_policy=FailurePolicy(on_failure="zero"),
                ),
            )
    assert group.outcome == "zeroed" and group.rollouts[1].category == "verifier"
    batch = group.to_scored_data_group()
    surfaces: list[tuple[str, str]] = [
        ("jsonl messages", json.dumps(batch["messages"], ensure_ascii=False)),
        ("jsonl overrides", json.dumps(batch.get("overrides"), ensure_ascii=False)),
    ]
    jsonl = out / "groups.jsonl"
    jsonl.write_text(json.dumps({**batch, "tokens": [[1]] * len(batch["tokens"])}) + "\n")
    from atroposlib.frontend.jsonl2html import generate_html

    html = out / "groups.html"
    generate_html(str(jsonl), str(html))
    surfaces.append(("html", html.read_text()))
    rows = wandb_rows(batch, -1, lambda ids: TOKENIZER.decode(ids))
    surfaces.append(("wandb rows", json.dumps(rows, ensure_ascii=False)))
    for rollout in group.rollouts:
        sample = rollout_sample("task", prompt[0]["content"], rollout, rollout.task_id)
        surfaces.append(("eval sample", json.dumps(sample, ensure_ascii=False)))
        surfaces.append(("viewer html", render_html([sample], title="run")))
        entries = [tool_error_entry(e) for e in rollout.result.tool_errors]
        surfaces.append(("tool error details", json.dumps(entries, ensure_ascii=False)))
        errors = (rollout.error, rollout.reward_error, rollout.failure)
        surfaces.append(("error text", " ".join(str(e) for e in errors if e is not None)))
    assert group.rollouts[1].reward_error is not None
    assert any("[REDACTED]" in text for _, text in surfaces)  # the secret was there, and went
    return surfaces


@settings(
    max_examples=21,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(shape=st.sampled_from(sorted(SHAPES)), core=cores)
def test_generated_secrets_in_every_field_are_found_nowhere(
    shape: str, core: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = SHAPES[shape](core)
    monkeypatch.setitem(os.environ, ENV_NAME, core)
    logger = logging.getLogger("hermes_async")
    handler = _Lines()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with tempfile.TemporaryDirectory() as directory:
            surfaces = anyio.run(_scenario, secret, core, pathlib.Path(directory))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    surfaces.append(("logs", "\n".join(handler.lines)))
    assert any("500" in line or "retry" in line for line in handler.lines)  # the URL was logged
    leaks = [name for name, text in surfaces if core in text]
    assert not leaks, f"{shape} secret found in {leaks}"
