"""ToolContext: reward functions and verifiers reach the rollout's own sandbox.

``ToolContext(task_id)`` gives ``compute_reward`` the same sandbox the model used: run tests in it,
read the files the model wrote, upload fixtures, download artifacts. It is the reference's API
with one change: every method is a coroutine, so it never blocks the event loop::

    async def compute_reward(self, item, result, ctx: ToolContext) -> float:
        out = await ctx.terminal("pytest -q", timeout=180)
        return 1.0 if out["exit_code"] == 0 else 0.0

Which sandbox: the one the current :class:`~hermes_async.tools.sandbox.manager.SandboxManager`
holds for ``task_id`` (set by the environment with ``use_sandbox_manager``), or the ``manager``
passed explicitly. Without either, sandbox methods raise :class:`~hermes_async.errors.SandboxError`
saying how to set one.

Returned vs raised: like the reference, methods return result dicts for everything the sandbox or
a tool reports (non-zero exits, missing files, rejected archives); only a missing manager (an
operator mistake) and cancellation are raised.

Two guards for code written against the synchronous reference:

* **A result used without ``await``** (``ctx.terminal("ls")["exit_code"]``) raises ``TypeError:
  ... write `await ctx.terminal(...)` ...`` instead of failing obscurely later. A call whose result
  is dropped without ``await`` does nothing and emits a ``RuntimeWarning``, like a coroutine.
* **``ctx.cleanup()`` without ``await``** (reference code calls it in a ``finally``) still releases
  the sandbox: calling ``cleanup()`` immediately queues the release to the manager's own janitor
  task (``SandboxManager.request_release``; no task is spawned here), which releases it at its
  next scheduling point, shielded and bounded; the manager's exit releases anything left. Awaiting
  the handle instead releases at once and returns when the sandbox is gone. The environment also
  releases the sandbox in its own ``finally``, so a rollout never leaks one either way.

Transfers (:mod:`hermes_async.tools.sandbox.transfer`) are binary-safe and bounded: downloads
*stream* from the sandbox to disk (host memory holds one 64 KiB chunk), each capped at
``max_bytes`` (default :data:`~hermes_async.tools.sandbox.transfer.DEFAULT_TRANSFER_LIMIT_BYTES`,
1 GiB; a file known to be larger is refused before a byte moves) with a clear error past it;
nothing partial is left behind. Directory downloads are checked member by member and extracted
with the ``data`` filter into a fresh directory by the one extractor of
:mod:`hermes_async.tools.sandbox.archive` (absolute names, ``..``, links with ``..`` or absolute
targets, setuid/setgid files and devices are refused before anything is written); uploads are
checked by the same rules. Host-side files are read and written by subprocesses, so nothing
blocks the event loop.
"""

from __future__ import annotations

import json
import posixpath
import warnings
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, NoReturn, TypeVar

from hermes_async._resource import AsyncResource
from hermes_async.errors import SandboxError
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.browser import (
    BrowserManager,
    context_browser_navigate,
    context_browser_snapshot,
    current_browser_manager,
)
from hermes_async.tools.registry import ToolRegistry, ToolRuntime, dispatch
from hermes_async.tools.sandbox import transfer
from hermes_async.tools.sandbox.archive import check_tar_members, single_file_tar
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.errors import NotARegularFileError, TransferLimitError
from hermes_async.tools.sandbox.manager import SandboxManager, current_sandbox_manager
from hermes_async.tools.sandbox.transfer import DEFAULT_TRANSFER_LIMIT_BYTES

__all__ = ("DEFAULT_TOOL_TIMEOUT_SECONDS", "ToolContext")

#: Deadline for one tool call through the context (the reference's ``future.result(timeout=300)``).
#: ``terminal`` gets its own command timeout plus :data:`_TERMINAL_SLACK_SECONDS` instead.
DEFAULT_TOOL_TIMEOUT_SECONDS = 300.0

