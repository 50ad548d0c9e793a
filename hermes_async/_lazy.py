"""Names a package ``__init__`` exports without importing their modules up front.

A package whose public names live in heavy modules (atroposlib, the sandbox backends) sets its
module ``__getattr__`` to :func:`lazy_getattr`: the first access to a name imports the module
that holds it and keeps the value in the package's namespace, so later lookups skip
``__getattr__``; ``import hermes_async`` stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ("lazy_getattr",)


def lazy_getattr(
    package: str, where: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``; ``where`` maps each lazy name to its module.

    Values are cached in ``namespace`` (the package's ``globals()``). An unknown name is an
    ``AttributeError``; the holding module's import error propagates (it names the extra).
    """

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    return __getattr__
