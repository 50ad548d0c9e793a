"""Sandboxes: the interface (``base``), the local backend, the per-rollout manager.

``manager`` gives one sandbox per rollout and bounds every release; ``backends`` is the
registry ``terminal_backend`` selects from. The other backends (``docker``, ``modal``, ``ssh``,
``e2b``, ``daytona``, ``apptainer``) load lazily from their own modules. Layout:
docs/architecture.md.
"""

from __future__ import annotations

from hermes_async.tools.sandbox.archive import check_tar_members, single_file_tar
from hermes_async.tools.sandbox.backends import (
    available_backends,
    make_backend_factory,
    register_backend,
)
from hermes_async.tools.sandbox.base import (
    BACKGROUND_LOG_LIMIT_BYTES,
    DEFAULT_OUTPUT_LIMIT_BYTES,
    MAX_READ_BYTES,
    TIMEOUT_EXIT_CODE,
    BackgroundProcess,
    BackgroundStatus,
    ByteSink,
    ExecRequest,
    ExecResult,
    Sandbox,
    SandboxProvider,
)
from hermes_async.tools.sandbox.errors import SandboxUnavailableError, TransferLimitError
from hermes_async.tools.sandbox.local import Isolation, LocalSandbox, local_factory
from hermes_async.tools.sandbox.manager import (
    ManagedSandbox,
    SandboxFactory,
    SandboxManager,
    SandboxManagerStatistics,
    current_sandbox_manager,
    open_sandbox_manager,
    use_sandbox_manager,
)
from hermes_async.tools.sandbox.namespaces import NamespaceOptions
from hermes_async.tools.sandbox.output import OutputCapture
from hermes_async.tools.sandbox.processes import ProcessSweeper
from hermes_async.tools.sandbox.transfer import DEFAULT_TRANSFER_LIMIT_BYTES
from hermes_async.tools.sandbox.warm_pool import WarmPoolOptions, WarmPoolStatistics
from hermes_async.tools.sandbox.wrapper import SandboxWrapper

__all__ = (
    "BACKGROUND_LOG_LIMIT_BYTES",
    "DEFAULT_OUTPUT_LIMIT_BYTES",
    "DEFAULT_TRANSFER_LIMIT_BYTES",
    "MAX_READ_BYTES",
    "TIMEOUT_EXIT_CODE",
    "BackgroundProcess",
    "BackgroundStatus",
    "ByteSink",
    "ExecRequest",
    "ExecResult",
    "Isolation",
    "LocalSandbox",
    "ManagedSandbox",
    "NamespaceOptions",
    "OutputCapture",
    "ProcessSweeper",
    "Sandbox",
    "SandboxFactory",
    "SandboxManager",
    "SandboxManagerStatistics",
    "SandboxProvider",
    "SandboxUnavailableError",
    "SandboxWrapper",
    "TransferLimitError",
    "WarmPoolOptions",
    "WarmPoolStatistics",
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
