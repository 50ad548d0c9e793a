"""Public names show their public path: ``hermes_async.parsers.ToolCallParser``, not ``._engine``.

Without this, ``repr()``, tracebacks and ``help()`` would show private modules users must
not import. Each package ``__init__`` that re-exports private names calls
:func:`fixup_module_metadata` once at the end, as trio does.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping

__all__ = ("fixup_module_metadata",)


def fixup_module_metadata(module_name: str, namespace: Mapping[str, object]) -> None:
    """Set ``__module__`` of the public names in ``namespace['__all__']`` that a private module holds."""
    names: Iterable[str] = namespace.get("__all__", ())  # type: ignore[assignment]
    for name in names:
        obj = namespace.get(name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        current = getattr(obj, "__module__", "") or ""
        if current.startswith("hermes_async.") and any(
            part.startswith("_") for part in current.split(".")
        ):
            obj.__module__ = module_name
