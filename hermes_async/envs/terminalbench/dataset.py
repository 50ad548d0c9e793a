"""Load a Harbor dataset (folders or Hermes rows), select tasks by name, resolve names locally.

:func:`load_dataset` takes a task folder, a folder of them, or a ``.jsonl`` / ``.parquet``
file of rows; a bad task lands in :attr:`LoadReport.invalid` and the rest load.
:func:`resolve_dataset` maps ``terminal-bench@2.0`` to a local folder through a registry
file, so Harbor's dataset names work offline. :func:`select` applies the name filters.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hermes_async._json import decode_problem
from hermes_async.envs.terminalbench.files import read_head
from hermes_async.envs.terminalbench.rows import (
    default_cache_dir,
    materialise_row,
    parse_row,
    read_rows,
)
from hermes_async.envs.terminalbench.task import (
    LOCAL_IMAGES,
    HarborTask,
    TaskError,
    TaskLimits,
    load_task,
)
from hermes_async.errors import ConfigError

__all__ = (
    "LoadReport",
    "Selection",
    "default_registry",
    "load_dataset",
    "parse_names",
    "resolve_dataset",
    "select",
)


#: Largest dataset registry read.
_MAX_REGISTRY_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What :func:`load_dataset` found: valid ``tasks`` in dataset order, and ``invalid`` ``(name, reason)`` pairs."""

    tasks: tuple[HarborTask, ...]
    invalid: tuple[tuple[str, str], ...]
    source: Path

    @property
    def by_name(self) -> Mapping[str, HarborTask]:
        """The tasks keyed by name."""
        return {task.name: task for task in self.tasks}

    @property
    def offline(self) -> tuple[HarborTask, ...]:
        """The tasks that need no network at build or verify time."""
        return tuple(task for task in self.tasks if not task.needs_network)

    def describe(self) -> str:
        """A short report: counts, then one line per invalid or network-needing task."""
        lines = [
            f"{len(self.tasks)} task(s) loaded from {self.source}, {len(self.invalid)} invalid"
        ]
        lines += [f"  invalid {name}: {reason}" for name, reason in self.invalid]
        for task in self.tasks:
            if task.needs_network:
                lines.append(f"  needs network {task.name}: {'; '.join(task.network_reasons)}")
        return "\n".join(lines)


def _looks_like_task(folder: Path) -> bool:
    return any((folder / part).exists() for part in ("task.toml", "instruction.md", "tests"))


def load_dataset(
    path: str | Path,
    *,
    cache_dir: str | Path | None = None,
    local_images: frozenset[str] = LOCAL_IMAGES,
    limits: TaskLimits | None = None,
) -> LoadReport:
    """Load every task under ``path``: a task folder, a folder of them, or a rows file.

    Raises:
        ConfigError: ``path`` does not exist or cannot be read as a dataset.
    """
    source = Path(path).expanduser()
    tasks: list[HarborTask] = []
    invalid: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(load: Callable[[], HarborTask], name: str) -> None:
        if name in seen:
            invalid.append((name, "duplicate task name (an earlier task has it)"))
            return
        try:
            task = load()
        except TaskError as exc:
            invalid.append((exc.task, exc.reason))
            seen.add(name)
            return
        seen.add(task.name)
        tasks.append(task)

    if source.is_file():
        rows_dir = (
            Path(cache_dir) if cache_dir is not None else default_cache_dir() / "terminalbench-rows"
        )
        for raw in read_rows(source):
            if raw.data is None:
                invalid.append((raw.label, raw.error or "unreadable row"))
                continue
            data = raw.data

            def from_row(data: Mapping[str, object] = data, label: str = raw.label) -> HarborTask:
                row = parse_row(data, label=label)
                try:
                    folder = materialise_row(row, rows_dir)
                except OSError as exc:
                    raise TaskError(
                        row.task_name, f"cannot write the task folder under {rows_dir}: {exc}"
                    ) from None
                return load_task(
                    folder, name=row.task_name, local_images=local_images, limits=limits
                )

            add(from_row, raw.label)
    elif (source / "task.toml").is_file():
        add(
            lambda: load_task(source, local_images=local_images, limits=limits),
            source.resolve().name,
        )
    elif source.is_dir():
        for folder in sorted(source.iterdir()):
            if folder.is_symlink() or not folder.is_dir() or folder.name.startswith((".", "_")):
                continue
            if not _looks_like_task(folder):
                continue

            def from_folder(folder: Path = folder) -> HarborTask:
                return load_task(folder, local_images=local_images, limits=limits)

            add(from_folder, folder.name)
    else:
        raise ConfigError(
            f"dataset {str(source)!r} does not exist; give a task folder, a directory of task "
            "folders, or a .jsonl / .parquet file of Hermes rows"
        )
    return LoadReport(tuple(tasks), tuple(invalid), source)


