"""Issue #14's toolsets and reference shims: skills, code_execution, delegation, every
distribution, ``get_tool_definitions(..., quiet_mode=...)``, ``handle_function_call``,
``resize_tool_pool``."""

from __future__ import annotations

import json
import pathlib
import random
from collections.abc import AsyncIterator

import anyio
import pytest

from hermes_async.agent_loop import resize_tool_pool
from hermes_async.errors import ConfigError
from hermes_async.limits import Limits
from hermes_async.tools.model_tools import get_tool_definitions, handle_function_call
from hermes_async.tools.registry import ToolRuntime, dispatch, use_tool_defaults
from hermes_async.tools.sandbox.local import local_factory
from hermes_async.tools.sandbox.manager import SandboxManager, open_sandbox_manager
from hermes_async.tools.skills import BUILTIN_SKILLS_DIR, find_skills, parse_front_matter
from hermes_async.tools.toolsets import (
    DISTRIBUTIONS,
    TOOLSETS,
    sample_toolsets_from_distribution,
)

pytestmark = pytest.mark.anyio


def write_skill(root: pathlib.Path, rel: str, front: str, body: str = "Body.\n") -> pathlib.Path:
    skill = root / rel
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(f"---\n{front}\n---\n{body}")
    return skill


@pytest.fixture
def skills_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "skills"
    skill = write_skill(
        root,
        "mlops/fine-tune",
        'name: fine-tune\ndescription: "Fine-tune a model: data, run, eval."\ntags: [a, b]\n'
        "metadata:\n  hermes:\n    tags: [x]",
        "# Fine-tune\nSteps.\n",
    )
    (skill / "references").mkdir()
    (skill / "references" / "lora.md").write_text("LoRA notes")
    (skill / "scripts").mkdir()
    (skill / "scripts" / "run.sh").write_text("echo run")
    write_skill(root, "top-level", "name: top-level\ndescription: No category.")
    write_skill(root, ".hidden/secret", "name: secret\ndescription: hidden")
    (tmp_path / "outside.txt").write_text("host secret")
    return root


async def call(name: str, args: dict[str, object], **runtime: object) -> dict[str, object]:
    outcome = await dispatch(name, args, ToolRuntime("t", **runtime))  # type: ignore[arg-type]
    value = json.loads(outcome.content)
    assert isinstance(value, dict)
    return value


# ---------------------------------------------------------------- toolsets


def test_new_toolsets_resolve_and_offer_their_tools() -> None:
    assert TOOLSETS["skills"].tools == ("skills_list", "skill_view")
    assert TOOLSETS["code_execution"].tools == ("execute_code",)
    defs = get_tool_definitions(["skills", "code_execution"], None, quiet_mode=True)
    assert defs.valid_names == {"skills_list", "skill_view", "execute_code"}
    # Toolsets whose tools cannot exist in RL resolve (no crash) and offer nothing.
    assert get_tool_definitions(["delegation", "memory", "session_search"]).valid_names == set()


#: The reference's distribution table (toolset_distributions.py), every name.
REFERENCE_DISTRIBUTIONS = {
    "default", "image_gen", "research", "science", "development", "safe", "balanced",
    "minimal", "terminal_only", "terminal_web", "creative", "reasoning", "browser_use",
    "browser_only", "browser_tasks", "terminal_tasks", "mixed_tasks",
}  # fmt: skip


def test_every_reference_distribution_resolves() -> None:
    assert set(DISTRIBUTIONS) >= REFERENCE_DISTRIBUTIONS
    rng = random.Random(3)
    for name in DISTRIBUTIONS:
        for _ in range(20):
            chosen = sample_toolsets_from_distribution(name, rng)
            defs = get_tool_definitions(
                enabled_toolsets=chosen, disabled_toolsets=None, quiet_mode=True
            )
            assert isinstance(defs.schemas, list)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("delegate_task", "Delegation is not available in RL environments."),
        ("memory", "Memory is not available in RL environments."),
        ("clarify", "Clarify is not available in RL environments."),
    ],
)
async def test_tools_that_cannot_exist_in_rl_answer_with_the_reference_error(
    name: str, message: str
) -> None:
    assert await call(name, {"goal": "x"}) == {"error": message}


