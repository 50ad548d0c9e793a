"""Run a command and timestamp each line it prints (stdout and stderr): start-up measurements."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import anyio
from anyio.abc import ByteReceiveStream
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = ("Line", "Run", "run_timed")


@dataclass(frozen=True)
class Line:
    """One line of output: seconds since the process started, ``"out"`` or ``"err"``, text."""

    seconds: float
    stream: str
    text: str


@dataclass(frozen=True)
class Run:
    """What a command printed, and how it ended (``returncode`` None: stopped by the test)."""

    lines: list[Line]
    returncode: int | None
    seconds: float

    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)

    def first(self, contains: str) -> Line:
        """The first line containing ``contains``."""
        found = [line for line in self.lines if contains in line.text]
        assert found, f"no line contains {contains!r}:\n{self.text()[-3000:]}"
        return found[0]


async def run_timed(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    deadline: float,
    stop: Callable[[Line], bool] | None = None,
) -> Run:
    """Run ``argv``; stop it (SIGTERM, then SIGKILL) at the first line ``stop`` accepts.

    Raises:
        TimeoutError: It ran past ``deadline`` seconds (it is killed).
    """
    lines: list[Line] = []
    start = time.monotonic()
    stopped = False
    async with await anyio.open_process(list(argv), env=dict(env)) as process:

        async def read(stream: ByteReceiveStream | None, name: str) -> None:
            nonlocal stopped
            assert stream is not None
            buffered = BufferedByteReceiveStream(stream)
            while True:
                try:
                    raw = await buffered.receive_until(b"\n", 1 << 20)
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    return
                line = Line(time.monotonic() - start, name, raw.decode("utf-8", "replace"))
                lines.append(line)
                if stop is not None and not stopped and stop(line):
                    stopped = True
                    process.send_signal(signal.SIGTERM)

        try:
            with anyio.fail_after(deadline):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read, process.stdout, "out")
                    tg.start_soon(read, process.stderr, "err")
                await process.wait()
        except TimeoutError:
            process.kill()
            raise
    return Run(lines, None if stopped else process.returncode, time.monotonic() - start)
