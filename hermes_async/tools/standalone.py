"""Sandboxes for code that runs outside an environment: a reference-style ``ToolContext``, loop
or ``handle_function_call``.

Outside an environment no ``SandboxManager`` exists, so such code gets a private, task-free
owner (:class:`StandaloneSandboxes`) instead of an error. The backend comes from the arguments,
else ``TERMINAL_ENV``; ``local`` isolation is namespaces as everywhere. A ``ToolContext`` owns
its sandbox until its cleanup; a loop's ``run`` and a ``handle_function_call`` own one for the call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import stat
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from hermes_async._cleanup import bounded_cleanup
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.limits import Limits
from hermes_async.tools.sandbox.backends import make_backend_factory
from hermes_async.tools.sandbox.base import DEFAULT_CLOSE_TIMEOUT_SECONDS, Sandbox
from hermes_async.tools.sandbox.manager import DEFAULT_CREATE_TIMEOUT_SECONDS, SandboxFactory

__all__ = ("StandaloneSandboxes", "close_local_now", "standalone_factory")

logger = logging.getLogger(__name__)

#: The reference's variables naming a backend's image, by backend.
_IMAGE_VARIABLES = {"docker": "TERMINAL_DOCKER_IMAGE", "modal": "TERMINAL_MODAL_IMAGE"}


def _standalone_backend(
    backend: str | None = None, options: Mapping[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """``(backend, options)``: explicit arguments, else ``TERMINAL_ENV`` and its image variable."""
    kind = backend or os.environ.get("TERMINAL_ENV", "").strip() or "local"
    opts = dict(options or {})
    variable = _IMAGE_VARIABLES.get(kind)
    if options is None and variable and os.environ.get(variable):
        opts["image"] = os.environ[variable]
    return kind, opts


def standalone_factory(
    backend: str | None = None, options: Mapping[str, Any] | None = None
) -> tuple[str, SandboxFactory]:
    """The backend name and sandbox factory of :func:`_standalone_backend`.

    Raises:
        ConfigError: An unknown backend (named as ``TERMINAL_ENV`` if it came from there) or option.
    """
    kind, opts = _standalone_backend(backend, options)
    try:
        return kind, make_backend_factory(kind, **opts)
    except ConfigError as exc:
        if not backend and not os.environ.get("TERMINAL_ENV", "").strip():
            raise  # the default backend: the error speaks for itself
        source = "backend" if backend else "TERMINAL_ENV"
        raise ConfigError(f"{source}={kind!r}: {exc}") from exc


def _remove_tree(path: str) -> None:
    def retry(function: Callable[..., object], target: str, _exc: object) -> None:
        # A model that ran `chmod 000 dir` must not make cleanup fail: open it up, retry once.
        try:
            parent = os.path.dirname(target)
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IRWXU)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, stat.S_IRWXU)
            function(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)  # Python 3.11: ``onexc`` is 3.12+


def close_local_now(sandbox: Sandbox) -> bool:
    """Release a process-mode local sandbox synchronously; ``False`` for any other. Never raises."""
    from hermes_async.tools.sandbox.local import LocalSandbox
    from hermes_async.tools.sandbox.processes import find_sandbox_processes

    if not isinstance(sandbox, LocalSandbox) or sandbox.isolation != "process":
        return False
    try:
        for pid in find_sandbox_processes(sandbox.sandbox_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if os.path.isdir(sandbox.root):
            _remove_tree(sandbox.root)
    except OSError as exc:
        logger.warning("could not remove the local sandbox %s: %s", sandbox.root, exc)
    return True


class StandaloneSandboxes:
    """The private owner of a standalone context's sandboxes.

    It has no task group, reaper or janitor, so it can be created inside a context's first awaited
    call and outlive it without leaving a cancel scope behind. Creation is gated by
    ``limits.sandbox_create``; every release is shielded and bounded.
    """

    def __init__(
        self,
        factory: SandboxFactory,
        *,
        backend: str = "local",
        limits: Limits | None = None,
        create_timeout: float = DEFAULT_CREATE_TIMEOUT_SECONDS,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT_SECONDS,
    ) -> None:
        self.factory = factory
        self.backend = backend
        self.limits = limits or Limits()
        self.create_timeout = create_timeout
        self.close_timeout = close_timeout
        self._boxes: dict[str, Sandbox] = {}
        self._lock = anyio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"<StandaloneSandboxes {self.backend} {sorted(self._boxes)}>"

    @property
    def task_ids(self) -> list[str]:
        return list(self._boxes)

    async def get(self, task_id: str) -> Sandbox:
        """``task_id``'s sandbox, created on first use (gated, bounded).

        Raises:
            SandboxError: The owner was closed, or creation failed or timed out.

        **Cancellation**: a creation in progress is abandoned (the factory cleans up).
        """
        async with self._lock:
            if self._closed:
                raise SandboxError(
                    "this ToolContext was cleaned up; build a new ToolContext(task_id)",
                    task_id=task_id,
                )
            box = self._boxes.get(task_id)
            if box is not None:
                return box
            try:
                async with self.limits.sandbox_create:
                    with anyio.fail_after(self.create_timeout):
                        box = await self.factory(task_id)
            except TimeoutError as exc:
                raise SandboxError(
                    f"sandbox creation on terminal_backend={self.backend!r} timed out after "
                    f"{self.create_timeout:g} s; check the backend",
                    task_id=task_id,
                ) from exc
            except SandboxError:
                raise
            except Exception as exc:
                raise SandboxError(
                    f"could not create a {self.backend} sandbox: {type(exc).__name__}: {exc}",
                    task_id=task_id,
                ) from exc
            self._boxes[task_id] = box
            return box

    async def release(self, task_id: str, *, interrupted: bool = False) -> None:
        """Close ``task_id``'s sandbox; idempotent, never raises for a backend failure.

        **Cancellation**: shielded, bounded by ``close_timeout``.
        """
        box = self._boxes.pop(task_id, None)
        if box is None:
            return
        await bounded_cleanup(
            f"close the standalone sandbox of {task_id!r}",
            lambda: box.aclose(interrupted=interrupted),
            timeout=self.close_timeout,
            log=logger,
        )

    async def aclose(self) -> None:
        """Release every sandbox; later ``get`` calls fail. Idempotent.

        **Cancellation**: each release is shielded and bounded by ``close_timeout``.
        """
        self._closed = True
        for task_id in list(self._boxes):
            await self.release(task_id)

    def close_now(self) -> list[str]:
        """Release synchronously what can be (local sandboxes); return the task ids left.

        Behind a reference-style ``ctx.cleanup()`` nobody awaits. Schedules nothing: a namespaced
        world or a container is left for :meth:`aclose`.
        """
        self._closed = True
        left = []
        for task_id, box in list(self._boxes.items()):
            if close_local_now(box):
                del self._boxes[task_id]
            else:
                left.append(task_id)
        return left
