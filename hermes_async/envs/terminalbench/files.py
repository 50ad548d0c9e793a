"""Reading a task folder from outside: regular files only, links kept inside, every read bounded.

A clone can carry ``instruction.md -> /proc/self/environ``, so the loader reads only through
:func:`read_text` (one regular file inside the folder, bounded) and :func:`scan_tree` (a
subfolder walked without following links). Bounds: :class:`FolderLimits`. A breach is a
:class:`TaskError` for that task only.
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path

from hermes_async.errors import ConfigError

__all__ = (
    "FolderLimits",
    "NotRegularFileError",
    "TaskError",
    "Tree",
    "read_head",
    "read_text",
    "scan_tree",
)


class TaskError(ConfigError):
    """A task folder or row is invalid; the message names the task, the field and the fix.

    Attributes:
        reason: What is wrong, without the task name (for a report line).
    """

    def __init__(self, task: str, reason: str) -> None:
        super().__init__(f"task {task!r}: {reason}")
        self.task = task
        self.reason = reason


@dataclass(frozen=True, slots=True)
class FolderLimits:
    """What one task folder may hold; far above any Terminal-Bench 2 task (a few MB at most).

    Attributes:
        max_text_bytes: ``task.toml``, ``instruction.md``, a Dockerfile, ``test.sh``.
        max_tree_bytes: Regular-file bytes in one subfolder (apparent sizes).
        max_tree_entries: Files, folders and links in one subfolder.
    """

    max_text_bytes: int = 1 << 20
    max_tree_bytes: int = 512 << 20
    max_tree_entries: int = 20_000


@dataclass(frozen=True, slots=True)
class Tree:
    """A checked subfolder: its size and entry count (what the archive will hold)."""

    root: Path
    bytes: int
    entries: int


def _inside(folder: Path, path: Path) -> bool:
    real = os.path.realpath(path)
    base = os.path.realpath(folder)
    return real == base or real.startswith(base + os.sep)


class NotRegularFileError(OSError):
    """:func:`read_head` was given a folder, a FIFO, a device or a socket."""


def read_head(path: str | Path, size: int, *, follow_links: bool = True) -> bytes:
    """At most ``size`` bytes from the start of the regular file ``path``.

    Opened without blocking: a FIFO would wait for a writer. A caller that reads ``limit + 1``
    knows a longer file by its length (one that grows after the open is still cut).

    Raises:
        NotRegularFileError: ``path`` is not a regular file.
        OSError: It cannot be opened (``follow_links=False``: a final link is refused).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)  # checked before fdopen, which raises IsADirectoryError for a folder
        raise NotRegularFileError(f"{os.fspath(path)!r} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        return f.read(size)


def read_text(task: str, folder: Path, relative: str, *, max_bytes: int) -> str | None:
    """The UTF-8 text of ``folder/relative``; None when it does not exist.

    Raises:
        TaskError: A link out of the folder, not a regular file, larger than ``max_bytes``,
            unreadable or not UTF-8.
    """
    path = folder / relative
    if not os.path.lexists(path):
        return None
    if not _inside(folder, path):
        raise TaskError(task, f"{relative} is a link out of the task folder; refusing to read it")
    try:
        # The resolved path, not following a link swapped in since.
        data = read_head(os.path.realpath(path), max_bytes + 1, follow_links=False)
    except NotRegularFileError:
        raise TaskError(task, f"{relative} is not a regular file; refusing to read it") from None
    except OSError as exc:
        raise TaskError(task, f"cannot read {relative}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        try:
            size = os.stat(os.path.realpath(path)).st_size
        except OSError:  # gone since: no size to say
            size = 0
        if size > max_bytes:
            raise TaskError(task, f"{relative} is {size} bytes (at most {max_bytes})")
        raise TaskError(task, f"{relative} is more than {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(task, f"{relative} is not UTF-8 text ({exc.reason})") from None


def scan_tree(task: str, root: Path, *, limits: FolderLimits, what: str) -> Tree:
    """Check a subfolder without following links; links must stay inside ``root``.

    Raises:
        TaskError: A device, FIFO or socket; a link leaving ``root``; too many bytes or entries.
    """
    if os.path.islink(root) or not root.is_dir():
        raise TaskError(task, f"{what}/ is not a folder (a link or a file)")
    total = entries = 0
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            listing = list(os.scandir(folder))
        except OSError as exc:
            raise TaskError(task, f"cannot list {what}/: {exc.strerror or exc}") from None
        for entry in listing:
            entries += 1
            if entries > limits.max_tree_entries:
                raise TaskError(task, f"{what}/ has more than {limits.max_tree_entries} entries")
            relative = Path(entry.path).relative_to(root).as_posix()
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(entry.path)
                joined = posixpath.normpath(posixpath.join(posixpath.dirname(relative), target))
                if target.startswith("/") or joined == ".." or joined.startswith("../"):
                    raise TaskError(
                        task, f"{what}/{relative} is a link to {target!r}, out of {what}/"
                    )
                if not _inside(root, Path(entry.path)):
                    raise TaskError(
                        task, f"{what}/{relative} leads out of {what}/ through other links"
                    )
            elif stat.S_ISDIR(info.st_mode):
                stack.append(Path(entry.path))
            elif stat.S_ISREG(info.st_mode):
                total += info.st_size
                if total > limits.max_tree_bytes:
                    raise TaskError(
                        task,
                        f"{what}/ holds more than {limits.max_tree_bytes} bytes "
                        f"({what}/{relative} is {info.st_size}); refusing the task",
                    )
            else:
                raise TaskError(task, f"{what}/{relative} is a device, FIFO or socket")
    return Tree(root, total, entries)
