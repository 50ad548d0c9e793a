"""The Hermes dataset row format (``NousResearch/terminal-bench-2``), read from local files.

Rows (JSONL or Parquet) are materialised once per content into ordinary task folders in a
cache, so everything downstream sees one format. A row whose archive breaks
:mod:`hermes_async.tools.sandbox.archive`'s rules is invalid; nothing of it is kept.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hermes_async.envs.terminalbench.files import TaskError
from hermes_async.errors import ConfigError
from hermes_async.tools.sandbox.archive import checked_members

__all__ = (
    "MAX_ARCHIVE_BYTES",
    "MAX_ARCHIVE_MEMBERS",
    "MAX_ROW_FILE_BYTES",
    "ROW_FIELDS",
    "HermesRow",
    "RawRow",
    "default_cache_dir",
    "materialise_row",
    "pack_dir",
    "parse_row",
    "read_rows",
    "row_from_task_dir",
    "safe_extract",
    "write_parquet",
)

#: The Hermes row fields (``solution_tar`` is this project's extension).
ROW_FIELDS = (
    "task_name",
    "category",
    "instruction",
    "docker_image",
    "environment_tar",
    "tests_tar",
    "test_sh",
    "solution_tar",
)
#: Largest uncompressed archive (sum of member sizes): a build context or a test suite.
MAX_ARCHIVE_BYTES = 256 * 1024 * 1024
#: Most members in one archive.
MAX_ARCHIVE_MEMBERS = 20_000
#: Largest JSONL / Parquet file read (TB2's 89 rows with their images' build contexts are a
#: few hundred MB at most).
MAX_ROW_FILE_BYTES = 2 * 1024 * 1024 * 1024

_TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def default_cache_dir() -> Path:
    """``$HERMES_ASYNC_CACHE`` or ``~/.cache/hermes-async`` (``$XDG_CACHE_HOME`` honoured)."""
    root = os.environ.get("HERMES_ASYNC_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hermes-async"


@dataclass(frozen=True, slots=True)
class RawRow:
    """A row as read from the file: ``label`` is its ``task_name`` or ``row <n>``; ``data`` is None
    when the line was not a JSON object.
    """

    label: str
    data: Mapping[str, object] | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class HermesRow:
    """A validated Hermes row; archives are still base64 text of a tar.gz.

    ``task_name`` must be a folder name (letters, digits, ``.``, ``_``, ``-``).
    """

    task_name: str
    category: str
    instruction: str
    docker_image: str | None = None
    environment_tar: str | None = None
    tests_tar: str | None = None
    test_sh: str | None = None
    solution_tar: str | None = None

    def digest(self) -> str:
        """A hash of every field: the cache key of the materialised folder."""
        h = hashlib.sha256()
        for name in ROW_FIELDS:
            value = getattr(self, name)
            h.update(name.encode())
            h.update(b"\0" if value is None else b"\1" + value.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        return h.hexdigest()[:16]


def _label(data: Mapping[str, object], index: int) -> str:
    name = data.get("task_name")
    return name if isinstance(name, str) and name else f"row {index}"


def read_rows(path: str | Path) -> Iterator[RawRow]:
    """The rows of a local ``.jsonl`` / ``.json`` (one object a line) or ``.parquet`` file.

    A line that is not a JSON object is a :class:`RawRow` with ``error`` set.

    Raises:
        ConfigError: The file is missing, too large, of an unknown kind, or Parquet without
            ``pyarrow`` (the message names the extra).
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"dataset file {str(file)!r} does not exist")
    size = file.stat().st_size
    if size > MAX_ROW_FILE_BYTES:
        raise ConfigError(
            f"dataset file {str(file)!r} is {size} bytes (at most {MAX_ROW_FILE_BYTES})"
        )
    suffix = file.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        yield from _jsonl_rows(file)
    elif suffix in (".parquet", ".pq"):
        yield from _parquet_rows(file)
    else:
        raise ConfigError(
            f"dataset file {str(file)!r}: unknown kind {suffix!r}; give a task folder, a "
            "directory of task folders, a .jsonl or a .parquet file"
        )


def _jsonl_rows(file: Path) -> Iterator[RawRow]:
    with file.open("r", encoding="utf-8", errors="replace") as f:
        for index, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                yield RawRow(f"row {index}", None, f"line {index} is not JSON ({exc.msg})")
                continue
            except (ValueError, RecursionError):  # a 5000-digit number; nesting too deep
                yield RawRow(
                    f"row {index}",
                    None,
                    f"line {index} is not JSON it can read (too deep or a huge number)",
                )
                continue
            if not isinstance(data, dict):
                yield RawRow(f"row {index}", None, f"line {index} is not a JSON object")
                continue
            yield RawRow(_label(data, index), data)