#: Extra time a terminal call gets over its command timeout, so the tool reports the timeout
#: itself (exit 124) rather than being cancelled from outside.
_TERMINAL_SLACK_SECONDS = 60.0

T = TypeVar("T")


class _Pending(Generic[T]):
    """The awaitable a ToolContext method returns; refuses to be used as its result."""

    __slots__ = ("_awaited", "_factory", "_name")

    def __init__(self, name: str, factory: Callable[[], Coroutine[Any, Any, T]]) -> None:
        self._name = name
        self._factory = factory
        self._awaited = False

    def __await__(self) -> Generator[Any, None, T]:
        if self._awaited:
            raise RuntimeError(f"ctx.{self._name}(...) was already awaited; call it again")
        self._awaited = True
        return self._factory().__await__()

    def _misuse(self, *args: object, **kwargs: object) -> NoReturn:
        self._awaited = True  # reported here; no "never awaited" warning on top
        raise TypeError(
            f"ToolContext.{self._name}() is a coroutine in hermes_async: write "
            f"`await ctx.{self._name}(...)` to get its result (the reference's ToolContext was "
            "synchronous)"
        )

    __getitem__ = _misuse
    __contains__ = _misuse
    __iter__ = _misuse
    __len__ = _misuse
    __bool__ = _misuse
    get = _misuse
    keys = _misuse
    values = _misuse
    items = _misuse
    startswith = _misuse

    def __repr__(self) -> str:
        return f"<pending ctx.{self._name}(...); await it>"

    def __del__(self) -> None:
        if not self._awaited:
            warnings.warn(
                f"ctx.{self._name}(...) was never awaited, so it did nothing; write "
                f"`await ctx.{self._name}(...)`",
                RuntimeWarning,
                stacklevel=2,
            )


