"""The ``skills`` toolset: read-only ``skills_list`` / ``skill_view`` over a folder of skills.

A skill is a folder with a ``SKILL.md`` (front matter ``name``, ``description``) and linked
files. The folder is on the host, read-only, and nothing outside it is served. Layout, which
folder, and result shapes: docs/architecture.md, "The skills toolset".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hermes_async.jsontypes import JSONObject
from hermes_async.tools.registry import Tool, ToolRuntime, current_tool_defaults

__all__ = (
    "BUILTIN_SKILLS_DIR",
    "SKILLS_LIST_TOOL",
    "SKILL_VIEW_TOOL",
    "TOOLS",
    "Skill",
    "find_skills",
    "parse_front_matter",
)

#: The example skills shipped with the package (used when no directory is configured).
BUILTIN_SKILLS_DIR = Path(__file__).with_name("example_skills")

#: Skills listed from one directory, at most (a bound on a mistaken ``skills_dir=/``).
_MAX_SKILLS = 1000

#: Characters of one skill file returned, at most.
_MAX_SKILL_FILE_CHARS = 200_000

#: Reference limits on the metadata shown by ``skills_list``.
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024

#: Directories below a skill whose files ``skill_view`` lists as linked files.
LINKED_DIRS = ("references", "templates", "scripts", "assets")

_MAX_DEPTH = 4


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill found in a folder: ``name`` and ``description`` from its front matter (else the
    folder's name and the first text line), ``category`` the folder above it (``None`` at the top).
    """

    name: str
    description: str
    category: str | None
    path: Path


def _skills_directory(runtime: ToolRuntime | None = None) -> Path:
    """The directory the tools read (see the module docstring for the order)."""
    configured = runtime.skills_dir if runtime is not None else None
    configured = configured or current_tool_defaults().skills_dir
    if configured:
        return Path(configured).expanduser()
    home = os.environ.get("HERMES_HOME")
    reference = Path(home) / "skills" if home else Path.home() / ".hermes" / "skills"
    return reference if reference.is_dir() else BUILTIN_SKILLS_DIR


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def parse_front_matter(text: str) -> tuple[dict[str, str], str]:
    """``(top-level keys, body)`` of a ``SKILL.md`` (top-level ``key: value`` lines only)."""
    if not text.startswith("---"):
        return {}, text
    end = text.find("\n---", 3)
    if end < 0:
        return {}, text
    keys: dict[str, str] = {}
    for line in text[3:end].splitlines():
        if not line or line[0].isspace() or line.lstrip().startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        if value.strip():
            keys[key.strip()] = _unquote(value)
    body = text[end + 4 :]
    return keys, body[1:] if body.startswith("\n") else body


def _read_text(path: Path) -> str:
    with path.open("r", encoding="utf-8", errors="replace") as f:
        return f.read(_MAX_SKILL_FILE_CHARS)


def _describe(path: Path, root: Path) -> Skill:
    keys, body = parse_front_matter(_read_text(path / "SKILL.md"))
    description = keys.get("description") or next(
        (ln.strip() for ln in body.splitlines() if ln.strip() and not ln.startswith("#")), ""
    )
    relative = path.relative_to(root)
    category = str(relative.parent) if relative.parent != Path(".") else None
    return Skill(
        name=(keys.get("name") or path.name)[:MAX_NAME_CHARS],
        description=description[:MAX_DESCRIPTION_CHARS],
        category=category,
        path=path,
    )


def find_skills(root: Path) -> list[Skill]:
    """Every skill under ``root`` (sorted by category, then name; hidden directories skipped)."""
    found: list[Skill] = []
    if not root.is_dir():
        return found
    for current, dirs, files in os.walk(root):
        here = Path(current)
        depth = len(here.relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and depth < _MAX_DEPTH)
        if "SKILL.md" in files and here != root:
            found.append(_describe(here, root))
            dirs[:] = []  # a skill's own sub-directories are its linked files
            if len(found) >= _MAX_SKILLS:
                break
    return sorted(found, key=lambda s: (s.category or "", s.name))


