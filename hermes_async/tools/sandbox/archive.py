"""Tar archives at the sandbox boundary: the one safety check and the one way to build them.

Every archive that crosses into or out of a sandbox (``put_archive``, ``upload_dir``,
``download_dir``, a staged single file) is checked by :func:`check_tar_members` before anything
is extracted anywhere. The checks are the standard library's ``data`` extraction filter
(:func:`tarfile.data_filter`, PEP 706) — the same rules ``extractall(filter="data")`` applies —
plus one rule of ours: an absolute member name is refused, where the stdlib filter would strip
the leading ``/`` and extract it anyway (an archive built for a sandbox never needs one, so it
is a mistake or an attack, and the model should hear about it). Only the error message is ours:
the stdlib's ``FilterError`` is translated into a ``ValueError`` naming the member and the rule.

What the filter judges is the archive alone: links are resolved against a destination that
does not exist, i.e. lexically. A chain of links that only escapes once earlier members exist on
disk (``x -> .``, ``esc -> x/..``, ``esc/file``) passes this check; extraction must therefore
also run with the ``data`` filter into a fresh directory (issue #15 moves every extraction
there).

Building: :func:`pack_files` makes an archive of regular files from a mapping (names used
verbatim, so tests can build hostile ones); :func:`single_file_tar` is its one-file case, used
by the container backends to stage a file and by ``ToolContext.upload_file``;
:func:`directory_tar` packs a host folder (a Docker build context, a task's ``tests/``).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ("check_tar_members", "directory_tar", "pack_files", "single_file_tar")

#: Where the filter pretends to extract: absolute and certainly absent, so that the filter's
#: ``realpath`` calls resolve nothing on the host and the verdict depends on the archive only.
_PHANTOM_DEST = "/nonexistent/hermes-async-archive-check"


def check_tar_members(tar_data: bytes) -> list[tarfile.TarInfo]:
    """Validate a tar archive before extracting it anywhere; return its members (unchanged).

    Refused (the stdlib ``data`` filter, plus absolute names): absolute member names, members
    that would land outside the destination (``..``), links (symbolic or hard) to absolute
    paths or to places outside the destination, device files and FIFOs. An empty archive is
    fine.

    Raises:
        ValueError: The data is not a tar archive, or a member is unsafe (the message names the
            member and what is wrong with it).
    """
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_data), mode="r:*") as tf:
            members = tf.getmembers()
    except tarfile.TarError as exc:
        if not tar_data.strip(b"\0"):
            return []
        raise ValueError(f"not a valid tar archive ({len(tar_data)} bytes): {exc}") from exc
    for member in members:
        if member.name.startswith("/"):
            raise ValueError(
                f"tar member {member.name!r} has an absolute path; refusing to extract it"
            )
        try:
            tarfile.data_filter(member, _PHANTOM_DEST)
        except tarfile.FilterError as exc:
            raise ValueError(_explain(member, exc)) from exc
    return members


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

    Members are named ``prefix + relative path`` (``prefix="./"`` names them as
    ``tar -C source -c .`` does); links are stored as links (never followed); owners are
    normalised to root. Read synchronously: meant for small folders (a build context, a
    task's tests).
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