def _parquet_rows(file: Path) -> Iterator[RawRow]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f"reading {str(file)!r} needs pyarrow: pip install 'hermes-async[terminalbench]'"
        ) from None
    try:
        parquet = pq.ParquetFile(file)
        columns = [c for c in parquet.schema_arrow.names if c in ROW_FIELDS]
        index = 0
        for batch in parquet.iter_batches(batch_size=16, columns=columns):
            for data in batch.to_pylist():
                index += 1
                yield RawRow(_label(data, index), data)
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        raise ConfigError(f"cannot read Parquet file {str(file)!r}: {exc}") from None


def parse_row(raw: Mapping[str, object], *, label: str) -> HermesRow:
    """Validate a row's fields.

    Raises:
        TaskError: A missing or mistyped field, or a ``task_name`` that cannot be a folder.
    """
    values: dict[str, str | None] = {}
    for name in ROW_FIELDS:
        value = raw.get(name)
        if value is not None and not isinstance(value, str):
            raise TaskError(
                label, f"row field {name!r} must be a string, got {type(value).__name__}"
            )
        values[name] = value or None
    task_name = values["task_name"]
    if task_name is None or not _TASK_NAME.fullmatch(task_name) or ".." in task_name:
        raise TaskError(
            label,
            f"task_name must be a folder name (letters, digits, '.', '_', '-'), got {task_name!r}",
        )
    if not values["instruction"] or not values["instruction"].strip():
        raise TaskError(task_name, "row has no instruction")
    if values["environment_tar"] is None and values["docker_image"] is None:
        raise TaskError(task_name, "row has neither environment_tar nor docker_image")
    if values["tests_tar"] is None and values["test_sh"] is None:
        raise TaskError(task_name, "row has neither tests_tar nor test_sh (no verifier)")
    return HermesRow(
        task_name=task_name,
        category=values["category"] or "uncategorized",
        instruction=values["instruction"],
        docker_image=values["docker_image"],
        environment_tar=values["environment_tar"],
        tests_tar=values["tests_tar"],
        test_sh=values["test_sh"],
        solution_tar=values["solution_tar"],
    )


# --------------------------------------------------------------------------- safe extraction


def _decode(task: str, field: str, text: str) -> bytes:
    if len(text) > MAX_ARCHIVE_BYTES * 2:
        raise TaskError(task, f"{field} is {len(text)} characters of base64 (too large)")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise TaskError(task, f"{field} is not valid base64") from None


def _unpack(row: HermesRow, field: str, text: str | None, dest: Path) -> Path:
    """Create ``dest`` and extract the row's base64 tarball ``field`` into it, if any."""
    dest.mkdir()
    if text is not None:
        safe_extract(
            _decode(row.task_name, field, text),
            dest,
            task=row.task_name,
            what=field,
            strip_root=dest.name,
        )
    return dest


def safe_extract(
    data: bytes,
    dest: Path,
    *,
    task: str,
    what: str,
    strip_root: str | None = None,
) -> None:
    """Extract a tar (optionally gzipped) into ``dest`` under the archive rules.

    Members are read one at a time and refused at :data:`MAX_ARCHIVE_MEMBERS` or
    :data:`MAX_ARCHIVE_BYTES`; all are checked before anything is written. ``strip_root``
    (``"tests"``) is stripped when every member lies under it.

    Raises:
        TaskError: The archive is unreadable or breaks a rule (named in the message).
    """
    try:
        # Opened apart from the `with` so that only opening errors are "not a tar archive".
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise TaskError(task, f"{what} is not a tar archive ({exc})") from None
    with archive:
        try:
            members = checked_members(archive, max_members=MAX_ARCHIVE_MEMBERS)
        except ValueError as exc:
            raise TaskError(task, f"{what}: {exc}") from None
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise TaskError(task, f"{what} is a damaged tar archive ({exc})") from None
        total = sum(m.size for m in members if m.isfile())
        if total > MAX_ARCHIVE_BYTES:
            raise TaskError(task, f"{what} unpacks to {total} bytes (at most {MAX_ARCHIVE_BYTES})")
        names = [_normal_name(m.name) for m in members]
        prefix = ""
        if (
            strip_root
            and names
            and all(n == strip_root or n.startswith(strip_root + "/") for n in names if n)
        ):
            prefix = strip_root + "/"
        dest.mkdir(parents=True, exist_ok=True)
        for member, name in zip(members, names, strict=True):
            if not name or name == prefix.rstrip("/"):
                continue  # the archive's root folder itself
            member = member.replace(name=name[len(prefix) :], deep=False)
            if member.islnk():
                link = _normal_name(member.linkname)
                if prefix and link.startswith(prefix):
                    link = link[len(prefix) :]
                member = member.replace(linkname=link, deep=False)
            try:
                archive.extract(member, dest, filter="data")
            except tarfile.FilterError as exc:
                raise TaskError(task, f"{what}: member {member.name!r} refused ({exc})") from None
            except (tarfile.TarError, OSError) as exc:
                raise TaskError(task, f"{what}: cannot extract {member.name!r} ({exc})") from None