def _error(message: str) -> JSONObject:
    return {"success": False, "error": message}


def _inside(root: Path, candidate: Path) -> bool:
    try:
        candidate.resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return False
    return True


async def _skills_list(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    root = _skills_directory(runtime)
    skills = find_skills(root)
    category = args.get("category")
    if isinstance(category, str) and category:
        skills = [s for s in skills if s.category == category]
    if not skills:
        return {
            "success": True,
            "skills": [],
            "categories": [],
            "count": 0,
            "message": "No skills found" + (f" in category {category!r}" if category else ""),
        }
    return {
        "success": True,
        "skills": [
            {"name": s.name, "description": s.description, "category": s.category} for s in skills
        ],
        "categories": sorted({s.category for s in skills if s.category}),
        "count": len(skills),
        "hint": "Use skill_view(name) to read a skill and see its linked files.",
    }


def _linked_files(skill: Path) -> dict[str, list[str]]:
    linked: dict[str, list[str]] = {}
    for sub in LINKED_DIRS:
        base = skill / sub
        if base.is_dir():
            names = sorted(
                str(p.relative_to(skill))
                for p in base.rglob("*")
                if p.is_file() and _inside(skill, p)
            )
            if names:
                linked[sub] = names
    return linked


async def _skill_view(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    name = str(args["name"]).strip()
    if not name or name.startswith("/") or ".." in Path(name).parts:
        return _error("Skill name must be a relative name inside the skills directory.")
    root = _skills_directory(runtime)
    skills = find_skills(root)
    match = next((s for s in skills if name in (s.name, s.path.name)), None)
    if match is None:
        available = [s.name for s in skills]
        return _error(f"Skill {name!r} not found. Available skills: {available}")
    if not _inside(root, match.path):
        return _error(f"Skill {name!r} points outside the skills directory.")
    file_path = args.get("file_path")
    if isinstance(file_path, str) and file_path.strip():
        relative = file_path.strip()
        target = match.path / relative
        if (
            relative.startswith("/")
            or ".." in Path(relative).parts
            or not _inside(match.path, target)
        ):
            return _error("file_path must be a path inside the skill's directory.")
        if not target.is_file():
            return _error(
                f"No file {relative!r} in skill {match.name!r}: {_linked_files(match.path)}"
            )
        return {
            "success": True,
            "name": match.name,
            "file_path": relative,
            "content": _read_text(target),
        }
    result: JSONObject = {
        "success": True,
        "name": match.name,
        "description": match.description,
        "category": match.category,
        "content": _read_text(match.path / "SKILL.md"),
        "linked_files": dict(_linked_files(match.path)),
    }
    if result["linked_files"]:
        result["hint"] = "Call skill_view(name, file_path=...) to read a linked file."
    return result


SKILLS_LIST_TOOL = Tool(
    name="skills_list",
    description=(
        "List the available skills (name and description): documents with instructions for "
        "specific tasks and workflows. Use skill_view(name) to read one."
    ),
    parameters={
        "type": "object",
        "properties": {
            "category": {
                "type": "string",
                "description": "Optional category filter to narrow the results.",
            }
        },
        "required": [],
    },
    handler=_skills_list,
    toolset="skills",
)

SKILL_VIEW_TOOL = Tool(
    name="skill_view",
    description=(
        "Read a skill: its SKILL.md instructions plus a 'linked_files' list of its references, "
        "templates and scripts. Call again with file_path to read one of those files."
    ),
    parameters={
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The skill's name (see skills_list)."},
            "file_path": {
                "type": "string",
                "description": "A linked file to read instead, relative to the skill "
                "(e.g. 'references/api.md').",
            },
        },
        "required": ["name"],
    },
    handler=_skill_view,
    toolset="skills",
)

TOOLS: tuple[Tool, ...] = (SKILLS_LIST_TOOL, SKILL_VIEW_TOOL)