# ---------------------------------------------------------------- skills


def test_front_matter_parser() -> None:
    keys, body = parse_front_matter("---\nname: 'a'\ndescription: b: c\nlist:\n  - x\n---\n# T\n")
    assert keys == {"name": "a", "description": "b: c"} and body == "# T\n"
    assert parse_front_matter("no front matter") == ({}, "no front matter")


async def test_skills_list_and_view(skills_dir: pathlib.Path) -> None:
    listed = await call("skills_list", {}, skills_dir=str(skills_dir))
    assert listed["success"] is True and listed["count"] == 2
    assert listed["skills"] == [
        {"name": "top-level", "description": "No category.", "category": None},
        {
            "name": "fine-tune",
            "description": "Fine-tune a model: data, run, eval.",
            "category": "mlops",
        },
    ]
    assert listed["categories"] == ["mlops"]
    only = await call("skills_list", {"category": "mlops"}, skills_dir=str(skills_dir))
    assert [s["name"] for s in only["skills"]] == ["fine-tune"]  # type: ignore[union-attr,index]
    view = await call("skill_view", {"name": "fine-tune"}, skills_dir=str(skills_dir))
    assert view["content"] == (skills_dir / "mlops/fine-tune/SKILL.md").read_text()
    assert view["linked_files"] == {
        "references": ["references/lora.md"],
        "scripts": ["scripts/run.sh"],
    }
    linked = await call(
        "skill_view",
        {"name": "fine-tune", "file_path": "references/lora.md"},
        skills_dir=str(skills_dir),
    )
    assert linked == {
        "success": True,
        "name": "fine-tune",
        "file_path": "references/lora.md",
        "content": "LoRA notes",
    }


@pytest.mark.parametrize(
    "args",
    [
        {"name": "../outside.txt"},
        {"name": "/etc"},
        {"name": "fine-tune", "file_path": "../../../outside.txt"},
        {"name": "fine-tune", "file_path": "/etc/passwd"},
        {"name": "secret"},
        {"name": "missing"},
    ],
)
async def test_skills_are_read_only_and_confined(
    skills_dir: pathlib.Path, args: dict[str, object]
) -> None:
    result = await call("skill_view", args, skills_dir=str(skills_dir))
    assert result["success"] is False and "host secret" not in json.dumps(result)


async def test_symlink_out_of_a_skill_is_refused(skills_dir: pathlib.Path) -> None:
    link = skills_dir / "mlops/fine-tune/references/escape.md"
    link.symlink_to(skills_dir.parent / "outside.txt")
    result = await call(
        "skill_view",
        {"name": "fine-tune", "file_path": "references/escape.md"},
        skills_dir=str(skills_dir),
    )
    assert result["success"] is False


async def test_builtin_example_and_run_defaults(
    skills_dir: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "no-such-home"))
    listed = await call("skills_list", {})
    assert [s["name"] for s in listed["skills"]] == ["run-python-tests"]  # type: ignore[union-attr,index]
    assert find_skills(BUILTIN_SKILLS_DIR)[0].category == "software-development"
    view = await call("skill_view", {"name": "run-python-tests"})
    assert "python -m pytest" in str(view["content"])
    # The reference's location ($HERMES_HOME/skills) wins over the examples ...
    monkeypatch.setenv("HERMES_HOME", str(skills_dir.parent))
    assert (await call("skills_list", {}))["count"] == 2
    # ... and the run's skills_dir over both; a runtime's own setting over the run's.
    other = tmp_path / "other"
    write_skill(other, "only", "name: only\ndescription: The only one.")
    with use_tool_defaults(skills_dir=str(other)):
        assert (await call("skills_list", {}))["count"] == 1
        assert (await call("skills_list", {}, skills_dir=str(skills_dir)))["count"] == 2


# ---------------------------------------------------------------- execute_code


@pytest.fixture
async def manager(tmp_path: pathlib.Path) -> AsyncIterator[SandboxManager]:
    (tmp_path / "sbx").mkdir()
    async with SandboxManager(local_factory(str(tmp_path / "sbx"))) as m:
        yield m


