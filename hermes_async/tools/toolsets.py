"""Toolsets and toolset distributions, with the reference's names and numbers.

A distribution gives each toolset an inclusion probability, sampled once per group.
Toolsets we do not implement (``vision``) or that cannot exist in RL (``memory``) stay
valid names because the reference's distributions mention them.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = (
    "DISTRIBUTIONS",
    "TOOLSETS",
    "Distribution",
    "Toolset",
    "expand_toolsets",
    "list_distributions",
    "list_toolsets",
    "resolve_toolsets",
    "sample_toolsets_from_distribution",
    "validate_distribution",
    "validate_toolset",
)


@dataclass(frozen=True, slots=True)
class Toolset:
    """A named group of tools and/or other toolsets."""

    name: str
    description: str
    tools: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Distribution:
    """Inclusion probabilities (percent, 0-100) per toolset."""

    name: str
    description: str
    toolsets: Mapping[str, int]


_TOOLSET_LIST = [
    Toolset(
        "terminal", "Run shell commands and manage background processes.", ("terminal", "process")
    ),
    Toolset(
        "file",
        "Read, write, patch and search files.",
        ("read_file", "write_file", "patch", "search_files"),
    ),
    Toolset("web", "Search the web and extract pages.", ("web_search", "web_extract")),
    Toolset("search", "Search the web.", ("web_search",)),
    Toolset("todo", "Keep a task list for the current rollout.", ("todo",)),
    Toolset("vision", "Analyze images.", ("vision_analyze",)),
    Toolset("image_gen", "Generate images.", ("image_generate",)),
    Toolset("moa", "Mixture of agents.", ("mixture_of_agents",)),
    Toolset(
        "browser",
        "Drive a headless browser (Chromium): navigate, read the accessibility tree, click, type.",
        (
            "browser_navigate",
            "browser_snapshot",
            "browser_click",
            "browser_type",
            "browser_scroll",
            "browser_back",
            "browser_press",
            "browser_get_images",
            "browser_vision",
            "browser_console",
            "web_search",
        ),
    ),
    Toolset(
        "skills",
        "Read skill documents: instructions for specific tasks (read-only).",
        ("skills_list", "skill_view"),
    ),
    Toolset("code_execution", "Run Python programs in the sandbox.", ("execute_code",)),
    Toolset(
        "delegation",
        "Delegate a task to a sub-agent (not available in RL environments).",
        ("delegate_task",),
    ),
    Toolset("memory", "Long-term memory (not available in RL environments).", ("memory",)),
    Toolset(
        "session_search",
        "Search past sessions (not available in RL environments).",
        ("session_search",),
    ),
    Toolset(
        "debugging", "Terminal, process, web and file tools.", includes=("terminal", "web", "file")
    ),
    Toolset("safe", "Tools without shell access.", includes=("web", "vision", "image_gen")),
]

#: Every valid toolset, by name.
TOOLSETS: Mapping[str, Toolset] = {t.name: t for t in _TOOLSET_LIST}

#: Reference spellings accepted as aliases.
_LEGACY_NAMES = {"file_tools": "file", "terminal_tools": "terminal", "web_tools": "web"}

_SEVEN = ("web", "vision", "image_gen", "terminal", "file", "moa", "browser")

_DISTRIBUTION_LIST = [
    Distribution("default", "All main toolsets.", dict.fromkeys(_SEVEN, 100)),
    Distribution(
        "image_gen",
        "Image generation tasks.",
        {"image_gen": 90, "vision": 90, "web": 55, "terminal": 45, "moa": 10},
    ),
    Distribution(
        "research",
        "Web research.",
        {"web": 90, "browser": 70, "vision": 50, "moa": 40, "terminal": 10},
    ),
    Distribution(
        "science",
        "Science tasks.",
        {
            "web": 94,
            "terminal": 94,
            "file": 94,
            "vision": 65,
            "browser": 50,
            "image_gen": 15,
            "moa": 10,
        },
    ),
    Distribution(
        "development",
        "Software development.",
        {"terminal": 80, "file": 80, "moa": 60, "web": 30, "vision": 10},
    ),
    Distribution(
        "safe",
        "No shell access.",
        {"web": 80, "browser": 70, "vision": 60, "image_gen": 60, "moa": 50},
    ),
    Distribution("balanced", "Every main toolset at 50%.", dict.fromkeys(_SEVEN, 50)),
    Distribution("minimal", "Web only.", {"web": 100}),
    Distribution("terminal_only", "Terminal and files.", {"terminal": 100, "file": 100}),
    Distribution(
        "terminal_web", "Terminal, files and web.", {"terminal": 100, "file": 100, "web": 100}
    ),
    Distribution("creative", "Creative tasks.", {"image_gen": 90, "vision": 90, "web": 30}),
    Distribution("reasoning", "Reasoning tasks.", {"moa": 90, "web": 30, "terminal": 20}),
    Distribution("browser_use", "Browser tasks.", {"browser": 100, "web": 80, "vision": 70}),
    Distribution("browser_only", "Browser only.", {"browser": 100}),
    Distribution("browser_tasks", "Mostly browser.", {"browser": 97, "vision": 12, "terminal": 15}),
    Distribution(
        "terminal_tasks",
        "Mostly terminal.",
        {"terminal": 97, "file": 97, "web": 97, "browser": 75, "vision": 50, "image_gen": 10},
    ),
    Distribution(
        "mixed_tasks",
        "Browser, terminal and files.",
        {"browser": 92, "terminal": 92, "file": 92, "web": 35, "vision": 15, "image_gen": 15},
    ),
]

#: Every named distribution, by name.
DISTRIBUTIONS: Mapping[str, Distribution] = {d.name: d for d in _DISTRIBUTION_LIST}


def list_toolsets() -> list[str]:
    """Names of every valid toolset, sorted."""
    return sorted(TOOLSETS)


def list_distributions() -> list[str]:
    """Names of every distribution, sorted."""
    return sorted(DISTRIBUTIONS)


def validate_toolset(name: str) -> str:
    """Return the canonical toolset name for ``name`` (legacy aliases accepted).

    Raises:
        ValueError: ``name`` is not a toolset; the message lists the valid ones.
    """
    canonical = _LEGACY_NAMES.get(name, name)
    if canonical not in TOOLSETS:
        raise ValueError(f"unknown toolset {name!r}; valid toolsets: {', '.join(list_toolsets())}")
    return canonical


def validate_distribution(name: str) -> str:
    """Return ``name`` if it is a distribution.

    Raises:
        ValueError: ``name`` is not a distribution; the message lists the valid ones.
    """
    if name not in DISTRIBUTIONS:
        raise ValueError(
            f"unknown toolset distribution {name!r}; valid distributions: "
            f"{', '.join(list_distributions())}"
        )
    return name


def _expand(name: str, seen: set[str]) -> list[str]:
    if name in seen:
        return []
    seen.add(name)
    toolset = TOOLSETS[name]
    tools = list(toolset.tools)
    for inc in toolset.includes:
        tools.extend(_expand(inc, seen))
    return tools


def expand_toolsets(names: Iterable[str]) -> set[str]:
    """The toolsets ``names`` stand for, composites expanded (``debugging`` -> terminal, ...)."""
    out: set[str] = set()

    def visit(name: str) -> None:
        if name in out:
            return
        out.add(name)
        toolset = TOOLSETS.get(name)
        for inc in toolset.includes if toolset else ():
            visit(inc)

    for name in names:
        visit(_LEGACY_NAMES.get(name, name))
    return out


def resolve_toolsets(
    enabled: Iterable[str] | None = None, disabled: Iterable[str] | None = None
) -> list[str]:
    """Resolve toolset names to tool names, in a stable order without duplicates.

    Args:
        enabled: Toolsets to include; ``None`` means every toolset.
        disabled: Toolsets subtracted last.

    Raises:
        ValueError: A name in either list is not a toolset.
    """
    enabled_names = list(TOOLSETS) if enabled is None else [validate_toolset(n) for n in enabled]
    disabled_names = [validate_toolset(n) for n in (disabled or ())]
    names: dict[str, None] = {}
    for ts in enabled_names:
        for tool in _expand(ts, set()):
            names.setdefault(tool)
    for ts in disabled_names:
        for tool in _expand(ts, set()):
            names.pop(tool, None)
    return list(names)


def sample_toolsets_from_distribution(name: str, rng: random.Random | None = None) -> list[str]:
    """Sample a set of toolsets from the distribution called ``name``.

    Each toolset is included independently with probability ``percent / 100``; seed ``rng``
    for reproducible groups. If none is chosen, the most likely one is returned alone.

    Raises:
        ValueError: ``name`` is not a distribution; the message lists the valid ones.
    """
    dist = DISTRIBUTIONS[validate_distribution(name)]
    rng = rng if rng is not None else random.Random()
    chosen = [ts for ts, pct in dist.toolsets.items() if rng.random() * 100 < pct]
    if not chosen:
        chosen = [max(dist.toolsets.items(), key=lambda kv: kv[1])[0]]
    return chosen
