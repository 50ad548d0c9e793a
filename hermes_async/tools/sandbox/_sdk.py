"""What the SDK-driven backends (Docker, ssh, Modal, E2B, Daytona) share about their SDKs.

* :func:`import_sdk`: the lazy import of a backend's optional dependency, whose absence is a
  :class:`~hermes_async.errors.ConfigError` naming the extra to install.
* :func:`error_named`: an SDK failure matched by its class name, so that a test double raises
  look-alike classes without importing the SDK.
"""

from __future__ import annotations

import importlib
from typing import Any

from hermes_async.errors import ConfigError

__all__ = ("error_named", "import_sdk")


def import_sdk(module: str, *, backend: str, what: str) -> Any:
    """Import ``module`` for the ``backend`` sandbox backend (its extra is ``backend``).

    Args:
        module: The module to import (``"aiodocker"``).
        backend: The backend's ``terminal_backend`` name, which is also its extra's name.
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
    """Whether ``exc`` is an instance of a class called one of ``names`` (an SDK's or its
    double's: the backends match SDK errors by name, so a double need not import the SDK)."""
    return any(cls.__name__ in names for cls in type(exc).__mro__)
