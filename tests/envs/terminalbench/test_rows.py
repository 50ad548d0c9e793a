"""Hermes dataset rows (JSONL / Parquet) and the safe extraction of their archives."""

from __future__ import annotations

import base64
import io
import json
import stat
import sys
import tarfile
from pathlib import Path

import pytest

from hermes_async.envs.terminalbench import (
    BUNDLED_ROWS,
    BUNDLED_TASKS,
    load_dataset,
    rows as rows_mod,
)
from hermes_async.envs.terminalbench.rows import (
    HermesRow,
    materialise_row,
    pack_dir,
    parse_row,
    read_rows,
    row_from_task_dir,
    safe_extract,
    write_parquet,
)
from hermes_async.envs.terminalbench.task import TaskError
from hermes_async.errors import ConfigError


def tar_bytes(*members: tuple[tarfile.TarInfo, bytes | None], gz: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def file_(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def row(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "task_name": "hello",
        "category": "demo",
        "instruction": "Say hello.\n",
        "docker_image": None,
        "environment_tar": b64(
            tar_bytes(file_("Dockerfile", b"FROM hermes-async-base:bookworm\n"))
        ),
        "tests_tar": b64(tar_bytes(file_("tests/test_outputs.py", b"def test(): pass\n"))),
        "test_sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    }
    data.update(overrides)
    return data


def write_jsonl(path: Path, *items: object) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items))
    return path


# --------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("member", "match"),
    [
        (file_("/etc/cron.d/evil"), r"member '/etc/cron.d/evil' has an absolute path"),
        (file_("../evil"), r"escapes the destination"),
        (file_("a/../../evil"), r"escapes the destination"),
        (special("link", tarfile.SYMTYPE, "/etc/passwd"), r"'link' is a symlink to absolute"),
        (special("link", tarfile.SYMTYPE, "../outside"), r"'\.\./outside', which escapes"),
        (special("sub/link", tarfile.SYMTYPE, "x/../../../etc"), r"which escapes"),
        (special("hard", tarfile.LNKTYPE, "../x"), r"'hard' is a hard link to '\.\./x'"),
        (special("hard", tarfile.LNKTYPE, "/etc/shadow"), r"hard link to absolute path"),
        (special("dev", tarfile.CHRTYPE), r"'dev' is a device or FIFO"),
        (special("blk", tarfile.BLKTYPE), r"device or FIFO"),
        (special("fifo", tarfile.FIFOTYPE), r"device or FIFO"),
        (file_("run", mode=0o4755), r"'run' is setuid/setgid"),
    ],
)
def test_crafted_members_are_refused(
    tmp_path: Path, member: tuple[tarfile.TarInfo, bytes | None], match: str
) -> None:
    dest = tmp_path / "dest"
    with pytest.raises(TaskError, match=match):
        safe_extract(tar_bytes(file_("ok.txt"), member), dest, task="t", what="tests_tar")
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "outside").exists()


def test_group_write_bits_are_cleared(tmp_path: Path) -> None:
    data = tar_bytes(file_("run.sh", b"#!/bin/sh\n", mode=0o777), file_("plain", mode=0o664))
    safe_extract(data, tmp_path, task="t", what="tests_tar")
    mode = stat.S_IMODE((tmp_path / "run.sh").stat().st_mode)
    assert mode & 0o022 == 0
    assert mode & 0o100  # the owner's exec bit stays: test scripts must still run
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o644


def test_relative_links_inside_are_kept(tmp_path: Path) -> None:
    data = tar_bytes(
        file_("sub/real.txt", b"content"),
        special("alias.txt", tarfile.SYMTYPE, "sub/real.txt"),
        special("hard.txt", tarfile.LNKTYPE, "sub/real.txt"),
    )
    safe_extract(data, tmp_path, task="t", what="environment_tar")
    assert (tmp_path / "alias.txt").is_symlink()
    assert (tmp_path / "alias.txt").read_text() == "content"
    assert (tmp_path / "hard.txt").read_text() == "content"


@pytest.mark.parametrize(
    "names",
    [("tests/test.sh", "tests/util/x.py"), ("./test.sh", "./util/x.py"), ("test.sh", "util/x.py")],
)
def test_root_folder_is_stripped_only_when_everything_is_under_it(
    tmp_path: Path, names: tuple[str, str]
) -> None:
    safe_extract(
        tar_bytes(*(file_(n) for n in names)),
        tmp_path,
        task="t",
        what="tests_tar",
        strip_root="tests",
    )
    assert sorted(
        p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()
    ) == ["test.sh", "util/x.py"]


