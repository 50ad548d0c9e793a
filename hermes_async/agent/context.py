"""ToolContext: reward functions and verifiers reach the rollout's own sandbox.

The reference's reward-side API, every method a coroutine. Without a manager it is standalone
and owns a private sandbox until released. Results are dicts; only an unusable backend and
cancellation raise. Design: docs/decisions/021-tool-context.md.
"""

from __future__ import annotations

import json
import posixpath
import warnings
from collections.abc import Callable, Coroutine, Generator
from typing import Any, ClassVar, Generic, NoReturn, TypeVar

from hermes_async._resource import AsyncResource
from hermes_async.agent.options import DEFAULT_TOOL_TIMEOUT_SECONDS
from hermes_async.errors import SandboxError
from hermes_async.jsontypes import JSONObject
from hermes_async.limits import Limits
from hermes_async.tools.browser import (
    BrowserManager,
    context_browser_navigate,
    context_browser_snapshot,
    current_browser_manager,
)
from hermes_async.tools.browser.standalone import StandaloneBrowser
from hermes_async.tools.registry import ToolRegistry, ToolRuntime, dispatch
from hermes_async.tools.sandbox import transfer
from hermes_async.tools.sandbox.archive import check_tar_members, single_file_tar
from hermes_async.tools.sandbox.base import Sandbox, SandboxProvider
from hermes_async.tools.sandbox.errors import NotARegularFileError, TransferLimitError
from hermes_async.tools.sandbox.manager import SandboxManager, current_sandbox_manager
from hermes_async.tools.sandbox.transfer import DEFAULT_TRANSFER_LIMIT_BYTES
from hermes_async.tools.standalone import StandaloneSandboxes, standalone_factory
from hermes_async.tools.terminal import default_command_timeout

__all__ = ("TerminalResult", "ToolContext")

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


class TerminalResult(dict[str, Any]):
    """The terminal tool's result dict, as :meth:`ToolContext.terminal` returns it.

    Also answers ``["stdout"]`` (= ``["output"]``) and ``["returncode"]`` (= ``["exit_code"]``);
    the aliases are never stored, so the dict shows and serialises the tool's keys only.
    """

    _ALIASES: ClassVar[dict[str, str]] = {"stdout": "output", "returncode": "exit_code"}

    def __missing__(self, key: str) -> Any:
        alias = self._ALIASES.get(key)
        if alias is not None and alias in self:
            return self[alias]
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        """``dict.get``, with the aliases of ``[]``."""
        try:
            return self[key]
        except KeyError:
            return default


class _CleanupHandle:
    """What :meth:`ToolContext.cleanup` returns; awaiting it releases the rest.

    Dropping it unawaited warns when only an await can release the sandbox.
    """

    __slots__ = ("_awaited", "_ctx", "_left")

    def __init__(self, ctx: ToolContext, left: list[str]) -> None:
        self._ctx = ctx
        self._left = left
        self._awaited = False

    def __await__(self) -> Generator[Any, None, None]:
        self._awaited = True
        return self._ctx._release_now().__await__()

    def __repr__(self) -> str:
        return f"<ToolContext({self._ctx.task_id!r}).cleanup(): release queued; await to wait>"

    def __del__(self) -> None:
        if self._left and not self._awaited:
            warnings.warn(
                f"ToolContext({self._ctx.task_id!r}).cleanup() was not awaited: "
                f"{' and '.join(self._left)} cannot be closed synchronously and "
                f"{'were' if len(self._left) > 1 else 'was'} left to end on its own (with "
                "the backend's reaping, or this process); write `await ctx.cleanup()` or use "
                "`async with ToolContext(task_id) as ctx:`",
                RuntimeWarning,
                stacklevel=2,
            )


