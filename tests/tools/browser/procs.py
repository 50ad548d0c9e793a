"""Which Chromium browser processes this test process started (its descendants in /proc)."""

from __future__ import annotations

import os

__all__ = ["browser_processes", "children", "read_bytes"]


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        out.extend(int(c) for c in read_bytes(f"/proc/{pid}/task/{tid}/children").split())
    return out


def browser_processes() -> list[int]:
    """PIDs of live Chromium *browser* processes (not renderers, GPU or utility processes)
    descending from this process. Zombies (empty command line) are not counted."""
    out = []
    todo = children(os.getpid())
    while todo:
        pid = todo.pop()
        argv = [a for a in read_bytes(f"/proc/{pid}/cmdline").split(b"\0") if a]
        if argv and os.path.basename(argv[0]).startswith((b"chromium", b"chrome")):
            if not any(a.startswith(b"--type=") for a in argv):
                out.append(pid)
            continue  # a browser's own children are its renderers and helpers
        todo.extend(children(pid))
    return sorted(out)