def test_root_folder_kept_when_not_everything_is_under_it(tmp_path: Path) -> None:
    safe_extract(
        tar_bytes(file_("tests/a"), file_("b")),
        tmp_path,
        task="t",
        what="tests_tar",
        strip_root="tests",
    )
    assert (tmp_path / "tests" / "a").is_file() and (tmp_path / "b").is_file()


def test_hardlink_under_stripped_root(tmp_path: Path) -> None:
    data = tar_bytes(file_("tests/a", b"A"), special("tests/b", tarfile.LNKTYPE, "tests/a"))
    safe_extract(data, tmp_path, task="t", what="tests_tar", strip_root="tests")
    assert (tmp_path / "b").read_text() == "A"


def test_archive_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows_mod, "MAX_ARCHIVE_MEMBERS", 2)
    with pytest.raises(TaskError, match=r"has more than 2 members"):
        safe_extract(tar_bytes(file_("a"), file_("b"), file_("c")), tmp_path, task="t", what="x")
    monkeypatch.setattr(rows_mod, "MAX_ARCHIVE_MEMBERS", 100)
    monkeypatch.setattr(rows_mod, "MAX_ARCHIVE_BYTES", 10)
    with pytest.raises(TaskError, match=r"unpacks to 11 bytes \(at most 10\)"):
        safe_extract(tar_bytes(file_("a", b"x" * 11)), tmp_path, task="t", what="x")


def test_not_a_tar(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"environment_tar is not a tar archive"):
        safe_extract(b"definitely not a tar", tmp_path, task="t", what="environment_tar")


def test_plain_tar_accepted(tmp_path: Path) -> None:
    safe_extract(tar_bytes(file_("a", b"1"), gz=False), tmp_path, task="t", what="x")
    assert (tmp_path / "a").read_text() == "1"


# --------------------------------------------------------------------------- rows


def test_parse_row_checks_fields() -> None:
    assert parse_row(row(), label="row 1") == HermesRow(
        task_name="hello",
        category="demo",
        instruction="Say hello.\n",
        environment_tar=row()["environment_tar"],  # type: ignore[arg-type]
        tests_tar=row()["tests_tar"],  # type: ignore[arg-type]
        test_sh=row()["test_sh"],  # type: ignore[arg-type]
    )
    for bad, match in [
        ({"task_name": "../up"}, r"task_name must be a folder name"),
        ({"task_name": "a/b"}, r"task_name must be a folder name"),
        ({"task_name": None}, r"task_name must be a folder name"),
        ({"instruction": " "}, r"row has no instruction"),
        ({"environment_tar": None}, r"neither environment_tar nor docker_image"),
        ({"tests_tar": None, "test_sh": None}, r"neither tests_tar nor test_sh"),
        ({"category": 3}, r"row field 'category' must be a string, got int"),
    ]:
        with pytest.raises(TaskError, match=match):
            parse_row(row(**bad), label="row 1")


def test_materialise_row_builds_a_task_folder_once(tmp_path: Path) -> None:
    task_row = parse_row(row(), label="row 1")
    folder = materialise_row(task_row, tmp_path)
    assert folder.name == f"hello-{task_row.digest()}"
    assert (folder / "environment" / "Dockerfile").read_text().startswith("FROM hermes-async-base")
    assert (folder / "tests" / "test_outputs.py").is_file()  # the tests/ root was stripped
    assert (folder / "tests" / "test.sh").read_text() == row()["test_sh"]
    assert 'category = "demo"' in (folder / "task.toml").read_text()
    marker = folder / ".complete"
    stamp = marker.stat().st_mtime_ns
    assert materialise_row(task_row, tmp_path) == folder  # reused
    assert marker.stat().st_mtime_ns == stamp
    changed = parse_row(row(instruction="Say hi.\n"), label="row 1")
    assert materialise_row(changed, tmp_path) != folder


