"""A scripted-model rollout that fills in and submits a form, and a reward that checks it.

The model is :class:`~hermes_async.testing.ScriptedModelServer` over the OpenAI chat route with
an oracle policy that reads the last tool result (the snapshot's refs) and acts on it; the loop
is :class:`~hermes_async.agent_loop.HermesAgentLoop` with the ``browser`` toolset; the reward
reads the rollout's own page through the function ``ToolContext.browser_snapshot`` delegates to.
"""

from __future__ import annotations

import json
import os
import re
import signal
from typing import Any

import anyio
import pytest

from hermes_async.agent import AgentOptions, FailurePolicy, RolloutSetup, run_rollout
from hermes_async.agent_loop import AgentResult, HermesAgentLoop
from hermes_async.inference.chat import ChatClient
from hermes_async.limits import Limits
from hermes_async.testing import PolicyRequest, ScriptedModelServer, open_app_endpoint
from hermes_async.tools.browser import (
    BROWSER_TOOL_NAMES,
    BrowserManager,
    context_browser_snapshot,
    use_browser_manager,
)
from hermes_async.tools.registry import get_tool_definitions
from tests.support import tool_call
from tests.tools.browser.conftest import settings_for_tests
from tests.tools.browser.procs import browser_processes
from tests.tools.browser.site import Page, Received, Site

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

FORM = """<title>Register</title><h1>Register for the workshop</h1>
<form action="/register" method="post">
  <label>Name <input name="name"></label>
  <label>Email <input name="email" type="email"></label>
  <button type="submit">Register</button>
</form>"""


def _ref(snapshot: str, label: str) -> str:
    match = re.search(re.escape(label) + r" \[ref=(e\d+)\]", snapshot)
    assert match, (label, snapshot)
    return "@" + match.group(1)


def oracle(form_url: str) -> Any:
    """The scripted model: navigate, look, fill the form, submit, check, answer."""

    def policy(request: PolicyRequest) -> str:
        results = [m for m in request.messages if m.get("role") == "tool"]
        if not results:
            return "I'll open the form.\n" + tool_call("browser_navigate", {"url": form_url})
        last = json.loads(results[-1]["content"])
        snapshot = last.get("snapshot")
        if snapshot is None:
            return tool_call("browser_snapshot", {})
        if "Welcome aboard" in snapshot:
            return "I registered Ada Lovelace for the workshop."
        return (
            tool_call(
                "browser_type", {"ref": _ref(snapshot, 'textbox "Name"'), "text": "Ada Lovelace"}
            )
            + "\n"
            + tool_call(
                "browser_type",
                {"ref": _ref(snapshot, 'textbox "Email"'), "text": "ada@example.org"},
            )
            + "\n"
            + tool_call("browser_click", {"ref": _ref(snapshot, 'button "Register"')})
        )

    return policy


async def reward(result: AgentResult, task_id: str, manager: BrowserManager) -> float:
    """1.0 when the rollout's own page shows the confirmation for the right person."""
    page = await context_browser_snapshot(task_id, manager=manager)
    return 1.0 if "Welcome aboard, Ada Lovelace" in page["snapshot"] else 0.0


async def test_a_scripted_rollout_completes_the_form_and_scores_one(
    browser_engine: str, site: Site
) -> None:
    def register(request: Received) -> Page:
        fields = dict(p.split("=", 1) for p in request.body.decode().split("&"))
        name = fields["name"].replace("+", " ")
        return Page(f"<title>Done</title><h1>Welcome aboard, {name}!</h1>")

    site.pages = {"/form": Page(FORM), "/register": register}
    server = ScriptedModelServer(oracle(site.url("/form")))
    definitions = get_tool_definitions(["browser"])
    assert set(BROWSER_TOOL_NAMES) <= definitions.valid_names
    limits = Limits()
    async with (
        BrowserManager(settings_for_tests(), limits=limits) as manager,
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        ChatClient(base_url, transport=transport) as client,
    ):
        loop = HermesAgentLoop(
            client,
            definitions.schemas,
            definitions.valid_names,
            task_id="form-task",
            max_turns=8,
            limits=limits,
        )
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "Register Ada Lovelace (ada@example.org) for the workshop."}
        ]
        with use_browser_manager(manager):  # how the loop's tools find the rollout's browser
            result = await loop.run(messages)
        score = await reward(result, "form-task", manager)
        # Another rollout's browser is its own (a blank page): the reward reads only this one's.
        assert await reward(result, "other-task", manager) == 0.0
        await manager.release("form-task")
        await manager.release("other-task")
        assert manager.statistics().open_contexts == 0
    assert result.finished_naturally, result.error
    assert result.tool_errors == []
    assert result.turns_used == 5  # navigate, snapshot, fill + submit, snapshot, answer
    assert score == 1.0
    [post] = [r for r in site.received if r.path == "/register"]
    assert post.method == "POST" and b"email=ada%40example.org" in post.body


async def test_a_browser_killed_mid_rollout_ends_it_as_sandbox_unavailable(
    browser_engine: str, site: Site
) -> None:
    """The rollout whose browser died ends as ``infra`` (its sandbox is unavailable), not as a
    tool error the model keeps retrying; the next rollout gets a fresh browser and finishes."""
    site.pages = {"/": Page("<title>Home</title><h1>Home</h1>"), "/slow": Page(FORM, delay=3.0)}
    killed = anyio.Event()

    def policy(request: PolicyRequest) -> str:
        results = [m for m in request.messages if m.get("role") == "tool"]
        if not results:
            path = "/slow" if "slow" in str(request.messages[-1].get("content")) else "/"
            return tool_call("browser_navigate", {"url": site.url(path)})
        if len(results) < 4:  # a model that keeps trying as long as it is allowed to
            return tool_call("browser_snapshot", {})
        return "Done."

    server = ScriptedModelServer(policy)
    tools = get_tool_definitions(["browser"])
    options = AgentOptions(max_turns=6)
    limits = Limits()
    async with (
        BrowserManager(settings_for_tests(), limits=limits) as manager,
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        ChatClient(base_url, transport=transport) as client,
    ):

        async def kill_the_browser_during_navigation() -> None:
            with anyio.fail_after(30):
                while not any(r.path == "/slow" for r in site.received):
                    await anyio.sleep(0.02)
            [pid] = browser_processes()
            os.kill(pid, signal.SIGKILL)
            killed.set()

        with use_browser_manager(manager):
            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_the_browser_during_navigation)
                lost = await run_rollout(
                    client,
                    [{"role": "user", "content": "open the slow page"}],
                    tools,
                    task_id="lost",
                    options=options,
                    setup=RolloutSetup(
                        limits=limits, failure_policy=FailurePolicy(on_failure="zero")
                    ),
                )
            assert killed.is_set()
            fresh = await run_rollout(
                client,
                [{"role": "user", "content": "open the home page"}],
                tools,
                task_id="fresh",
                options=options,
                setup=RolloutSetup(limits=limits),
            )
        assert manager.statistics().browser_launches == 2
        assert manager.statistics().open_contexts == 0
    assert lost.category == "infra", lost.failure
    assert lost.failure is not None
    assert lost.failure.detail["exception"] == "BrowserUnavailableError"
    assert lost.failure.detail["source"] == "sandbox"
    # The run stopped at the loss: no more model turns after the failed navigation.
    assert lost.result.turns_used == 1, lost.result.messages
    assert fresh.failure is None and fresh.result.finished_naturally, fresh.failure
    assert fresh.result.tool_errors == []
