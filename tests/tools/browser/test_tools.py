"""The browser tools in the registry and the toolsets: names, schemas, availability."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hermes_async.tools.browser import BROWSER_TOOL_NAMES, TOOLS, browser_available
from hermes_async.tools.registry import builtin_registry, get_tool_definitions
from hermes_async.tools.toolsets import DISTRIBUTIONS, resolve_toolsets

REFERENCE_PARAMETERS = {
    "browser_navigate": ({"url"}, ["url"]),
    "browser_snapshot": ({"full"}, []),
    "browser_click": ({"ref"}, ["ref"]),
    "browser_type": ({"ref", "text"}, ["ref", "text"]),
    "browser_scroll": ({"direction"}, ["direction"]),
    "browser_back": (set(), []),
    "browser_press": ({"key"}, ["key"]),
    "browser_get_images": (set(), []),
    "browser_vision": ({"question"}, ["question"]),
    "browser_console": ({"clear"}, []),
}


def test_the_reference_names_and_parameters() -> None:
    assert tuple(t.name for t in TOOLS) == BROWSER_TOOL_NAMES
    for tool in TOOLS:
        properties, required = REFERENCE_PARAMETERS[tool.name]
        assert set(tool.parameters["properties"]) == properties, tool.name
        assert tool.parameters["required"] == required, tool.name
        assert tool.toolset == "browser"
    scroll = next(t for t in TOOLS if t.name == "browser_scroll")
    assert scroll.parameters["properties"]["direction"]["enum"] == ["up", "down"]
    registry = builtin_registry()
    assert set(BROWSER_TOOL_NAMES) <= set(registry.names())


def test_every_distribution_naming_browser_resolves_to_the_browser_tools() -> None:
    naming = [d for d in DISTRIBUTIONS.values() if "browser" in d.toolsets]
    assert {d.name for d in naming} >= {
        "research",
        "browser_use",
        "browser_only",
        "browser_tasks",
        "terminal_tasks",
    }
    for dist in naming:
        names = resolve_toolsets(list(dist.toolsets))
        assert set(BROWSER_TOOL_NAMES) <= set(names), dist.name
    # The reference's RL-era toolset also carried web_search.
    assert resolve_toolsets(["browser"]) == [*BROWSER_TOOL_NAMES, "web_search"]


def test_offered_when_the_engine_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("FIRECRAWL_API_KEY", "FIRECRAWL_API_URL", "TAVILY_API_KEY", "EXA_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    definitions = get_tool_definitions(["browser"])
    if browser_available():
        assert definitions.valid_names == set(BROWSER_TOOL_NAMES)
    else:
        assert definitions.valid_names == set()
    monkeypatch.setenv("HERMES_BROWSER_EXECUTABLE", "/nonexistent/chromium")
    assert browser_available() is False
    assert get_tool_definitions(["browser"]).valid_names == set()


def test_the_package_imports_and_registers_without_playwright() -> None:
    code = (
        "import sys; sys.modules['playwright'] = None\n"
        "from hermes_async.tools.registry import builtin_registry, get_tool_definitions\n"
        "from hermes_async.tools.browser import browser_available, BROWSER_TOOL_NAMES\n"
        "assert set(BROWSER_TOOL_NAMES) <= set(builtin_registry().names())\n"
        "assert not browser_available()\n"
        "assert get_tool_definitions(['browser']).valid_names.isdisjoint(BROWSER_TOOL_NAMES)\n"
        "import anyio\n"
        "from hermes_async.errors import ConfigError\n"
        "from hermes_async.tools.browser import BrowserManager\n"
        "async def main():\n"
        "    try:\n"
        "        async with BrowserManager(): pass\n"
        "    except ConfigError as exc:\n"
        "        print(exc)\n"
        "anyio.run(main)\n"
        "print(sorted(m for m in sys.modules if m.startswith('playwright.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    if browser_available():  # with a Chromium present, the missing extra is what is reported
        assert "pip install 'hermes-async[browser]'" in lines[0]
    assert lines[-1] == "[]"