def test_a_bad_row_leaves_nothing_behind(tmp_path: Path) -> None:
    bad = parse_row(row(tests_tar=b64(tar_bytes(file_("ok"), file_("../evil")))), label="row 1")
    with pytest.raises(TaskError, match=r"tests_tar: tar member '../evil' escapes"):
        materialise_row(bad, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_invalid_base64(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"environment_tar is not valid base64"):
        materialise_row(parse_row(row(environment_tar="!!!not base64"), label="x"), tmp_path)


def test_jsonl_dataset_reports_bad_rows_by_name(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "rows.jsonl",
        row(),
        "{not json",
        "[1, 2]",
        row(task_name="no-verifier", tests_tar=None, test_sh=None),
        row(
            task_name="escape",
            environment_tar=b64(tar_bytes(special("l", tarfile.SYMTYPE, "/etc"))),
        ),
        row(),  # the same name again
        row(task_name="prebuilt", environment_tar=None, docker_image="alexgshaw/x:1"),
    )
    report = load_dataset(path, cache_dir=tmp_path / "cache")
    assert [t.name for t in report.tasks] == ["hello", "prebuilt"]
    assert report.invalid == (
        ("row 2", "line 2 is not JSON (Expecting property name enclosed in double quotes)"),
        ("row 3", "line 3 is not a JSON object"),
        ("no-verifier", "row has neither tests_tar nor test_sh (no verifier)"),
        (
            "escape",
            "environment_tar: tar member 'l' is a symlink to absolute path '/etc'; refusing it",
        ),
        ("hello", "duplicate task name (an earlier task has it)"),
    )
    hello = report.by_name["hello"]
    assert hello.category == "demo" and hello.instruction == "Say hello.\n"
    assert hello.environment.base_images == ("hermes-async-base:bookworm",)
    assert not hello.needs_network
    assert report.by_name["prebuilt"].network_reasons == (
        "image 'alexgshaw/x:1' must be pulled from a registry",
    )
    assert "invalid escape: environment_tar: tar member" in report.describe()


def test_jsonl_lines_json_cannot_hold_are_invalid_rows(tmp_path: Path) -> None:
    # A 5000-digit number (ValueError) or deep nesting (RecursionError) aborted the load.
    path = write_jsonl(
        tmp_path / "rows.jsonl", '{"task_name": ' + "9" * 5000 + "}", "[" * 100_000, row()
    )
    report = load_dataset(path, cache_dir=tmp_path / "cache")
    assert [t.name for t in report.tasks] == ["hello"]
    assert [name for name, _ in report.invalid] == ["row 1", "row 2"]
    assert report.invalid[0][1] == "line 1 is not JSON it can read (too deep or a huge number)"


def test_unknown_file_kind_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match=r"unknown kind '.csv'"):
        list(read_rows(tmp_path / "rows.csv"))
    with pytest.raises(ConfigError, match=r"does not exist"):
        list(read_rows(tmp_path / "nope.jsonl"))


def test_parquet_roundtrip(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    rows = [row(), row(task_name="second", instruction="Two.\n")]
    write_parquet(rows, tmp_path / "rows.parquet")  # type: ignore[arg-type]
    report = load_dataset(tmp_path / "rows.parquet", cache_dir=tmp_path / "cache")
    assert [t.name for t in report.tasks] == ["hello", "second"]
    assert report.invalid == ()
    assert report.by_name["second"].instruction == "Two.\n"


def test_parquet_without_pyarrow_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rows.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(
        ConfigError, match=r"needs pyarrow: pip install 'hermes-async\[terminalbench\]'"
    ):
        load_dataset(tmp_path / "rows.parquet", cache_dir=tmp_path)


def test_damaged_parquet(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    (tmp_path / "rows.parquet").write_bytes(b"PAR1 but not really")
    with pytest.raises(ConfigError, match=r"cannot read Parquet file"):
        load_dataset(tmp_path / "rows.parquet", cache_dir=tmp_path)


def test_bundled_rows_are_up_to_date() -> None:
    """The committed JSONL is what make_rows.py writes from the bundled folders today."""
    lines = BUNDLED_ROWS.read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        committed = json.loads(line)
        source = committed["task_name"].removesuffix("-row")
        fresh = row_from_task_dir(BUNDLED_TASKS / source)
        fresh["task_name"] = committed["task_name"]
        assert committed == fresh, f"run scripts/terminalbench/make_rows.py ({source} changed)"


def test_pack_dir_is_reproducible(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("1")
    first = pack_dir(tmp_path)
    (tmp_path / "a").touch()
    assert pack_dir(tmp_path) == first
