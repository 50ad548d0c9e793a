"""Tar archives at the sandbox boundary: the one safety check, the one extractor, building.

Invariant: every archive crossing a sandbox boundary is checked member by member before
anything is written. Host extraction runs in a child process, so this module imports only
the standard library. Rules and reasons: docs/security.md, "Archives at the sandbox boundary".
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import shutil
import stat
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

__all__ = (
    "MAX_ARCHIVE_MEMBERS",
    "ExtractedFile",
    "check_links",
    "check_member",
    "check_tar_members",
    "checked_members",
    "directory_tar",
    "extract_tar_file",
    "main",
    "pack_files",
    "single_file_tar",
)

#: Most members one archive may have (each costs the extractor a ``TarInfo`` in memory).
MAX_ARCHIVE_MEMBERS = 200_000

#: Where the filter pretends to extract: absolute and certainly absent, so that the filter's
#: ``realpath`` calls resolve nothing on the host and the verdict depends on the archive only.
_PHANTOM_DEST = "/nonexistent/hermes-async-archive-check"

#: Exit codes of :func:`main` (the parent maps them to messages).
EXIT_REFUSED = 2
EXIT_TOO_LARGE = 3

_CHUNK = 1 << 16

#: ``(relative path, size)`` of one regular file :func:`extract_tar_file` wrote.
ExtractedFile = tuple[str, int]


def check_member(member: tarfile.TarInfo) -> None:
    """Refuse an unsafe member (rules: docs/security.md).

    Raises:
        ValueError: The member is unsafe; the message names it and the rule.
    """
    name = member.name
    if name.startswith("/"):
        raise ValueError(f"tar member {name!r} has an absolute path; refusing to extract it")
    if member.issym() or member.islnk():
        kind = "symlink" if member.issym() else "hard link"
        target = member.linkname
        if target.startswith("/"):
            raise ValueError(
                f"tar member {name!r} is a {kind} to absolute path {target!r}; refusing it"
            )
    if member.isfile() and member.mode & (stat.S_ISUID | stat.S_ISGID):
        raise ValueError(
            f"tar member {name!r} is setuid/setgid (mode {member.mode:o}); refusing it"
        )
    try:
        tarfile.data_filter(member, _PHANTOM_DEST)
    except tarfile.FilterError as exc:
        raise ValueError(_explain(member, exc)) from exc


def check_tar_members(tar_data: bytes) -> list[tarfile.TarInfo]:
    """Validate a whole tar archive held in memory; return its members unchanged.

    Raises:
        ValueError: Not a tar archive, or a member is unsafe (named in the message).
    """
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_data), mode="r:*") as tf:
            members = tf.getmembers()
    except tarfile.TarError as exc:
        if not tar_data.strip(b"\0"):
            return []
        raise ValueError(f"not a valid tar archive ({len(tar_data)} bytes): {exc}") from exc
    for member in members:
        check_member(member)
    check_links(members)
    return members


#: Most symbolic links followed while resolving one link's target (the kernel's own limit).
_MAX_LINK_HOPS = 40


def _parts(name: str) -> list[str]:
    return [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]


def _lexical(parts: list[str]) -> list[str] | None:
    """``parts`` with ``..`` applied; None when it climbs above the root."""
    out: list[str] = []
    for part in parts:
        if part == "..":
            if not out:
                return None
            out.pop()
        else:
            out.append(part)
    return out


def check_links(members: Iterable[tarfile.TarInfo]) -> None:
    """Refuse links that leave the tree once the archive's own links are followed.

    Judged on the whole archive, in any member order.

    Raises:
        ValueError: A member breaks a rule; the message names it.
    """
    kinds: dict[tuple[str, ...], str] = {}
    links: dict[tuple[str, ...], list[str]] = {}
    names: list[tuple[tarfile.TarInfo, tuple[str, ...]]] = []
    for member in members:
        path = _lexical(_parts(member.name))
        if path is None:
            raise ValueError(f"tar member {member.name!r} escapes the destination ('..')")
        key = tuple(path)
        kind = "link" if member.issym() else "dir" if member.isdir() else "file"
        previous = kinds.get(key)
        if (
            previous is not None
            and "link" in (previous, kind)
            and (previous != kind or links.get(key) != _parts(member.linkname))
        ):
            raise ValueError(
                f"tar member {member.name!r} is a symbolic link and another member of the "
                "same path; refusing it"
            )
        kinds[key] = kind
        if member.issym():
            links[key] = _parts(member.linkname)
        names.append((member, key))
    for member, key in names:
        for depth in range(1, len(key)):
            if key[:depth] in links:
                raise ValueError(
                    f"tar member {member.name!r} lies below the symbolic link "
                    f"{'/'.join(key[:depth])!r}; refusing it"
                )
        if member.issym() and _resolve(list(key[:-1]), links[key], links) is None:
            raise ValueError(
                f"tar member {member.name!r} is a symlink to {member.linkname!r}, which "
                "leaves the archive's tree once its links are followed; refusing it"
            )
        if member.islnk():
            target = _lexical(_parts(member.linkname))
            if target is None or any(tuple(target[:d]) in links for d in range(1, len(target))):
                raise ValueError(
                    f"tar member {member.name!r} is a hard link to {member.linkname!r}, which "
                    "escapes the destination or passes through a symbolic link; refusing it"
                )


def _resolve(
    base: list[str], target: list[str], links: dict[tuple[str, ...], list[str]]
) -> list[str] | None:
    """Where ``target`` (relative to ``base``) leads, following ``links``; None: outside."""
    stack = list(base)
    pending = list(target)
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not stack:
                return None
            stack.pop()
            continue
        stack.append(part)
        link = links.get(tuple(stack))
        if link is not None:
            hops += 1
            if hops > _MAX_LINK_HOPS:
                return None
            stack.pop()
            pending = link + pending
    return stack


def _explain(member: tarfile.TarInfo, exc: tarfile.FilterError) -> str:
    name = member.name
    if isinstance(exc, tarfile.AbsoluteLinkError):
        kind = "symlink" if member.issym() else "hard link"
        return f"tar member {name!r} is a {kind} to absolute path {member.linkname!r}; refusing it"
    if isinstance(exc, tarfile.LinkOutsideDestinationError):
        kind = "symlink" if member.issym() else "hard link"
        return (
            f"tar member {name!r} is a {kind} to {member.linkname!r}, which escapes the "
            "destination; refusing it"
        )
    if isinstance(exc, tarfile.OutsideDestinationError):
        return f"tar member {name!r} escapes the destination ('..'); refusing it"
    if isinstance(exc, tarfile.SpecialFileError):
        return f"tar member {name!r} is a device or FIFO; refusing to extract it"
    if isinstance(exc, tarfile.AbsolutePathError):
        return f"tar member {name!r} has an absolute path; refusing to extract it"
    return f"tar member {name!r} is unsafe ({exc}); refusing it"


def checked_members(
    tf: tarfile.TarFile, *, max_members: int | None = None
) -> list[tarfile.TarInfo]:
    """Every member of ``tf``, read one at a time and checked; refused at ``max_members``.

    Raises:
        ValueError: Too many members, or an unsafe one.
        tarfile.TarError: The archive is damaged.
    """
    cap = MAX_ARCHIVE_MEMBERS if max_members is None else max_members
    members: list[tarfile.TarInfo] = []
    for member in tf:
        if len(members) >= cap:
            raise ValueError(
                f"the archive has more than {cap:,} members; refusing it "
                "(archive fewer files, e.g. a tarball of the directory)"
            )
        check_member(member)
        members.append(member)
    check_links(members)
    return members


def extract_tar_file(archive: str, dest: str, *, workdir: str | None = None) -> list[ExtractedFile]:
    """Check, then extract the tar file ``archive`` into directory ``dest`` (host side).

    Extracts into a fresh sibling, then renames it to ``dest`` or merges entry by entry (a
    file never replaces a directory). The sibling is always removed.

    Returns:
        ``(path relative to dest, size)`` of every regular file, in archive order.

    Raises:
        ValueError: A member is unsafe, or not a tar archive (nothing written).
    """
    dest = os.path.abspath(dest)
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    files: list[ExtractedFile] = []
    readable = True
    try:
        with tarfile.open(archive, mode="r:*") as tf:
            for member in checked_members(tf):
                if member.isfile():
                    files.append((posixpath.normpath(member.name), member.size))
    except tarfile.TarError as exc:
        if _has_data(archive):
            raise ValueError(f"not a valid tar archive: {exc}") from exc
        readable = False  # an empty or all-zero archive: nothing to extract
    staging = workdir or tempfile.mkdtemp(prefix=".hermes-extract-", dir=parent)
    try:
        tree = os.path.join(staging, "tree")
        os.mkdir(tree, 0o755)
        if readable:
            with tarfile.open(archive, mode="r:*") as tf:
                tf.extractall(tree, filter="data")
        if not os.path.lexists(dest):
            os.rename(tree, dest)
        else:
            if not os.path.isdir(dest) or os.path.islink(dest):
                raise OSError(f"cannot extract into {dest!r}: it exists and is not a directory")
            _merge(tree, dest)
    except tarfile.FilterError as exc:
        info: tarfile.TarInfo | None = getattr(exc, "tarinfo", None)
        raise ValueError(
            _explain(info, exc) if info is not None else f"unsafe archive: {exc}"
        ) from exc
    except tarfile.TarError as exc:
        raise ValueError(f"not a valid tar archive: {exc}") from exc
    finally:
        if workdir is None:
            shutil.rmtree(staging, ignore_errors=True)
        else:
            shutil.rmtree(os.path.join(staging, "tree"), ignore_errors=True)
    return files


def _has_data(path: str) -> bool:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            if chunk.strip(b"\0"):
                return True
    return False


def _merge(src: str, dest: str) -> None:
    for name in sorted(os.listdir(src)):
        s, d = os.path.join(src, name), os.path.join(dest, name)
        s_dir = os.path.isdir(s) and not os.path.islink(s)
        d_dir = os.path.isdir(d) and not os.path.islink(d)
        if s_dir and d_dir:
            _merge(s, d)
        elif d_dir:
            raise OSError(f"cannot replace directory {d!r} with a file from the archive")
        else:
            os.replace(s, d)  # replaces a file or a symlink itself, never what it points to


def pack_files(files: Mapping[str, bytes], *, mode: int = 0o644) -> bytes:
    """A tar archive of regular files, ``name -> contents`` (names used verbatim)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def single_file_tar(name: str, data: bytes, *, mode: int = 0o644) -> bytes:
    """A tar archive holding one regular file ``name`` with ``data``."""
    return pack_files({name: data}, mode=mode)


