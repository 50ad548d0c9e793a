"""Tar checks through the stdlib data filter (with our messages), and the one way to build tars."""

from __future__ import annotations

import io
import tarfile

import pytest

from hermes_async.tools.sandbox import base
from hermes_async.tools.sandbox.archive import check_tar_members, pack_files, single_file_tar


def _tar(*members: tarfile.TarInfo) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for m in members:
            tf.addfile(m, io.BytesIO(b"x" * m.size) if m.isfile() else None)
    return buf.getvalue()


def _member(
    name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", size: int = 0
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = size
    return info


def test_safe_archives_pass_and_members_come_back_unchanged() -> None:
    data = _tar(
        _member("./", tarfile.DIRTYPE),
        _member("./a/b.txt", size=3),
        _member("ok/../inside.txt", size=1),  # stays inside: the data filter allows it
        _member("link", tarfile.SYMTYPE, "a/b.txt"),
        _member("hard", tarfile.LNKTYPE, "a/b.txt"),
    )
    members = check_tar_members(data)
    assert [m.name for m in members] == [".", "./a/b.txt", "ok/../inside.txt", "link", "hard"]
    assert check_tar_members(b"") == [] and check_tar_members(b"\0" * 1024) == []


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_member("/etc/x"), r"'/etc/x' has an absolute path; refusing"),
        (_member("../x"), r"'\.\./x' escapes the destination \('\.\.'\); refusing"),
        (_member("a/../../x"), r"escapes the destination"),
        (_member("l", tarfile.SYMTYPE, "/etc/passwd"), r"'l' is a symlink to absolute path"),
        (_member("l", tarfile.SYMTYPE, "../../o"), r"symlink to '\.\./\.\./o', which escapes"),
        (_member("h", tarfile.LNKTYPE, "/etc/x"), r"'h' is a hard link to absolute path"),
        (_member("h", tarfile.LNKTYPE, "../x"), r"hard link to '\.\./x', which escapes"),
        (_member("dev", tarfile.CHRTYPE), r"'dev' is a device or FIFO"),
        (_member("blk", tarfile.BLKTYPE), r"device or FIFO"),
        (_member("fifo", tarfile.FIFOTYPE), r"device or FIFO"),
    ],
)
def test_unsafe_members_are_refused_with_a_message_naming_them(
    member: tarfile.TarInfo, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        check_tar_members(_tar(member))
    if not member.name.startswith("/"):
        assert isinstance(info.value.__cause__, tarfile.FilterError)  # the stdlib's verdict


def test_not_a_tar_archive() -> None:
    with pytest.raises(ValueError, match=r"not a valid tar archive \(1000 bytes\)"):
        check_tar_members(b"definitely not a tar file" * 40)


def test_builders() -> None:
    data = pack_files({"a": b"1", "d/b": b"22", "../hostile": b""}, mode=0o600)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert [(m.name, m.size, m.mode) for m in tf.getmembers()] == [
            ("a", 1, 0o600),
            ("d/b", 2, 0o600),
            ("../hostile", 0, 0o600),  # names verbatim, so tests can build hostile archives
        ]
    with tarfile.open(fileobj=io.BytesIO(single_file_tar("f.bin", b"\0\1"))) as tf:
        (m,) = tf.getmembers()
        assert (m.name, m.mode, (tf.extractfile(m) or io.BytesIO()).read()) == (
            "f.bin",
            0o644,
            b"\0\1",
        )


def test_check_tar_members_stays_importable_from_base() -> None:
    assert base.check_tar_members is check_tar_members  # tool_context imports it from there
