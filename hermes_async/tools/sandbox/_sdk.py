"""What the SDK-driven backends share: :func:`import_sdk` (a missing SDK is a ``ConfigError``
naming the extra) and :func:`error_named` (SDK errors matched by class name).
"""

from __future__ import annotations

import importlib
from typing import Any

from hermes_async.errors import ConfigError

__all__ = ("error_named", "import_sdk")


def import_sdk(module: str, *, backend: str, what: str) -> Any:
    """Import ``module`` for the ``backend`` sandbox backend, whose extra has the same name.

    Args:
        what: The dependency as the error names it (``"the e2b SDK"``).

    Raises:
        ConfigError: It is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"the {backend} sandbox backend needs {what}: install the extra with "
            f"`pip install 'hermes-async[{backend}]'`"
        ) from exc


def error_named(exc: BaseException, *names: str) -> bool:
    """Whether ``exc``'s class is called one of ``names``, so a double need not import the SDK."""
    return any(cls.__name__ in names for cls in type(exc).__mro__)
