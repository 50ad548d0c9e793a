from __future__ import annotations

import importlib
import pathlib
import re

import pytest

import hermes_async


def test_all_is_exact() -> None:
    # The root re-exports lazily: __all__ is every name it knows.
    where = hermes_async._WHERE
    assert set(hermes_async.__all__) - {"__version__"} == set(where)
    assert isinstance(hermes_async.__all__, tuple)
    for name in hermes_async.__all__:
        assert hasattr(hermes_async, name), name
    assert set(hermes_async.__all__) <= set(dir(hermes_async))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        hermes_async.nope  # noqa: B018


def test_root_import_loads_no_subpackage_until_used() -> None:
    import subprocess
    import sys

    code = (
        "import sys, hermes_async; "
        "print(sorted(m for m in sys.modules if m.startswith('hermes_async.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['hermes_async._version']"  # the one leaf it reads


def test_py_typed_shipped() -> None:
    assert (pathlib.Path(hermes_async.__file__).parent / "py.typed").exists()


def test_core_imports_without_extras() -> None:
    # The core must not import atroposlib, aiodocker, modal, asyncssh, e2b, daytona, wandb or
    # transformers.
    heavy = {
        "atroposlib",
        "aiodocker",
        "modal",
        "asyncssh",
        "e2b",
        "daytona",
        "wandb",
        "transformers",
    }
    importlib.import_module("hermes_async")
    # Other tests may import them; check the package's own module sources instead.
    root = pathlib.Path(hermes_async.__file__).parent
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("envs/", "tools/sandbox/docker", "tools/sandbox/modal")):
            continue
        text = path.read_text()
        for mod in heavy:
            assert not re.search(rf"^(import|from) {mod}\b", text, re.M), (rel, mod)


def test_import_in_fresh_interpreter_loads_no_extra() -> None:
    import subprocess
    import sys

    code = (
        "import sys, hermes_async; "
        "import hermes_async.testing, hermes_async.tools.sandbox.backends; "
        "print(sorted({'atroposlib','aiodocker','modal','asyncssh','e2b','daytona','wandb',"
        "'transformers'}"
        " & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_thread_pools_or_nested_loops_in_library() -> None:
    root = pathlib.Path(hermes_async.__file__).parent
    banned = re.compile(
        r"ThreadPoolExecutor|run_in_executor|asyncio\.run\(|new_event_loop|nest_asyncio"
    )
    offenders = [
        f"{p.relative_to(root)}:{i}"
        for p in root.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if banned.search(line)
    ]
    assert offenders == []


def test_no_fire_and_forget_tasks_and_threads_only_behind_named_limiters() -> None:
    """Every task lives in a task group; a worker thread only for a blocking library call
    behind a named limiter (``to_thread.run_sync(..., limiter=...)`` or under ``async with``)."""
    root = pathlib.Path(hermes_async.__file__).parent
    spawn = re.compile(r"\b(create_task|ensure_future|threading\.Thread|call_soon_threadsafe)\(")
    offenders = []
    for path in root.rglob("*.py"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines, 1):
            if spawn.search(line):
                offenders.append(f"{path.relative_to(root)}:{i}")
            if "to_thread.run_sync(" in line and "limiter=" not in line:
                context = "\n".join(lines[max(0, i - 4) : i])
                if "async with" not in context:
                    offenders.append(f"{path.relative_to(root)}:{i} (no named limiter)")
    assert offenders == []
