"""Load a Harbor dataset (folders or Hermes rows) and select tasks by name.

:func:`load_dataset` takes what a user points ``--env.dataset`` at:

* one task folder (it holds ``task.toml``);
* a directory of task folders (each subfolder with a ``task.toml``; hidden folders and
  folders that are plainly not tasks — no ``task.toml``, ``instruction.md`` or ``tests/`` —
  are passed over);
* a ``.jsonl`` or ``.parquet`` file of Hermes rows (:mod:`.rows`), materialised into task
  folders under a cache directory.

It never raises for a bad *task*: each one is reported in :attr:`LoadReport.invalid` with its
name and the reason, and the rest load. It raises :class:`~hermes_async.errors.ConfigError`
only when the *dataset* itself cannot be read (a missing path, an unknown file kind, Parquet
without pyarrow).

:func:`select` applies ``task_filter`` / ``skip_tasks`` (comma-separated names, as the
reference's ``--env.task_filter a,b`` / ``--env.skip_tasks c,d``) and reports names that
match no task, so a typo is visible instead of silently running nothing or everything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hermes_async.envs.terminalbench.rows import (
    default_cache_dir,
    materialise_row,
    parse_row,
    read_rows,
)
from hermes_async.envs.terminalbench.task import LOCAL_IMAGES, HarborTask, TaskError, load_task
from hermes_async.errors import ConfigError

__all__ = (
    "LoadReport",
    "Selection",
    "load_dataset",
    "parse_names",
    "select",
)


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What :func:`load_dataset` found.

    Attributes:
        tasks: The valid tasks, in dataset order (folders sorted by name, rows in file order).
        invalid: ``(name, reason)`` for every task that was skipped.
        source: The path that was loaded.
    """

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
) -> LoadReport:
    """Load every task under ``path`` (see the module docs for what ``path`` may be).

    Args:
        path: A task folder, a directory of task folders, or a ``.jsonl`` / ``.parquet`` file.
        cache_dir: Where rows are materialised (default: :func:`~.rows.default_cache_dir`
            ``/ "terminalbench-rows"``).
        local_images: Images that need no registry (for the network flags).

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
                return load_task(folder, name=row.task_name, local_images=local_images)

            add(from_row, raw.label)
    elif (source / "task.toml").is_file():
        add(lambda: load_task(source, local_images=local_images), source.resolve().name)
    elif source.is_dir():
        for folder in sorted(source.iterdir()):
            if not folder.is_dir() or folder.name.startswith((".", "_")):
                continue
            if not _looks_like_task(folder):
                continue

            def from_folder(folder: Path = folder) -> HarborTask:
                return load_task(folder, local_images=local_images)

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
        tasks: The selected tasks, in dataset order.
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

    Names match :attr:`HarborTask.name` exactly (no globs: a selection must be reproducible
    from the command line that made it).
    """
    wanted = parse_names(task_filter)
    skipped = set(parse_names(skip_tasks))
    known = {task.name for task in tasks}
    unknown = tuple(name for name in (*wanted, *parse_names(skip_tasks)) if name not in known)
    chosen = tuple(
        task for task in tasks if (not wanted or task.name in wanted) and task.name not in skipped
    )
    return Selection(chosen, tuple(dict.fromkeys(unknown)))
