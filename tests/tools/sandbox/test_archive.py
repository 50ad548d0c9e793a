"""Tar checks (the stdlib data filter plus our stricter rules), the host extractor, building."""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import tarfile

import pytest

from hermes_async.tools.sandbox import archive, base
from hermes_async.tools.sandbox.archive import (
    MAX_ARCHIVE_MEMBERS,
    check_tar_members,
    extract_tar_file,
    pack_files,
    single_file_tar,
)


def _tar(*members: tarfile.TarInfo) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for m in members:
            tf.addfile(m, io.BytesIO(b"x" * m.size) if m.isfile() else None)
    return buf.getvalue()


def _member(
    name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", size: int = 0, mode: int = 0o644
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = size
    info.mode = mode
    return info


def test_safe_archives_pass_and_members_come_back_unchanged() -> None:
    data = _tar(
        _member("./", tarfile.DIRTYPE),
        _member("./a/b.txt", size=3),
        _member("ok/../inside.txt", size=1),  # stays inside: the data filter allows it
        _member("link", tarfile.SYMTYPE, "a/b.txt"),
        _member("dot", tarfile.SYMTYPE, "."),
        _member("hard", tarfile.LNKTYPE, "a/b.txt"),
        _member("sticky-dir", tarfile.DIRTYPE, mode=0o1777),
    )
    members = check_tar_members(data)
    assert [m.name for m in members] == [
        ".",
        "./a/b.txt",
        "ok/../inside.txt",
        "link",
        "dot",
        "hard",
        "sticky-dir",
    ]
    assert check_tar_members(b"") == [] and check_tar_members(b"\0" * 1024) == []


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_member("/etc/x"), r"'/etc/x' has an absolute path; refusing"),
        (_member("../x"), r"'\.\./x' escapes the destination \('\.\.'\); refusing"),
        (_member("a/../../x"), r"escapes the destination"),
        (_member("l", tarfile.SYMTYPE, "/etc/passwd"), r"'l' is a symlink to absolute path"),
        (_member("l", tarfile.SYMTYPE, "../../o"), r"symlink to '\.\./\.\./o', which escapes"),
        (_member("a/l", tarfile.SYMTYPE, "../../a"), r"'a/l' is a symlink to '\.\./\.\./a'"),
        (_member("h", tarfile.LNKTYPE, "/etc/x"), r"'h' is a hard link to absolute path"),
        (_member("h", tarfile.LNKTYPE, "../x"), r"hard link to '\.\./x', which escapes"),
        (_member("suid", mode=0o4755), r"'suid' is setuid/setgid \(mode 4755\)"),
        (_member("sgid", mode=0o2755), r"setuid/setgid"),
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
    if member.type in (
        tarfile.CHRTYPE,
        tarfile.BLKTYPE,
        tarfile.FIFOTYPE,
    ) or member.name.startswith(".."):
        assert isinstance(info.value.__cause__, tarfile.FilterError)  # the stdlib's verdict


def test_in_tree_links_with_dotdot_are_kept() -> None:
    # A checkout's relative links that stay inside the tree (issue #38: dd/x -> .. was refused).
    data = _tar(
        _member("dd", tarfile.DIRTYPE),
        _member("dd/x", tarfile.SYMTYPE, ".."),
        _member("a/l", tarfile.SYMTYPE, "../dd/x/a"),
        _member("esc", tarfile.SYMTYPE, "x/.."),  # x is no link here: x/.. is the root
    )
    assert [m.name for m in check_tar_members(data)] == ["dd", "dd/x", "a/l", "esc"]


@pytest.mark.parametrize("order", [0, 1, 2])
def test_a_chain_through_links_is_refused_in_any_order(order: int) -> None:
    # Lexically inside, really outside: esc -> x/.. with x -> . is the destination's parent.
    members = [
        _member("x", tarfile.SYMTYPE, "."),
        _member("esc", tarfile.SYMTYPE, "x/.."),
        _member("esc/file", size=1),
    ]
    members = members[order:] + members[:order]
    with pytest.raises(ValueError, match=r"below the symbolic link 'esc'|leaves the archive"):
        check_tar_members(_tar(*members))
    chained = [_member("x", tarfile.SYMTYPE, "."), _member("esc", tarfile.SYMTYPE, "x/..")]
    with pytest.raises(ValueError, match=r"'esc' is a symlink to 'x/\.\.', which leaves"):
        check_tar_members(_tar(*chained[order % 2 :], *chained[: order % 2]))


def test_a_path_that_is_a_link_and_a_file_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'d' is a symbolic link and another member"):
        check_tar_members(_tar(_member("d", tarfile.SYMTYPE, "."), _member("d", size=1)))
    with pytest.raises(ValueError, match=r"passes through a symbolic link"):
        check_tar_members(
            _tar(_member("l", tarfile.SYMTYPE, "sub"), _member("h", tarfile.LNKTYPE, "l/f"))
        )


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


