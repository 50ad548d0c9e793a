"""Sandboxes: the interface (``base``), the local backend, the per-rollout manager.

Layout: ``base`` (the :class:`Sandbox` ABC, :class:`ExecRequest`, results), ``manager`` (one
sandbox per rollout, the one bound of every release), ``backends`` (the registry
``terminal_backend`` selects from), ``local`` with ``processes`` (host processes of local
sandboxes, the shared ``/proc`` sweeper), ``docker`` / ``modal`` (load lazily; their extras are
optional; import them from their modules), and two helpers every backend uses: ``output``
(head + tail capture) and ``archive`` (tar checks via the stdlib ``data`` filter, building).
"""

from __future__ import annotations

from hermes_async.tools.sandbox.archive import check_tar_members, single_file_tar
from hermes_async.tools.sandbox.backends import (
    available_backends,
    make_backend_factory,
    register_backend,
)
from hermes_async.tools.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT_BYTES,
    TIMEOUT_EXIT_CODE,
    BackgroundProcess,
    BackgroundStatus,
    ExecRequest,
    ExecResult,
    Sandbox,
    SandboxProvider,
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
from hermes_async.tools.sandbox.output import OutputCapture
from hermes_async.tools.sandbox.processes import ProcessSweeper

__all__ = (
    "DEFAULT_OUTPUT_LIMIT_BYTES",
    "TIMEOUT_EXIT_CODE",
    "BackgroundProcess",
    "BackgroundStatus",
    "ExecRequest",
    "ExecResult",
    "LocalSandbox",
    "ManagedSandbox",
    "OutputCapture",
    "ProcessSweeper",
    "Sandbox",
    "SandboxFactory",
    "SandboxManager",
    "SandboxManagerStatistics",
    "SandboxProvider",
    "available_backends",
    "check_tar_members",
    "current_sandbox_manager",
    "local_factory",
    "make_backend_factory",
    "open_sandbox_manager",
    "register_backend",
    "single_file_tar",
    "use_sandbox_manager",
)
