"""Guards on the package's shape: exports, public paths, private imports, import cycles.

* Every public module has a tuple ``__all__`` naming exactly the public classes and functions
  it defines (anyio's ``test_all_attributes``), and every name in it exists.
* Re-exported names report their public module (``__module__``), never a ``_private`` one.
* No package imports another package's private module (``hermes_async.x._y`` from outside
  ``hermes_async.x``); root-level helpers (``hermes_async._cleanup``, ...) serve everyone.
* No public parameter list is longer than 15.
* No import circle between files: every import statement counts (in functions and under
  ``TYPE_CHECKING`` too), and a package's ``__init__`` is a file like the others.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
from collections.abc import Callable, Iterator

import pytest

import hermes_async

ROOT = pathlib.Path(hermes_async.__file__).parent

#: Modules whose import needs an optional extra that a test machine may lack.
# Modules that need an extra (a trainer's package, an SDK) to import.
OPTIONAL = (
    "hermes_async.tools.sandbox.modal",
    "hermes_async.tools.sandbox.docker",
    "hermes_async.integrations.",
)


def _modules() -> Iterator[tuple[str, pathlib.Path]]:
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent)
        if {"tasks", "fixtures"} & set(rel.parts):  # bundled task content, not library code
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _is_private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


PUBLIC = [name for name, _ in _modules() if not _is_private(name)]
ALL_MODULES = dict(_modules())


@pytest.mark.parametrize("name", PUBLIC)
def test_public_module_has_an_exact_tuple_all(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # an optional extra missing on this machine
        if name.startswith(("hermes_async.envs", *OPTIONAL)):
            pytest.skip(f"needs an extra: {exc}")
        raise
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, tuple), f"{name}.__all__ must be a tuple, got {exported!r}"
    for item in exported:
        assert hasattr(module, item), f"{name}.__all__ names {item!r}, which does not exist"
    defined = {
        attr
        for attr, obj in vars(module).items()
        if not attr.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", None) == name
    }
    assert defined <= set(exported), (
        f"{name} defines public names not in __all__: {defined - set(exported)}"
    )


@pytest.mark.parametrize("name", PUBLIC)
def test_exported_names_show_their_public_module(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError:
        pytest.skip("needs an extra")
    for item in getattr(module, "__all__", ()):
        obj = getattr(module, item, None)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            where = getattr(obj, "__module__", "")
            assert not (where.startswith("hermes_async") and _is_private(where)), (
                f"{name}.{item}.__module__ is {where!r}: call "
                "hermes_async._exports.fixup_module_metadata in the re-exporting package"
            )


def _imports(name: str, path: pathlib.Path) -> Iterator[str]:
    """The ``hermes_async`` files that ``path`` imports, from every import statement in it
    (module level, in functions, under ``TYPE_CHECKING``, relative). ``from package import x``
    is the submodule ``x`` when there is one, else the package's ``__init__``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in ALL_MODULES:
                    target = target.rpartition(".")[0]
                if target:
                    yield target
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            if not base.startswith("hermes_async"):
                continue
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in ALL_MODULES]
            yield from subs
            if len(subs) < len(node.names):
                while base and base not in ALL_MODULES:
                    base = base.rpartition(".")[0]
                if base:
                    yield base


def _graph() -> dict[str, set[str]]:
    return {name: set(_imports(name, path)) - {name} for name, path in _modules()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in graph.get(node, ()):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_package_imports_another_packages_private_module() -> None:
    offenders = []
    for name, path in _modules():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in _imports(name, path):
            parts = target.split(".")
            for i, part in enumerate(parts[1:], start=1):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])
                    if owner != "hermes_async" and not (
                        package == owner or package.startswith(owner + ".")
                    ):
                        offenders.append(f"{name} imports {target}")
                    break
    assert offenders == []


def test_the_cycle_search_finds_a_circle_through_a_package() -> None:
    graph = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}, "q": {"p"}}
    assert _cycles(graph) == [["p", "p.a", "p.b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_every_kind_of_import_statement() -> None:
    graph = _graph()
    # In a function: the manager's default factory is found by name through the registry.
    assert "hermes_async.tools.sandbox.backends" in graph["hermes_async.tools.sandbox.manager"]
    # Under TYPE_CHECKING.
    assert "hermes_async.tools.sandbox.manager" in graph["hermes_async.tools.sandbox.snapshot"]
    # A package's __init__ is a file too.
    assert "hermes_async.agent.loop" in graph["hermes_async.agent"]


def test_no_import_circle_between_files() -> None:
    # Every import statement counts, and a package's __init__ is a file like any other.
    assert _cycles(_graph()) == []


#: The longest public parameter list (anchors: trio 9, vLLM 10, verifiers 13, httpcore 15). At
#: the limit: ``HermesAgentLoop``, the reference's nine arguments plus ``options`` and the
#: plumbing. Options go in an options object (``AgentOptions``, ``NamespaceOptions``, ...).
MAX_PARAMETERS = 15


def _public_callables() -> Iterator[tuple[str, Callable[..., object]]]:
    """Every function, constructor and public method a public module exports (written in the
    package: a dataclass's generated ``__init__`` is its fields, not a parameter list)."""
    for name in PUBLIC:
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional extra missing on this machine
            continue
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr, None)
            found: list[tuple[str, object]] = []
            if inspect.isfunction(obj):
                found.append((f"{obj.__module__}.{obj.__qualname__}", obj))
            elif inspect.isclass(obj):
                for key, value in vars(obj).items():
                    if isinstance(value, staticmethod | classmethod):
                        value = value.__func__
                    if key.startswith("_") and key not in ("__init__", "__call__"):
                        continue
                    found.append((f"{obj.__module__}.{obj.__qualname__}.{key}", value))
            for qualified, value in found:
                if not inspect.isfunction(value):
                    continue
                function = inspect.unwrap(value)
                if function.__code__.co_filename.startswith(str(ROOT)):
                    yield qualified, function


def _parameter_count(function: Callable[..., object]) -> int:
    names = list(inspect.signature(function).parameters)
    return len(names) - (names[:1] in (["self"], ["cls"]))


def test_no_public_parameter_list_is_longer_than_15() -> None:
    counts = {name: _parameter_count(f) for name, f in _public_callables()}
    assert counts["hermes_async.agent.loop.HermesAgentLoop.__init__"] == MAX_PARAMETERS
    longer = {name: n for name, n in counts.items() if n > MAX_PARAMETERS}
    assert longer == {}