def parse_names(names: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``; None or ``""`` -> ``()`` (order kept, no repeats)."""
    if names is None:
        return ()
    items = names.split(",") if isinstance(names, str) else list(names)
    return tuple(dict.fromkeys(item.strip() for item in items if item.strip()))


@dataclass(frozen=True, slots=True)
class Selection:
    """What :func:`select` chose.

    Attributes:
        unknown: Names in ``task_filter`` or ``skip_tasks`` that match no task.
    """

    tasks: tuple[HarborTask, ...]
    unknown: tuple[str, ...]


def select(
    tasks: Sequence[HarborTask],
    task_filter: str | Iterable[str] | None = None,
    skip_tasks: str | Iterable[str] | None = None,
) -> Selection:
    """Keep exactly the tasks named in ``task_filter`` (all when empty), minus ``skip_tasks``.

    Names match exactly, no globs, so a selection is reproducible from its command line.
    """
    wanted = parse_names(task_filter)
    skipped = set(parse_names(skip_tasks))
    known = {task.name for task in tasks}
    unknown = tuple(name for name in (*wanted, *parse_names(skip_tasks)) if name not in known)
    chosen = tuple(
        task for task in tasks if (not wanted or task.name in wanted) and task.name not in skipped
    )
    return Selection(chosen, tuple(dict.fromkeys(unknown)))


def default_registry() -> Path:
    """``$HERMES_ASYNC_DATASETS`` or ``~/.config/hermes-async/datasets.toml``."""
    explicit = os.environ.get("HERMES_ASYNC_DATASETS")
    if explicit:
        return Path(explicit)
    config = os.environ.get("XDG_CONFIG_HOME")
    return (Path(config) if config else Path.home() / ".config") / "hermes-async" / "datasets.toml"


def resolve_dataset(spec: str | Path, *, registry: str | Path | None = None) -> Path:
    """The local path of a dataset: ``spec`` itself when it exists, else its registry entry.

    The registry is a TOML file of ``[datasets."name@version"]`` tables with ``path``, or
    ``git`` + ``commit`` (a local checkout that must be at that commit) and ``subdir``. A bare
    ``name`` matches when exactly one version is registered.

    Raises:
        ConfigError: No such path or entry, an unreadable registry, or a checkout at
            another commit.
    """
    path = Path(spec).expanduser()
    if path.exists():
        return path
    file = Path(registry) if registry is not None else default_registry()
    name = str(spec)
    if not file.is_file():
        raise ConfigError(
            f"dataset {name!r} is neither a path nor in a registry ({file} does not exist); "
            'give a folder, or register it there: [datasets."NAME@VERSION"] path = "..."'
        )
    try:
        data = read_head(file, _MAX_REGISTRY_BYTES + 1)
        if len(data) > _MAX_REGISTRY_BYTES:
            raise ConfigError(f"dataset registry {file} is larger than 1 MiB")
        entries = tomllib.loads(data.decode("utf-8")).get("datasets", {})
    except (OSError, ValueError, RecursionError) as exc:
        # ValueError: not UTF-8, not TOML, a 5000-digit integer; RecursionError: deep nesting.
        reason = decode_problem(exc)
        raise ConfigError(f"cannot read the dataset registry {file}: {reason}") from None
    if not isinstance(entries, dict):
        raise ConfigError(f"dataset registry {file}: [datasets] must be a table")
    key = name if name in entries else None
    if key is None:
        matches = [k for k in entries if k.split("@", 1)[0] == name]
        key = matches[0] if len(matches) == 1 else None
    if key is None:
        raise ConfigError(
            f"dataset {name!r} is not in the registry {file}; registered: "
            f"{', '.join(sorted(entries)) or 'none'}"
        )
    return _entry_path(key, entries[key], file)


def _entry_path(key: str, entry: object, file: Path) -> Path:
    if not isinstance(entry, dict):
        raise ConfigError(f"dataset registry {file}: entry {key!r} must be a table")
    for field in ("path", "git", "commit", "subdir"):
        value = entry.get(field)
        if value is not None and (not isinstance(value, str) or "\0" in value):
            raise ConfigError(
                f"dataset registry {file}: entry {key!r}: {field} must be a string without NUL "
                f"bytes, got {value!r}"
            )
    where = entry.get("path") or entry.get("git")
    if not isinstance(where, str):
        raise ConfigError(f"dataset registry {file}: entry {key!r} needs path = or git =")
    root = (file.parent / Path(where).expanduser()).resolve()
    commit = entry.get("commit")
    if "git" in entry and isinstance(commit, str):
        try:
            head = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            raise ConfigError(f"dataset {key!r}: {root} is not a git checkout ({exc})") from None
        if not head.startswith(commit) and not commit.startswith(head):
            raise ConfigError(
                f"dataset {key!r}: {root} is at commit {head[:12]}, the registry pins "
                f"{commit[:12]}; check out that commit (git -C {root} checkout {commit})"
            )
    subdir = entry.get("subdir")
    folder = root / subdir if isinstance(subdir, str) else root
    if not folder.exists():
        raise ConfigError(f"dataset {key!r}: {folder} does not exist")
    return folder