class ToolContext(AsyncResource):
    """Tool access for reward functions, on the rollout's own sandbox.

    Args:
        manager: The sandbox manager (default: the current one; with none, standalone).
        runtime: A ``ToolRuntime`` (default: one built for ``task_id`` on the manager).
        browsers: The browser manager (default: the runtime's, else the current one).
        terminal_timeout: ``AgentOptions.terminal_timeout``, for terminal calls.
        backend: Standalone only: the backend (default ``TERMINAL_ENV``, else ``local``).
        sandbox_options: Standalone only: the backend's options.
    """

    def __init__(
        self,
        task_id: str,
        *,
        manager: SandboxManager | None = None,
        runtime: ToolRuntime | None = None,
        registry: ToolRegistry | None = None,
        browsers: BrowserManager | None = None,
        terminal_timeout: float | None = None,
        backend: str | None = None,
        sandbox_options: dict[str, Any] | None = None,
    ) -> None:
        self.task_id = task_id
        self._manager = manager if manager is not None else current_sandbox_manager()
        self._runtime = runtime
        self._registry = registry
        self._browsers = browsers
        #: Default command timeout of :meth:`terminal` (set before the first call).
        self.terminal_timeout = terminal_timeout
        self._backend = backend
        self._sandbox_options = sandbox_options
        self._standalone: StandaloneSandboxes | None = None
        self._standalone_browser: StandaloneBrowser | None = None

    def __repr__(self) -> str:
        return f"ToolContext({self.task_id!r})"

    # ----------------------------------------------------------------------------------------
    # plumbing

    @property
    def manager(self) -> SandboxManager:
        """The sandbox manager this context uses.

        Raises:
            SandboxError: The context is standalone.
        """
        if self._manager is None:
            self._manager = current_sandbox_manager()
        if self._manager is None:
            raise SandboxError(
                "this ToolContext is standalone: no SandboxManager was passed or current, so "
                "its sandbox has a private owner; pass ToolContext(task_id, manager=m) or run "
                "inside `async with SandboxManager(...) as m:` + `with use_sandbox_manager(m):` "
                "to share one",
                task_id=self.task_id,
            )
        return self._manager

    @property
    def standalone(self) -> bool:
        """True when no manager was given or current (the context owns a private sandbox)."""
        return self._runtime is None and (self._manager or current_sandbox_manager()) is None

    def _provider(self) -> SandboxProvider:
        if self._runtime is not None and self._runtime.sandboxes is not None:
            return self._runtime.sandboxes
        if self._manager is None:
            self._manager = current_sandbox_manager()
        if self._manager is not None:
            return self._manager
        if self._standalone is None:
            kind, factory = standalone_factory(self._backend, self._sandbox_options)
            self._standalone = StandaloneSandboxes(factory, backend=kind)
        return self._standalone

    @property
    def runtime(self) -> ToolRuntime:
        """The runtime tools are dispatched with (built on first use).

        Raises:
            ConfigError: Standalone, and the configured backend is unknown.
        """
        if self._runtime is None:
            provider = self._provider()
            limits = getattr(provider, "limits", None)
            self._runtime = ToolRuntime(
                task_id=self.task_id,
                limits=limits if isinstance(limits, Limits) else Limits(),
                sandboxes=provider,
                terminal_timeout=self.terminal_timeout,
            )
        return self._runtime

    def _browser_manager(self) -> BrowserManager | None:
        if self._browsers is not None:
            return self._browsers
        if self._runtime is not None and self._runtime.browsers is not None:
            return self._runtime.browsers
        return current_browser_manager()

    def _browser_for_call(self) -> BrowserManager | StandaloneBrowser | None:
        """The browser sessions' owner: a manager, else (standalone) this context's own."""
        manager = self._browser_manager()
        if manager is not None or (self._standalone is None and not self.standalone):
            return manager
        if self._standalone_browser is None:
            self._standalone_browser = StandaloneBrowser()
        return self._standalone_browser

    async def _sandbox(self) -> Sandbox:
        sandboxes = self.runtime.sandboxes
        if sandboxes is None:  # a runtime passed in without sandboxes
            raise SandboxError("this ToolContext's runtime has no sandboxes", task_id=self.task_id)
        return await sandboxes.get(self.task_id)

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

    def terminal(self, command: str, timeout: int | None = None) -> _Pending[TerminalResult]:
        """Run ``command`` in the sandbox; return the terminal tool's :class:`TerminalResult`.

        A non-JSON result comes back as ``{"exit_code": -1, "output": raw}``. The command starts in
        the terminal session's directory; without ``timeout``, ``terminal_timeout`` applies.

        **Cancellation**: the command's process group is killed.
        """

        async def run() -> TerminalResult:
            args: JSONObject = {"command": command}
            if timeout is not None:
                args["timeout"] = timeout
            limit = float(timeout) if timeout is not None else default_command_timeout(self.runtime)
            content = await self._call("terminal", args, limit + _TERMINAL_SLACK_SECONDS)
            value = _loads(content)
            if isinstance(value, dict):
                return TerminalResult(value)
            return TerminalResult({"exit_code": -1, "output": content})

        return _Pending("terminal", run)

    def read_file(self, path: str) -> _Pending[JSONObject]:
        """Read ``path`` with the ``read_file`` tool.

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
        """Call any tool by name; return its raw result string, as the model sees it.

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
        """Copy a host file to ``remote_path``: ``{"exit_code": 0, "bytes": n}`` or ``-1`` and why.

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
        """Copy a host folder into ``remote_dir`` as one checked archive; one result dict per file.

        Setuid/setgid bits are stripped; links out or with ``..`` are refused.

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
        """Stream a sandbox file to ``local_path``: ``{"success": True, "bytes": n}`` or an error.

        A file over ``max_bytes`` (default 1 GiB) is refused; ``local_path`` is written only whole.

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
        """Stream a sandbox folder to ``local_dir``, checked; one result dict per file.

        An unsafe or oversized archive writes nothing and returns ``[{"success": False, ...}]``.

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
        """Navigate the rollout's browser page (the model's session) to ``url``.

        **Cancellation**: the navigation is abandoned; the session stays usable.
        """
        return _Pending(
            "browser_navigate",
            lambda: context_browser_navigate(self.task_id, url, manager=self._browser_for_call()),
        )

    def browser_snapshot(self, full: bool = False) -> _Pending[JSONObject]:
        """The rollout's page as an accessibility snapshot.

        **Cancellation**: nothing to clean up.
        """
        return _Pending(
            "browser_snapshot",
            lambda: context_browser_snapshot(self.task_id, full, manager=self._browser_for_call()),
        )

    # ----------------------------------------------------------------------------------------
    # lifecycle

    def cleanup(self) -> _CleanupHandle:
        """Release the rollout's sandbox. Never raises.

        With a manager the release is queued at once, so an unawaited call still releases;
        awaiting returns when it is gone.

        **Cancellation**: the release is shielded and bounded by the owner's ``close_timeout``.
        """
        left: list[str] = []
        if self._standalone is not None:
            if self._standalone.close_now():
                left.append(f"its {self._standalone.backend} sandbox")
        else:
            manager = self._manager or current_sandbox_manager()
            if manager is not None:
                manager.request_release(self.task_id)
        browsers = self._browser_manager()
        if browsers is not None:
            browsers.request_release(self.task_id)
        if self._standalone_browser is not None and self._standalone_browser.close_now():
            left.append("its browser")
        return _CleanupHandle(self, left)

    async def _release_now(self) -> None:
        if self._standalone_browser is not None:
            await self._standalone_browser.aclose()
        if self._standalone is not None:
            await self._standalone.aclose()
        else:
            manager = self._manager or current_sandbox_manager()
            if manager is not None:
                await manager.release(self.task_id)
        browsers = self._browser_manager()
        if browsers is not None:
            await browsers.release(self.task_id)

    async def aclose(self) -> None:
        """Release the rollout's sandbox now (``async with`` calls it on exit).

        **Cancellation**: the release is shielded and bounded by the owner's ``close_timeout``.
        """
        await self._release_now()


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
