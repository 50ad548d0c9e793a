"""Helpers the test modules share: one tokenizer, fast retries, a recording sandbox factory.

Fakes that environment authors can use too live in :mod:`hermes_async.testing`; this module
holds only what our own tests repeat.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from _pytest.mark.structures import ParameterSet

from hermes_async.inference import HTTPOptions, RetryPolicy
from hermes_async.inference.tokenizer import Tokenizer, load_tokenizer
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.local import LocalSandbox, local_factory

__all__ = (
    "FAST",
    "FAST_RETRY",
    "SOAK",
    "TOKENIZER",
    "RecordingFactory",
    "open_fds",
    "scaled",
    "tool_call",
    "wait_until",
)

#: Soak sizes run only by hand, with ``HERMES_ASYNC_SOAK=1`` (CI runs the slow sizes).
SOAK = pytest.mark.skipif(
    os.environ.get("HERMES_ASYNC_SOAK") != "1",
    reason="soak size: run by hand with HERMES_ASYNC_SOAK=1",
)


def scaled(
    default: int, slow: int, soak: int | None = None, *, timeout: float | None = None
) -> list[ParameterSet]:
    """The sizes of a scale test, as parameters: ``default`` in every run, ``slow`` with
    ``--run-slow`` (CI), ``soak`` with ``HERMES_ASYNC_SOAK=1``. ``timeout``: the per-test
    timeout of the larger sizes."""
    bound = [pytest.mark.timeout(timeout)] if timeout is not None else []
    sizes = [pytest.param(default, id=str(default))]
    sizes.append(pytest.param(slow, id=str(slow), marks=[pytest.mark.slow, *bound]))
    if soak is not None:
        sizes.append(pytest.param(soak, id=str(soak), marks=[SOAK, *bound]))
    return sizes


#: The offline Qwen tokenizer, its chat template loaded once at import.
TOKENIZER: Tokenizer = load_tokenizer()
TOKENIZER.apply_chat_template([{"role": "user", "content": "x"}], None)

#: Retries after 10-20 ms instead of 0.25-8 s: the tests count attempts, not wait for them.
FAST_RETRY = RetryPolicy(initial_backoff_seconds=0.01, max_backoff_seconds=0.02)
FAST = HTTPOptions(retry=FAST_RETRY)


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """One hermes-format tool call, as the scripted model writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class RecordingFactory:
    """Local sandboxes under ``root`` (``options``: :func:`local_factory`'s) that records every
    one it created.

    Process isolation unless ``options`` say otherwise: most tests using it are about rollouts,
    cancellation and cleanup, and they time them; namespaced worlds have their own tests in
    tests/tools/sandbox/.
    """

    def __init__(self, root: Path, **options: Any) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        options.setdefault("isolation", "process")
        self.inner = local_factory(str(root), **options)
        self.created: list[LocalSandbox] = []

    async def __call__(self, task_id: str) -> Sandbox:
        sandbox = await self.inner(task_id)
        assert isinstance(sandbox, LocalSandbox)
        self.created.append(sandbox)
        return sandbox

    def leftovers(self) -> list[str]:
        """Sandbox directories still on disk."""
        return [s.root for s in self.created if os.path.exists(s.root)]

    def leftover_processes(self) -> list[int]:
        """Live processes of every sandbox created (a ``/proc`` scan)."""
        return [pid for sandbox in self.created for pid in sandbox.live_processes()]


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` every 10 ms; fail the test after ``timeout`` seconds.

    For state outside the test's control (processes, a janitor's queue). Where the code under
    test fires an event, wait for the event instead.
    """
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


async def cancelled_once_set(event: anyio.Event, call: Callable[[], Awaitable[object]]) -> bool:
    """Run ``call``, cancel it once ``event`` is set; whether the cancellation was caught.

    For "cancel while X is under way": wait for X, not for a fixed time, which a busy machine
    can outlast before X has begun.
    """
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def cancel_when_set() -> None:
                await event.wait()
                scope.cancel()

            tg.start_soon(cancel_when_set)
            await call()
            tg.cancel_scope.cancel()
    return scope.cancelled_caught


def processes_mentioning(text: str) -> list[int]:
    """Live host processes (not zombies, not this one) whose command line contains ``text``.

    A namespaced world's launcher, supervisor and bubblewrap all name its directory.
    """
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text.encode() in cmdline and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def open_fds() -> set[str]:
    """This process's open file descriptors."""
    return set(os.listdir("/proc/self/fd"))
