"""AgentOptions: each option is declared and documented in one place.

An option is documented where a docstring's ``Args:`` / ``Attributes:`` section has an entry
naming it (``name:``, ``name (type):`` or ``a, b, c:``). Each field of ``AgentOptions`` has
exactly one such entry that describes it: its own. Any other entry naming it points back
(it says ``AgentOptions``) or is another concept under the same name (listed below, with why).
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
from collections.abc import Iterator

import hermes_async
from hermes_async.agent import AgentOptions

ROOT = pathlib.Path(hermes_async.__file__).parent
FIELDS = {f.name for f in dataclasses.fields(AgentOptions)}

#: Entries that name an option's field but document another thing: ``(owner, name)``.
OTHER_CONCEPTS = {
    # One generation's sampling parameters (what the options resolve into per request).
    ("SamplingParams", "temperature"),
    ("SamplingParams", "max_tokens"),
    # A streamed response's bound: the max_tokens its request asked for (issue 38).
    ("ChatStreamAssembler", "max_tokens"),
    ("ChatStream", "max_tokens"),
    ("TokenStream", "max_tokens"),
    # The vision model's own request.
    ("VisionSettings", "max_tokens"),
    # A model family's end-of-turn tokens (the tokenizer's, the options' default).
    ("ModelFamily", "end_of_turn"),
    # Test scenarios' own knobs (hermes_async.testing), which build their options.
    ("ChaosConfig", "max_turns"),
    ("ChaosConfig", "tool_timeout"),
    ("ChaosConfig", "rollout_timeout"),
    ("PartialConfig", "max_tokens"),
    ("PartialConfig", "max_resumes"),
    # The environment config's builder: the override of its own agent_temperature.
    ("build_agent_options", "temperature"),
    # verl's own sampling_params dict, handed through by the verl adapter.
    ("ServerManagerClient", "sampling"),
    # A field of the rollout worker's wire format (its HTTP API), which the worker applies.
    ("GroupRequest", "temperature"),
}

_SECTION = re.compile(r"^(Args|Arguments|Attributes|Keyword Args|Parameters):\s*$")
_OTHER_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")
_ENTRY = re.compile(r"^    (\w+(?:, \w+)*)(?: \([^)]*\))?:(?:\s|$)")


def _entries() -> Iterator[tuple[str, str, str, str]]:
    """``(file, owner, name, text)`` of every documented entry in the package."""
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            ):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            owner = getattr(node, "name", "<module>")
            in_section = False
            current: tuple[list[str], list[str]] | None = None
            for line in [*doc.splitlines(), ""]:
                entry = _ENTRY.match(line) if in_section else None
                if current is not None and (entry or not line.startswith("      ")):
                    names, text = current
                    for name in names:
                        yield str(path.relative_to(ROOT)), owner, name, " ".join(text)
                    current = None
                if _SECTION.match(line):
                    in_section = True
                elif _OTHER_SECTION.match(line):
                    in_section = False
                elif entry:
                    current = (entry.group(1).split(", "), [line.strip()])
                elif current is not None:
                    current[1].append(line.strip())


def test_the_entry_scan_reads_google_style_sections() -> None:
    found = {(owner, name) for _, owner, name, _ in _entries()}
    assert ("AgentOptions", "max_turns") in found
    assert ("HermesAgentLoop", "budget_config") in found  # a comma-separated entry
    assert ("SamplingParams", "temperature") in found


def test_every_option_is_documented_once() -> None:
    describing: dict[str, list[str]] = {name: [] for name in FIELDS}
    for file, owner, name, text in _entries():
        if name not in FIELDS or (owner, name) in OTHER_CONCEPTS:
            continue
        if owner != "AgentOptions" and "AgentOptions" in text:
            continue  # a pointer to the one description
        describing[name].append(f"{file}:{owner}")
    assert {name: places for name, places in describing.items() if len(places) != 1} == {}
    assert all(places == ["agent/options.py:AgentOptions"] for places in describing.values())