async def run_code(manager: SandboxManager, **args: object) -> dict[str, object]:
    runtime = ToolRuntime("t", limits=manager.limits, sandboxes=manager, terminal_timeout=2.0)
    outcome = await dispatch("execute_code", args, runtime)
    value = json.loads(outcome.content)
    assert isinstance(value, dict)
    return value


async def test_execute_code_runs_python_in_the_sandbox(manager: SandboxManager) -> None:
    result = await run_code(
        manager, code="import os\nprint(6 * 7)\nopen('made.txt', 'w').write(os.getcwd())"
    )
    assert result["status"] == "success" and result["output"] == "42\n", result
    assert result["exit_code"] == 0 and result["tool_calls_made"] == 0
    sandbox = await manager.get("t")
    assert (await sandbox.read_bytes("made.txt")).decode() == sandbox.workdir
    # Quotes, heredoc markers and shell syntax in the program are just Python.
    tricky = await run_code(manager, code="print('EOF \"$(x)\" `y`')")
    assert tricky["output"] == 'EOF "$(x)" `y`\n'


async def test_execute_code_errors_and_terminal_limits(manager: SandboxManager) -> None:
    failed = await run_code(manager, code="raise SystemExit('boom')")
    assert failed["status"] == "error" and failed["exit_code"] == 1
    assert "boom" in str(failed["output"])
    start = anyio.current_time()
    slow = await run_code(manager, code="import time\ntime.sleep(30)")
    assert slow["status"] == "timeout" and slow["exit_code"] == 124
    assert slow["error"] == "Code timed out after 2 seconds"
    assert anyio.current_time() - start < 10
    too_long = await run_code(manager, code="print(1)", timeout=601)
    assert too_long["status"] == "error" and "maximum of 600s" in str(too_long["error"])
    # It runs in the terminal's session directory.
    runtime = ToolRuntime("t", limits=manager.limits, sandboxes=manager)
    await dispatch("terminal", {"command": "mkdir -p deep && cd deep"}, runtime)
    here = await run_code(manager, code="import os; print(os.getcwd())")
    assert str(here["output"]).rstrip().endswith("/deep")


# ---------------------------------------------------------------- shims


async def test_handle_function_call_reference_spelling(tmp_path: pathlib.Path) -> None:
    async with open_sandbox_manager(local_factory(str(tmp_path))) as manager:
        first = await handle_function_call(
            "terminal", {"command": "echo hi > f.txt && echo ok"}, task_id="x"
        )
        assert json.loads(first)["output"] == "ok\n"
        second = await handle_function_call("read_file", '{"path": "f.txt"}', task_id="x")
        assert "hi" in json.loads(second)["content"]
        assert "x" in manager.task_ids()
    assert json.loads(await handle_function_call("todo", {})) == {
        "error": "todo must be handled by the agent loop"
    }
    unknown = json.loads(await handle_function_call("nope", {}, task_id="x"))
    assert "Unknown tool 'nope'" in unknown["error"]


async def test_handle_function_call_outside_a_run_owns_a_private_sandbox(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = json.loads(await handle_function_call("terminal", {"command": "pwd"}, task_id="solo"))
    assert out["exit_code"] == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("hermes-sbx-")]
    monkeypatch.setenv("TERMINAL_ENV", "vagrant")
    with pytest.raises(ConfigError, match=r"TERMINAL_ENV='vagrant'.*available: local, docker"):
        await handle_function_call("terminal", {"command": "pwd"})
    # A backend that exists but is not configured says what to set.
    monkeypatch.setenv("TERMINAL_ENV", "ssh")
    monkeypatch.delenv("TERMINAL_SSH_HOST", raising=False)
    with pytest.raises(ConfigError, match=r"TERMINAL_ENV='ssh'.*needs a host.*TERMINAL_SSH_HOST"):
        await handle_function_call("terminal", {"command": "pwd"})


async def test_resize_tool_pool_resizes_the_current_run() -> None:
    with pytest.raises(ConfigError, match=r"resize_tool_pool\(4\) needs a run"):
        resize_tool_pool(4)
    own = Limits()
    assert resize_tool_pool(3, limits=own) is own and own.tool_calls.total == 3
    async with open_sandbox_manager() as manager:
        assert resize_tool_pool(5) is manager.limits
        assert manager.limits.tool_calls.total == 5
