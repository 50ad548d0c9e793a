"""Guards on the package's shape: exports, public paths, private imports, import cycles.

* Every public module has a tuple ``__all__`` naming exactly the public classes and functions
  it defines (anyio's ``test_all_attributes``), and every name in it exists.
* Re-exported names report their public module (``__module__``), never a ``_private`` one.
* No package imports another package's private module (``hermes_async.x._y`` from outside
  ``hermes_async.x``); root-level helpers (``hermes_async._cleanup``, ...) serve everyone.
* No import cycle among module-level imports (lazy and ``TYPE_CHECKING`` imports excluded).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
from collections.abc import Iterator

import pytest

import hermes_async

ROOT = pathlib.Path(hermes_async.__file__).parent

#: Kept importable for compatibility, deliberately left out of ``__all__``.
DEPRECATED = {("hermes_async.errors", "ParseError")}

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
        and (name, attr) not in DEPRECATED
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


def _imports(path: pathlib.Path, *, top_level_only: bool) -> Iterator[str]:
    """Dotted hermes_async modules imported by ``path`` (absolute imports)."""
    tree = ast.parse(path.read_text())
    nodes: list[ast.AST]
    if top_level_only:
        nodes = []
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Try):
                nodes.extend(node.body)
            else:
                nodes.append(node)
    else:
        nodes = list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("hermes_async"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("hermes_async"):
                continue
            subs = [f"{node.module}.{a.name}" for a in node.names]
            modules = [s for s in subs if s in ALL_MODULES]
            yield from modules or [node.module]


def test_no_package_imports_another_packages_private_module() -> None:
    offenders = []
    for name, path in _modules():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in _imports(path, top_level_only=False):
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


def test_no_import_cycles() -> None:
    graph = {
        name: {t for t in _imports(path, top_level_only=True) if t in ALL_MODULES and t != name}
        for name, path in _modules()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in graph[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert cycles == []
