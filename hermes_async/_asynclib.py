"""Which async library is running, the one guard for asyncio-only components, and the event
loops a command can run on.

The core (loop, tools on the local backend, parsers, clients, ``ToolContext``) runs on asyncio
and trio alike. A few components wrap libraries that are asyncio-only by nature — atroposlib
(the environments), aiodocker (the Docker backend), Modal's SDK — and fail in obscure ways
under trio (``RuntimeError: no running event loop`` deep inside aiohttp). Each of them calls
:func:`require_asyncio` at its entry point, so the mistake is reported at once, in one form,
as an :class:`~hermes_async.errors.AsyncBackendError` naming the component, the library that
forces asyncio and what to do.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from typing import Any

from hermes_async.errors import AsyncBackendError, ConfigError

__all__ = ("EVENT_LOOPS", "current_async_library", "loop_options", "require_asyncio")

#: The event loops ``anyio.run`` is given by :func:`loop_options`: asyncio's own, asyncio on
#: uvloop's loop (the ``uvloop`` extra), trio.
EVENT_LOOPS = ("asyncio", "uvloop", "trio")


def current_async_library() -> str | None:
    """``"asyncio"``, ``"trio"``, another library's name, or ``None`` outside any event loop.

    sniffio answers when it is installed (it comes with trio and anyio's test plugin); without
    it, asyncio and trio are asked directly.
    """
    try:
        import sniffio

        return str(sniffio.current_async_library())
    except ImportError:
        pass
    except Exception:  # sniffio.AsyncLibraryNotFoundError: no loop it knows of
        return None
    try:
        asyncio.get_running_loop()
        return "asyncio"
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
            return "trio"
        except RuntimeError:
            pass
    return None


def require_asyncio(component: str, library: str, *, remedy: str) -> None:
    """Raise :class:`AsyncBackendError` unless asyncio is running (or no loop is, yet).

    Args:
        component: What is being used (``"the docker sandbox backend"``).
        library: The asyncio-only library behind it (``"aiodocker"``).
        remedy: What to do instead (``"use terminal_backend='local'"``).

    Raises:
        AsyncBackendError: Another async library (e.g. trio) is running.
    """
    current = current_async_library()
    if current is None or current == "asyncio":
        return
    raise AsyncBackendError(
        f"{component} needs asyncio, but this code runs under {current!r}: {library} is "
        f"asyncio-only and cannot run on another event loop. Run it under asyncio "
        f"(anyio.run(..., backend='asyncio')) or {remedy}",
        library=current,
    )


def loop_options(loop: str) -> dict[str, Any]:
    """``anyio.run``'s ``backend`` and ``backend_options`` for ``loop`` (:data:`EVENT_LOOPS`).

    ``"uvloop"`` is asyncio on uvloop's event loop (anyio's ``use_uvloop``): everything
    asyncio-only (atroposlib, aiodocker) runs on it unchanged. It is opt-in: on the rollout
    benchmarks it saves less than the 15% of client CPU that would make it the default
    (bench/README.md).

    Raises:
        ConfigError: An unknown loop, or ``"uvloop"`` without the uvloop package.
    """
    if loop not in EVENT_LOOPS:
        raise ConfigError(f"unknown event loop {loop!r}; choose one of {', '.join(EVENT_LOOPS)}")
    if loop == "trio":
        return {"backend": "trio"}
    if loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ConfigError(
            "the uvloop event loop needs the uvloop package: pip install 'hermes-async[uvloop]', "
            "or run on asyncio's own loop"
        )
    return {"backend": "asyncio", "backend_options": {"use_uvloop": loop == "uvloop"}}