# ------------------------------------------------------------------------------ the extractor


def _run_extractor(
    data: bytes, dest: pathlib.Path, max_bytes: int = 1 << 20
) -> subprocess.CompletedProcess[bytes]:
    workdir = dest.parent / ".hermes-download-test"
    return subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            archive.__file__,
            "extract",
            str(dest),
            str(max_bytes),
            str(workdir),
        ],
        input=data,
        capture_output=True,
        check=False,
        timeout=60,
    )


def _chain() -> bytes:
    return _tar(
        _member("x", tarfile.SYMTYPE, "."),
        _member("esc", tarfile.SYMTYPE, "x/.."),
        _member("esc/escaped.txt", size=5),
    )


@pytest.mark.parametrize(
    "data",
    [
        _chain(),
        _tar(_member("../up.txt", size=1)),
        _tar(_member("/abs.txt", size=1)),
        _tar(_member("l", tarfile.SYMTYPE, "/etc")),
        _tar(_member("suid", mode=0o4755, size=1)),
        _tar(_member("null", tarfile.CHRTYPE)),
        _tar(_member("ok.txt", size=2), _member("h", tarfile.LNKTYPE, "../../etc/passwd")),
    ],
    ids=["link-chain", "dotdot", "absolute", "absolute-link", "setuid", "device", "hardlink-out"],
)
def test_extractor_refuses_crafted_archives_and_writes_nothing(
    data: bytes, tmp_path: pathlib.Path
) -> None:
    area = tmp_path / "area"
    area.mkdir()
    result = _run_extractor(data, area / "dest")
    assert result.returncode == archive.EXIT_REFUSED, result
    assert b"refusing" in result.stderr
    assert list(area.iterdir()) == []  # no dest, no spool, no staging left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["area"]  # nothing outside either


def test_extractor_extracts_into_a_fresh_dir_and_merges(tmp_path: pathlib.Path) -> None:
    data = _tar(
        _member(".", tarfile.DIRTYPE, mode=0o755),
        _member("./a.txt", size=3),
        _member("./d", tarfile.DIRTYPE, mode=0o755),
        _member("./d/b.txt", size=4),
        _member("./d/link", tarfile.SYMTYPE, "b.txt"),
    )
    dest = tmp_path / "dest"
    result = _run_extractor(data, dest)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert [json.loads(x) for x in lines] == [["a.txt", 3], ["d/b.txt", 4], "ok"]
    assert (dest / "d" / "b.txt").read_bytes() == b"xxxx"
    assert os.readlink(dest / "d" / "link") == "b.txt"
    # Into an existing directory: merged; a host-side symlink in the way is replaced, never
    # followed.
    (dest / "a.txt").unlink()
    outside = tmp_path / "outside.txt"
    (dest / "a.txt").symlink_to(outside)
    (dest / "keep.txt").write_text("mine")
    result = _run_extractor(data, dest)
    assert result.returncode == 0, result.stderr
    assert not outside.exists()
    assert (dest / "a.txt").read_bytes() == b"xxx" and not (dest / "a.txt").is_symlink()
    assert (dest / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]


def test_extractor_stops_at_its_cap(tmp_path: pathlib.Path) -> None:
    data = _tar(_member("big.bin", size=100_000))
    result = _run_extractor(data, tmp_path / "dest", max_bytes=50_000)
    assert result.returncode == archive.EXIT_TOO_LARGE, result
    assert list(tmp_path.iterdir()) == []


def test_extractor_strips_mode_bits_and_ownership(tmp_path: pathlib.Path) -> None:
    member = _member("f", size=1, mode=0o777)
    member.uid = member.gid = 4242
    tar = tmp_path / "a.tar"
    tar.write_bytes(_tar(member))
    files = extract_tar_file(str(tar), str(tmp_path / "out"))
    assert files == [("f", 1)]
    st = (tmp_path / "out" / "f").stat()
    assert st.st_mode & 0o777 == 0o755  # group/other write dropped by the data filter
    assert st.st_uid == os.getuid()  # not the archive's owner


def test_empty_and_too_many_members(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    assert extract_tar_file(str(empty), str(tmp_path / "e")) == []
    assert (tmp_path / "e").is_dir()
    monkeypatch.setattr(archive, "MAX_ARCHIVE_MEMBERS", 2)
    many = tmp_path / "many.tar"
    many.write_bytes(pack_files({f"f{i}": b"" for i in range(3)}))
    with pytest.raises(ValueError, match="more than 2 members"):
        extract_tar_file(str(many), str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()
    assert MAX_ARCHIVE_MEMBERS == 200_000