def directory_tar(source: Path, *, prefix: str = "") -> bytes:
    """The contents of the host folder ``source`` as an uncompressed tar.

    Members are named ``prefix + relative path``; links stay links; owners become root.
    Read synchronously: for small folders (a build context, a task's tests).
    """

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(source.rglob("*")):
            name = prefix + path.relative_to(source).as_posix()
            tar.add(path, arcname=name, recursive=False, filter=clean)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# The extractor process: ``python -I archive.py extract DEST MAX_BYTES`` (tar on stdin).


def _spool(source: BinaryIO, path: str, max_bytes: int) -> int:
    total = 0
    with open(path, "wb") as out:
        while chunk := source.read(_CHUNK):
            total += len(chunk)
            if total > max_bytes:
                raise OverflowError(total)
            out.write(chunk)
    return total


def main(argv: list[str] | None = None) -> int:
    """Extractor entry point: ``extract DEST MAX_BYTES WORKDIR`` with the tar on stdin.

    ``WORKDIR`` (new, next to DEST) holds the spooled archive and the extraction and is
    removed at the end. Prints ``[relative path, size]`` per file, then ``"ok"``. Exits 0,
    :data:`EXIT_REFUSED`, :data:`EXIT_TOO_LARGE`, or 1; the reason is on stderr.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] != "extract":
        print("usage: archive.py extract DEST MAX_BYTES WORKDIR < archive.tar", file=sys.stderr)
        return 1
    dest, max_bytes, workdir = os.path.abspath(args[1]), int(args[2]), args[3]
    try:
        os.makedirs(os.path.dirname(workdir), exist_ok=True)
        os.mkdir(workdir, 0o700)
    except OSError as exc:
        print(f"cannot create {workdir!r}: {exc}", file=sys.stderr)
        return 1
    try:
        spool = os.path.join(workdir, "archive.tar")
        try:
            _spool(sys.stdin.buffer, spool, max_bytes)
        except OverflowError:
            print(f"more than {max_bytes} bytes of archive", file=sys.stderr)
            return EXIT_TOO_LARGE
        try:
            files = extract_tar_file(spool, dest, workdir=workdir)
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return EXIT_REFUSED
        except OSError as exc:
            print(str(exc), file=sys.stderr)
            return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = sys.stdout
    for path, size in files:
        out.write(json.dumps([path, size]) + "\n")
    out.write('"ok"\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
