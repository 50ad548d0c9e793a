"""Sandboxes: the interface (``base``), the local backend, and the per-rollout manager.

Docker and Modal backends live in ``docker`` / ``modal`` and load lazily (their extras are
optional); import them from their modules.
"""

from __future__ import annotations

from hermes_async.tools.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT_BYTES,
    TIMEOUT_EXIT_CODE,
    BackgroundProcess,
    BackgroundStatus,
    ExecResult,
    Sandbox,
    SandboxProvider,
    check_tar_members,
)
from hermes_async.tools.sandbox.local import LocalSandbox, local_factory
from hermes_async.tools.sandbox.manager import (
    ManagedSandbox,
    SandboxFactory,
    SandboxManager,
    SandboxManagerStatistics,
    current_sandbox_manager,
    open_sandbox_manager,
    use_sandbox_manager,
)

__all__ = [
    "DEFAULT_OUTPUT_LIMIT_BYTES",
    "TIMEOUT_EXIT_CODE",
    "BackgroundProcess",
    "BackgroundStatus",
    "ExecResult",
    "LocalSandbox",
    "ManagedSandbox",
    "Sandbox",
    "SandboxFactory",
    "SandboxManager",
    "SandboxManagerStatistics",
    "SandboxProvider",
    "check_tar_members",
    "current_sandbox_manager",
    "local_factory",
    "open_sandbox_manager",
    "use_sandbox_manager",
]
