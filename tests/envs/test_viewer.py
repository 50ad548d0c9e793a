"""The run viewer: escaped, redacted, bounded, offline; and what a person sees in Chromium.

The browser test opens the page in the real headless Chromium (Debian's, through Playwright,
as the browser tools launch it), blocks every request that is not the file itself, and asserts
that a tool call's arguments are *visible*, that hostile model text stayed text, and that the
filters hide what they should; a second one opens the page of a real run of
``examples/my_env.py`` (the README's commands). Screenshots are kept in the test's tmp path,
and also in ``$HERMES_ASYNC_ARTIFACTS`` when that is set (CI uploads that folder).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from hermes_async.envs.runs import RunInfo
from hermes_async.envs.viewer import MAX_TEXT_CHARS, PREVIEW_CHARS, render_html, write_viewer
from tests.tools.browser.conftest import browser_engine

__all__ = ("browser_engine",)  # the fixture, shared with the browser tools' tests

ROOT = Path(__file__).resolve().parents[2]
MY_ENV = str(ROOT / "examples" / "my_env.py")
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
SECRET = "sk-proj-" + "Zx9" * 12


def conversation(command: str, result: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are careful. " * 200},
        {"role": "user", "content": "Fix the build </pre></details></li>"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "The build breaks because <b>of</b> a typo.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "terminal", "arguments": json.dumps({"command": command})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": result},
        {"role": "assistant", "content": "Done."},
    ]


def row(key: str, reward: float, failure: str | None, command: str, result: str) -> dict[str, Any]:
    return {
        "item_key": key,
        "mode": "eval",
        "task": key.split("#")[0],
        "task_id": f"id-{key}",
        "reward": reward,
        "turns": 2,
        "tokens": 900,
        "seconds": 1.25,
        "finished_naturally": failure is None,
        "tool_errors": [f"[turn 1] terminal: {HOSTILE}"] if failure else [],
        "error": None,
        "failure": None
        if failure is None
        else {"category": failure, "message": f"it broke {HOSTILE}", "detail": None},
        "attempt": 1,
        "messages": conversation(command, result),
        "timings": [{"turn": 1.0, "time_to_first_token": 0.25, "generation_seconds": 0.5}],
        "token_counts": {"prompt": 800, "completion": 60, "per_turn": [40, 20]},
    }


ROWS = [
    row("build", 1.0, None, "make -C /src VERBOSE=1 && echo built", "built\n" + "x" * 5_000),
    row("build#2", 0.0, "tool", HOSTILE, f"key is {SECRET}"),
    row("lint", 0.5, None, "ruff check .", "All checks passed!"),
]


def page_of(rows: list[dict[str, Any]] = ROWS) -> str:
    return render_html(rows, title="run <1>", info=None)


def test_hostile_text_is_escaped_everywhere() -> None:
    page = page_of()
    scripts = re.findall(r"<script\b", page)
    assert len(scripts) == 1  # ours, at the end
    assert "<img" not in page  # the hostile tag only as escaped text
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    assert "Fix the build &lt;/pre&gt;&lt;/details&gt;&lt;/li&gt;" in page
    assert "<title>run &lt;1&gt;</title>" in page


def test_secrets_are_redacted_whoever_wrote_the_row() -> None:
    page = page_of()
    assert SECRET not in page and "[REDACTED]" in page


def test_long_results_are_previewed_capped_and_expandable() -> None:
    huge = "y" * (MAX_TEXT_CHARS * 3)
    page = page_of([row("big", 1.0, None, "cat big", huge)])
    assert page.count("y") < MAX_TEXT_CHARS + 100
    assert f"show the rest ({len(huge) - PREVIEW_CHARS} more characters)" in page
    assert "more characters (see samples.jsonl)" in page


def test_the_page_loads_nothing_and_its_script_is_the_one_allowed() -> None:
    import base64
    import hashlib

    page = page_of()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    policy = re.search(r'Content-Security-Policy" content="([^"]+)"', page)
    assert policy and "default-src 'none'" in policy.group(1)
    script = re.search(r"<script>(.*)</script>", page, re.S)
    assert script is not None
    digest = base64.b64encode(hashlib.sha256(script.group(1).encode()).digest()).decode()
    assert f"'sha256-{digest}'" in policy.group(1)


def test_filters_and_facts_are_on_each_rollout() -> None:
    page = page_of()
    assert re.findall(r'data-reward="(\w+)" data-failure="(\w+)"', page) == [
        ("pass", "none"),
        ("zero", "tool"),
        ("partial", "none"),
    ]
    assert '<option value="tool">tool</option>' in page
    assert "assistant, turn 1, 0.25 s to first token, 0.50 s generating, 40 tokens" in page
    assert "900 tokens (800 prompt, 60 generated)" in page
    assert "tool result (terminal)" in page
    assert f"reasoning ({len('The build breaks because <b>of</b> a typo.')} characters)" in page


def test_write_viewer_reads_the_folder(tmp_path: Path) -> None:
    (tmp_path / "samples.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in ROWS) + "not json\n" + '{"cut": tr'
    )
    RunInfo("hermes-async eval x.py", "x.py", "x", "eval", "oracle x.py:o", 0.0, 12.5).write(
        tmp_path
    )
    page = write_viewer(tmp_path).read_text()
    assert "2 lines of samples.jsonl were not records (skipped)" in page
    assert "3 rollouts, mean reward 0.50" in page  # the end-of-run table, as printed
    assert "oracle x.py:o" in page and "12.5 s" in page


@contextlib.asynccontextmanager
async def chromium_page(engine: str, path: Path) -> AsyncIterator[tuple[Any, list[str]]]:
    """``path`` open in headless Chromium, every other request blocked; (page, requests)."""
    from playwright.async_api import async_playwright

    from hermes_async.tools.browser.settings import (
        BrowserSettings,
        chromium_args,
        launch_environment,
    )

    requests: list[str] = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=engine,
            args=chromium_args(BrowserSettings()),
            headless=True,
            env=launch_environment(),
            handle_sigint=False,
            handle_sigterm=False,
            handle_sighup=False,
        )
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 1600})

            async def only_the_file(route: Any) -> None:
                requests.append(route.request.url)
                if route.request.url == path.as_uri():
                    await route.continue_()
                else:
                    await route.abort()

            await page.route("**/*", only_the_file)
            await page.goto(path.as_uri())
            yield page, requests
        finally:
            await browser.close()


def keep_artifact(shot: Path, name: str) -> None:
    artifacts = os.environ.get("HERMES_ASYNC_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / name)


@pytest.mark.browser
@pytest.mark.anyio
async def test_in_chromium_tool_arguments_are_visible_and_hostile_text_stays_text(
    browser_engine: str, tmp_path: Path
) -> None:
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    path = write_viewer(tmp_path)
    async with chromium_page(browser_engine, path) as (page, requests):
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.reload()
        # The first rollout is open: its tool call's arguments are on screen.
        arguments = page.locator("pre.args").filter(has_text="make -C /src VERBOSE=1")
        assert await arguments.is_visible()
        assert await page.locator(".call-name").first.inner_text() == "terminal"
        shot = tmp_path / "viewer.png"
        await page.screenshot(path=str(shot), full_page=True)
        # Hostile text in a tool argument is shown as text and never ran.
        await page.locator("details.rollout").nth(1).locator(":scope > summary").click()
        hostile = page.locator("pre.args").filter(has_text="<script>window.__pwned = 1")
        assert await hostile.is_visible()
        assert await page.evaluate("window.__pwned") is None
        # Filters: failure "tool" leaves the one failed rollout.
        await page.select_option("#f-failure", "tool")
        assert await page.locator("#f-count").inner_text() == "1 of 3 rollouts"
        assert not await arguments.is_visible()
        assert await hostile.is_visible()
        await page.select_option("#f-failure", "all")
        await page.select_option("#f-reward", "partial")
        assert await page.locator("#f-count").inner_text() == "1 of 3 rollouts"
        assert await page.locator("section.task[data-task=lint]").is_visible()
        assert errors == []
    assert set(requests) == {path.as_uri()}  # nothing else was even asked for
    assert shot.stat().st_size > 10_000
    keep_artifact(shot, "viewer.png")


@pytest.mark.browser
@pytest.mark.anyio
async def test_the_newcomers_run_shows_its_tool_calls_in_chromium(
    browser_engine: str, tmp_path: Path
) -> None:
    # The README's sequence, as typed: eval examples/my_env.py with its oracle, then view.
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    cli = [sys.executable, "-m", "hermes_async.cli"]
    oracle = ["--oracle", f"{MY_ENV}:oracle", "--limit", "2", "--out", str(run_dir)]
    with anyio.fail_after(180):
        ran = await anyio.run_process(
            [*cli, "eval", MY_ENV, *oracle, "--no-progress"], env=env, check=False
        )
        assert ran.returncode == 0, ran.stdout.decode()[-2000:] + ran.stderr.decode()[-2000:]
        viewed = await anyio.run_process([*cli, "view", str(run_dir)], env=env)
    path = Path(viewed.stdout.decode().split()[1])  # "viewer: /abs/path/index.html"
    assert path == (run_dir / "index.html").resolve()
    async with chromium_page(browser_engine, path) as (page, requests):
        # The first rollout is open: the oracle's terminal call and its arguments are on screen.
        arguments = page.locator("pre.args").filter(has_text="echo 3 > ~/answer.txt")
        assert await arguments.is_visible()
        assert await page.locator(".call-name").first.inner_text() == "terminal"
        assert await page.locator("#f-count").inner_text() == "2 of 2 rollouts"
        shot = tmp_path / "my_env-viewer.png"
        await page.screenshot(path=str(shot), full_page=True)
    assert set(requests) == {path.as_uri()}
    assert shot.stat().st_size > 10_000
    keep_artifact(shot, "my_env-viewer.png")