class _CleanupHandle:
    """Returned by :meth:`ToolContext.cleanup`; the release is already queued when you get it."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    def __await__(self) -> Generator[Any, None, None]:
        return self._ctx._release_now().__await__()

    def __repr__(self) -> str:
        return f"<ToolContext({self._ctx.task_id!r}).cleanup(): release queued; await to wait>"


class ToolContext(AsyncResource):
    """Tool access for reward functions, on the rollout's own sandbox.

    Args:
        task_id: The rollout whose sandbox to use.
        manager: The sandbox manager (default: the current one, see ``use_sandbox_manager``).
        runtime: A ``ToolRuntime`` to dispatch tools with (default: one built for ``task_id``
            on ``manager``, with the manager's limits).
        registry: Where tools come from (default: the built-in tools).
        browsers: The browser manager for ``browser_*`` methods (default: the runtime's, else
            the current one, see ``use_browser_manager``).
    """

    def __init__(
        self,
        task_id: str,
        *,
        manager: SandboxManager | None = None,
        runtime: ToolRuntime | None = None,
        registry: ToolRegistry | None = None,
        browsers: BrowserManager | None = None,
    ) -> None:
        self.task_id = task_id
        self._manager = manager if manager is not None else current_sandbox_manager()
        self._runtime = runtime
        self._registry = registry
        self._browsers = browsers

    def __repr__(self) -> str:
        return f"ToolContext({self.task_id!r})"

    # ----------------------------------------------------------------------------------------
    # plumbing

    @property
    def manager(self) -> SandboxManager:
        """The sandbox manager this context uses.

        Raises:
            SandboxError: No manager was given and none is current.
        """
        if self._manager is None:
            self._manager = current_sandbox_manager()
        if self._manager is None:
            raise SandboxError(
                "ToolContext has no SandboxManager: pass ToolContext(task_id, manager=m) or "
                "run inside `async with SandboxManager(...) as m:` + `with use_sandbox_manager(m):`",
                task_id=self.task_id,
            )
        return self._manager

    @property
    def runtime(self) -> ToolRuntime:
        """The runtime tools are dispatched with (built on first use)."""
        if self._runtime is None:
            manager = self.manager
            self._runtime = ToolRuntime(
                task_id=self.task_id, limits=manager.limits, sandboxes=manager
            )
        return self._runtime

    def _browser_manager(self) -> BrowserManager | None:
        if self._browsers is not None:
            return self._browsers
        if self._runtime is not None and self._runtime.browsers is not None:
            return self._runtime.browsers
        return current_browser_manager()

    async def _sandbox(self) -> Sandbox:
        return await self.manager.get(self.task_id)

    async def _call(self, name: str, args: JSONObject, timeout: float) -> str:
        outcome = await dispatch(name, args, self.runtime, registry=self._registry, timeout=timeout)
        return outcome.content

    async def _call_json(
        self, name: str, args: JSONObject, *, raw_key: str = "error"
    ) -> JSONObject:
        content = await self._call(name, args, DEFAULT_TOOL_TIMEOUT_SECONDS)
        return _as_dict(content, raw_key)

    # ----------------------------------------------------------------------------------------
    # tools

    def terminal(self, command: str, timeout: int = 180) -> _Pending[JSONObject]:
        """Run ``command`` in the sandbox; return the terminal tool's result dict.

        ``{"output", "exit_code", "error", ...}``; a result that is not JSON comes back as
        ``{"exit_code": -1, "output": raw}``.

        **Cancellation**: the command's process group is killed.
        """

        async def run() -> JSONObject:
            args: JSONObject = {"command": command, "timeout": timeout}
            content = await self._call("terminal", args, float(timeout) + _TERMINAL_SLACK_SECONDS)
            value = _loads(content)
            if isinstance(value, dict):
                return value
            return {"exit_code": -1, "output": content}

        return _Pending("terminal", run)

    def read_file(self, path: str) -> _Pending[JSONObject]:
        """Read ``path`` with the ``read_file`` tool (``{"content": "1|...", ...}``).

        **Cancellation**: nothing to clean up.
        """
        return _Pending("read_file", lambda: self._call_json("read_file", {"path": path}))

    def write_file(self, path: str, content: str) -> _Pending[JSONObject]:
        """Write text to ``path`` with the ``write_file`` tool.

        **Cancellation**: the file may be partially written.
        """
        return _Pending(
            "write_file", lambda: self._call_json("write_file", {"path": path, "content": content})
        )

    def search(self, query: str, path: str = ".") -> _Pending[JSONObject]:
        """Search file contents with the ``search_files`` tool.

        **Cancellation**: nothing to clean up.
        """
        return _Pending(
            "search", lambda: self._call_json("search_files", {"pattern": query, "path": path})
        )

    def web_search(self, query: str) -> _Pending[JSONObject]:
        """Run the ``web_search`` tool.

        **Cancellation**: the HTTP request is cancelled.
        """
        return _Pending("web_search", lambda: self._call_json("web_search", {"query": query}))

    def web_extract(self, urls: list[str]) -> _Pending[JSONObject]:
        """Run the ``web_extract`` tool.

        **Cancellation**: the HTTP requests are cancelled.
        """
        return _Pending("web_extract", lambda: self._call_json("web_extract", {"urls": list(urls)}))

    def call_tool(
        self,
        tool_name: str,
        arguments: JSONObject | str | None = None,
        *,
        timeout: float = DEFAULT_TOOL_TIMEOUT_SECONDS,
    ) -> _Pending[str]:
        """Call any tool by name; return its raw result string (JSON), as the model sees it.

        **Cancellation**: the tool is cancelled (its own cleanup runs).
        """

        async def run() -> str:
            outcome = await dispatch(
                tool_name, arguments, self.runtime, registry=self._registry, timeout=timeout
            )
            return outcome.content

        return _Pending("call_tool", run)

    # ----------------------------------------------------------------------------------------
    # transfers

    def upload_file(
        self, local_path: str, remote_path: str, *, max_bytes: int = DEFAULT_TRANSFER_LIMIT_BYTES
    ) -> _Pending[JSONObject]:
        """Copy a host file into the sandbox at ``remote_path`` (binary-safe, parents created).

        Returns ``{"exit_code": 0, "output": "", "bytes": n}``, or ``exit_code: -1`` with the
        reason in ``output`` (e.g. ``"Local file not found: ..."``, or a file larger than
        ``max_bytes``).

        **Cancellation**: the remote file may be missing or partial.
        """

        async def run() -> JSONObject:
            name = posixpath.basename(remote_path.rstrip("/"))
            if not name:
                return {"exit_code": -1, "output": f"Invalid remote path: {remote_path!r}"}
            try:
                data = await transfer.read_host_file(local_path, max_bytes=max_bytes)
            except FileNotFoundError:
                return {"exit_code": -1, "output": f"Local file not found: {local_path}"}
            except OSError as exc:
                return {"exit_code": -1, "output": str(exc)}
            sandbox = await self._sandbox()
            try:
                await sandbox.put_archive(
                    posixpath.dirname(remote_path) or ".", single_file_tar(name, data)
                )
            except (OSError, ValueError, SandboxError) as exc:
                return {"exit_code": -1, "output": f"Upload failed: {exc}"}
            return {"exit_code": 0, "output": "", "bytes": len(data)}

        return _Pending("upload_file", run)

    def upload_dir(
        self, local_dir: str, remote_dir: str, *, max_bytes: int = DEFAULT_TRANSFER_LIMIT_BYTES
    ) -> _Pending[list[JSONObject]]:
        """Copy a host directory tree into ``remote_dir`` (one archive, binary-safe).

        Setuid/setgid bits are stripped; links to absolute paths or with ``..`` are refused
        (the archive rules of :mod:`hermes_async.tools.sandbox.archive`). Returns one
        ``{"exit_code": 0, "output": "", "path": remote_file}`` per file, or a one-element list
        with ``exit_code: -1`` and the reason.

        **Cancellation**: the remote tree may be partial.
        """

        async def run() -> list[JSONObject]:
            try:
                tar = await transfer.read_host_dir_archive(local_dir, max_bytes=max_bytes)
                members = check_tar_members(tar)
            except FileNotFoundError:
                return [{"exit_code": -1, "output": f"Local directory not found: {local_dir}"}]
            except (OSError, ValueError) as exc:
                return [{"exit_code": -1, "output": f"Upload failed: {exc}"}]
            try:
                sandbox = await self._sandbox()
                await sandbox.put_archive(remote_dir, tar)
            except (OSError, ValueError, SandboxError) as exc:
                return [{"exit_code": -1, "output": f"Upload failed: {exc}"}]
            return [
                {
                    "exit_code": 0,
                    "output": "",
                    "path": posixpath.normpath(posixpath.join(remote_dir, m.name)),
                }
                for m in members
                if m.isfile()
            ]

        return _Pending("upload_dir", run)

    def download_file(
        self, remote_path: str, local_path: str, *, max_bytes: int = DEFAULT_TRANSFER_LIMIT_BYTES
    ) -> _Pending[JSONObject]:
        """Stream a sandbox file to ``local_path`` on the host (parents created, binary-safe).

        Returns ``{"success": True, "bytes": n}`` or ``{"success": False, "error": ...}``; an
        empty file is a success with ``bytes: 0``. A file larger than ``max_bytes`` (default
        1 GiB) is refused with an error naming the sizes; ``local_path`` is only written once
        the whole file arrived.

        **Cancellation**: the transfer stops; no partial file is left.
        """

        async def run() -> JSONObject:
            sandbox = await self._sandbox()
            try:
                size = await transfer.download_file(
                    sandbox, remote_path, local_path, max_bytes=max_bytes
                )
            except NotARegularFileError:
                return {"success": False, "error": f"Not a regular file: {remote_path}"}
            except FileNotFoundError:
                return {"success": False, "error": f"Remote file not found: {remote_path}"}
            except TransferLimitError as exc:
                return {"success": False, "error": f"Download refused: {exc}"}
            except (OSError, ValueError, SandboxError) as exc:
                return {"success": False, "error": f"Download failed: {exc}"}
            return {"success": True, "bytes": size}

        return _Pending("download_file", run)

    def download_dir(
        self, remote_dir: str, local_dir: str, *, max_bytes: int = DEFAULT_TRANSFER_LIMIT_BYTES
    ) -> _Pending[list[JSONObject]]:
        """Stream a sandbox directory tree to ``local_dir`` on the host (one archive).

        Returns one ``{"success": True, "bytes": n, "path": local_file}`` per file, or a
        one-element list ``[{"success": False, "error": ...}]``. Unsafe archives (absolute or
        ``..`` members, links out or with ``..``, setuid/setgid files, devices) are refused
        before anything is written; an archive larger than ``max_bytes`` (default 1 GiB)
        stops with an error and writes nothing.

        **Cancellation**: the transfer stops; ``local_dir`` is left as it was.
        """

        async def run() -> list[JSONObject]:
            sandbox = await self._sandbox()
            try:
                files = await transfer.download_dir(
                    sandbox, remote_dir, local_dir, max_bytes=max_bytes
                )
            except FileNotFoundError:
                return [{"success": False, "error": f"Remote directory not found: {remote_dir}"}]
            except TransferLimitError as exc:
                return [{"success": False, "error": f"Download refused: {exc}"}]
            except (OSError, ValueError, SandboxError) as exc:
                return [{"success": False, "error": f"Download failed: {exc}"}]
            return [{"success": True, "bytes": f.size, "path": f.path} for f in files]

        return _Pending("download_dir", run)

    # ----------------------------------------------------------------------------------------
    # browser

    def browser_navigate(self, url: str) -> _Pending[JSONObject]:
        """Navigate the rollout's browser page to ``url`` (the ``browser_navigate`` result dict).

        The page is the same session the model's ``browser_*`` tools used.

        **Cancellation**: the navigation is abandoned; the session stays usable.
        """
        return _Pending(
            "browser_navigate",
            lambda: context_browser_navigate(self.task_id, url, manager=self._browser_manager()),
        )

    def browser_snapshot(self, full: bool = False) -> _Pending[JSONObject]:
        """The rollout's page as an accessibility snapshot (the ``browser_snapshot`` result).

        **Cancellation**: nothing to clean up.
        """
        return _Pending(
            "browser_snapshot",
            lambda: context_browser_snapshot(self.task_id, full, manager=self._browser_manager()),
        )

    # ----------------------------------------------------------------------------------------
    # lifecycle

    def cleanup(self) -> _CleanupHandle:
        """Release the rollout's sandbox (kill its processes, remove it). Never raises.

        The release is queued to the manager's janitor the moment this is called, so
        ``ctx.cleanup()`` without ``await`` (reference style) still releases the sandbox;
        ``await ctx.cleanup()`` releases it now and returns when it is gone.

        **Cancellation**: the release is shielded and bounded by the manager's
        ``close_timeout``.
        """
        manager = self._manager or current_sandbox_manager()
        if manager is not None:
            manager.request_release(self.task_id)
        browsers = self._browser_manager()
        if browsers is not None:
            browsers.request_release(self.task_id)
        return _CleanupHandle(self)

    async def _release_now(self) -> None:
        manager = self._manager or current_sandbox_manager()
        if manager is not None:
            await manager.release(self.task_id)
        browsers = self._browser_manager()
        if browsers is not None:
            await browsers.release(self.task_id)

    async def aclose(self) -> None:
        """Release the rollout's sandbox now (``async with ToolContext(...)`` calls it on exit).

        **Cancellation**: the release is shielded and bounded by the manager's
        ``close_timeout``.
        """
        await self.cleanup()


def _loads(content: str) -> object:
    try:
        return json.loads(content)
    except (json.JSONDecodeError, ValueError):
        return None


def _as_dict(content: str, raw_key: str) -> JSONObject:
    value = _loads(content)
    if isinstance(value, dict):
        return value
    return {raw_key: content}