def _normal_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/") if name != "." else ""


# --------------------------------------------------------------------------- materialising


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _task_toml(row: HermesRow) -> str:
    lines = [
        'schema_version = "1.1"',
        "",
        "[metadata]",
        f"category = {_toml_string(row.category)}",
        'source = "hermes-row"',
        "",
        "[environment]",
    ]
    if row.docker_image is not None:
        lines.append(f"docker_image = {_toml_string(row.docker_image)}")
    return "\n".join(lines) + "\n"


def materialise_row(row: HermesRow, cache_dir: Path) -> Path:
    """The row as a task folder ``<cache_dir>/<task_name>-<digest>``, built once per content.

    Raises:
        TaskError: An archive is invalid; nothing is kept.
        OSError: The cache directory cannot be written.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / f"{row.task_name}-{row.digest()}"
    if (final / ".complete").is_file():
        return final
    work = Path(tempfile.mkdtemp(prefix=f".{row.task_name}-", dir=cache_dir))
    try:
        (work / "task.toml").write_text(_task_toml(row), encoding="utf-8")
        (work / "instruction.md").write_text(row.instruction, encoding="utf-8")
        _unpack(row, "environment_tar", row.environment_tar, work / "environment")
        tests = _unpack(row, "tests_tar", row.tests_tar, work / "tests")
        if row.test_sh is not None:
            test_sh = tests / "test.sh"
            if test_sh.is_symlink() or test_sh.is_dir():
                raise TaskError(row.task_name, "tests_tar has a tests/test.sh that is not a file")
            test_sh.write_text(row.test_sh, encoding="utf-8")
            test_sh.chmod(0o755)
        if row.solution_tar is not None:
            _unpack(row, "solution_tar", row.solution_tar, work / "solution")
        (work / ".complete").write_text(row.digest() + "\n", encoding="utf-8")
        try:
            work.rename(final)
        except OSError:
            # A concurrent loader won the race (the folder exists now): use theirs.
            if not (final / ".complete").is_file():
                raise
            shutil.rmtree(work, ignore_errors=True)
        return final
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


# --------------------------------------------------------------------------- the other way


def pack_dir(folder: Path) -> str:
    """A folder as base64 of a reproducible tar.gz; links stay links, other specials are skipped."""
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in sorted(folder.rglob("*")):
            if path.name == "__pycache__" or "__pycache__" in path.parts:
                continue
            info = tar.gettarinfo(str(path), arcname=path.relative_to(folder).as_posix())
            if not (info.isfile() or info.isdir() or info.issym()):
                continue
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def row_from_task_dir(folder: Path, *, category: str | None = None) -> dict[str, str | None]:
    """A Hermes row (with ``solution_tar``) from a task folder, for fixtures and export."""
    import tomllib

    data = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
    meta = data.get("metadata") or {}
    env = data.get("environment") or {}
    tests = folder / "tests"
    solution = folder / "solution"
    return {
        "task_name": folder.name,
        "category": category or meta.get("category") or "uncategorized",
        "instruction": (folder / "instruction.md").read_text(encoding="utf-8"),
        "docker_image": env.get("docker_image"),
        "environment_tar": pack_dir(folder / "environment")
        if (folder / "environment").is_dir()
        else None,
        "tests_tar": pack_dir(tests),
        "test_sh": (tests / "test.sh").read_text(encoding="utf-8"),
        "solution_tar": pack_dir(solution) if solution.is_dir() else None,
    }


def write_parquet(rows: list[dict[str, str | None]], path: Path) -> None:
    """Write rows as a Parquet file with the Hermes columns.

    Raises:
        ConfigError: pyarrow is not installed (the message names the extra).
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f"writing {str(path)!r} needs pyarrow: pip install 'hermes-async[terminalbench]'"
        ) from None
    columns = {name: [row.get(name) for row in rows] for name in ROW_FIELDS}
    pq.write_table(
        pa.table(columns, schema=pa.schema([(n, pa.string()) for n in ROW_FIELDS])), path
    )
