"""Dataset rows for the benchmark environments: a local file, the HF hub, or a built-in sample.

``--env.dataset_path`` wins, then ``dataset_name`` from the hub, then the built-in sample, which
the run announces (``require_dataset`` makes it an error). Loads block, so they run in a worker
thread behind :func:`dataset_loads`, under a deadline and :data:`MAX_DATASET_FILE_BYTES`.
Formats and order: docs/environments.md, "Data, offline".
"""

from __future__ import annotations

import csv
import functools
import importlib
import io
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.lowlevel import RunVar
from pydantic import BaseModel, Field

from hermes_async._json import decode_problem
from hermes_async.errors import ConfigError

__all__ = (
    "MAX_DATASET_FILE_BYTES",
    "DatasetOptions",
    "LoadedRows",
    "dataset_loads",
    "load_rows",
    "read_rows_file",
)

logger = logging.getLogger(__name__)

# A limiter belongs to one event loop, so each run (asyncio or trio) gets its own.
_LOADS: RunVar[anyio.CapacityLimiter] = RunVar("hermes_async_dataset_loads")
#: Largest dataset file read.
MAX_DATASET_FILE_BYTES = 2 * 1024 * 1024 * 1024

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class LoadedRows:
    """Rows and where they came from (``source``: ``file data.jsonl``, ``hub ...``)."""

    rows: list[Row]
    source: str


def read_rows_file(path: Path) -> list[Row]:
    """Rows of a local file or ``save_to_disk`` folder (blocking)."""
    if path.is_dir():
        try:
            datasets = importlib.import_module("datasets")
        except ImportError as exc:
            raise ConfigError(
                f"dataset_path {str(path)!r} is a folder (datasets.save_to_disk); reading it "
                "needs the 'datasets' package: pip install datasets"
            ) from exc
        return [dict(row) for row in datasets.load_from_disk(str(path))]
    if not path.is_file():
        raise ConfigError(f"dataset_path {str(path)!r} does not exist; give a file or folder")
    size = path.stat().st_size
    if size > MAX_DATASET_FILE_BYTES:
        raise ConfigError(
            f"dataset_path {str(path)!r} is {size} bytes, over the {MAX_DATASET_FILE_BYTES} "
            "byte limit; split it"
        )
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            parquet = importlib.import_module("pyarrow.parquet")
        except ImportError as exc:
            raise ConfigError(
                f"dataset_path {str(path)!r}: Parquet needs pyarrow: pip install pyarrow"
            ) from exc
        return [dict(row) for row in parquet.read_table(path).to_pylist()]
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"dataset_path {str(path)!r} is not UTF-8 text ({exc.reason})") from None
    if suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                rows.append(_row(_json(line, path, f"line {number}"), path, number))
        return rows
    if suffix == ".json":
        data = _json(text, path, "the file")
        items = data if isinstance(data, list) else [data]
        return [_row(item, path, number) for number, item in enumerate(items, 1)]
    if suffix in (".csv", ".tsv"):
        delimiter = "\t" if suffix == ".tsv" else ","
        try:
            return [dict(row) for row in csv.DictReader(io.StringIO(text), delimiter=delimiter)]
        except csv.Error as exc:
            raise ConfigError(f"dataset_path {str(path)!r} is not valid CSV: {exc}") from None
    raise ConfigError(
        f"dataset_path {str(path)!r}: unknown format {suffix or '(no suffix)'!r}; use .jsonl, "
        ".json, .csv, .tsv, .parquet or a datasets.save_to_disk folder"
    )


def _json(text: str, path: Path, where: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        reason = decode_problem(exc)
        raise ConfigError(f"{path}: {where} is not JSON ({reason[:200]})") from None


def _row(value: object, path: Path, number: int) -> Row:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: row {number} is {type(value).__name__}, not a JSON object")
    return value


def dataset_loads() -> anyio.CapacityLimiter:
    """The one thread this event loop loads datasets on (file parsing and the hub block)."""
    try:
        return _LOADS.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(1)
        _LOADS.set(limiter)
        return limiter


def _load_hub(name: str, config: str | None, split: str) -> list[Row]:
    datasets = importlib.import_module("datasets")
    return [dict(row) for row in datasets.load_dataset(name, config, split=split)]


async def _in_thread(call: Callable[[], list[Row]], timeout: float) -> list[Row]:
    # The thread cannot be cancelled: past the deadline it is abandoned and the run goes on.
    with anyio.fail_after(timeout):
        return await anyio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=dataset_loads())


async def load_rows(
    *,
    path: str | None,
    name: str | None,
    split: str,
    sample: Path,
    config: str | None = None,
    require: bool = False,
    timeout: float = 600.0,
) -> LoadedRows:
    """Load ``path``, else hub ``name`` (``config``, ``split``), else the sample file.

    Only an unreachable hub (or no ``datasets``) falls back to the sample, and not with
    ``require``; an unknown dataset, config or split is a ``ConfigError``.

    **Cancellation**: a file read or hub load already in its thread finishes there, unused.
    """
    if path:
        rows = await _in_thread(functools.partial(read_rows_file, Path(path)), timeout)
        return LoadedRows(rows, f"file {path}")
    if not name:
        rows = await _in_thread(functools.partial(read_rows_file, sample), timeout)
        return LoadedRows(rows, "built-in sample")
    where = f"hub {name} ({', '.join(p for p in (config, split) if p)})"
    try:
        rows = await _in_thread(functools.partial(_load_hub, name, config, split), timeout)
    except (ImportError, ConnectionError, TimeoutError) as exc:
        # datasets raises ConnectionError when offline or the host is unreachable; an unknown
        # dataset (FileNotFoundError) is the user's mistake and fails below.
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        if require:
            raise ConfigError(
                f"cannot load {where}: {reason}; give --env.dataset_path FILE (or set "
                "require_dataset false to run the built-in sample)"
            ) from exc
        logger.warning(
            "cannot load %s (%s): running the built-in sample of %s instead; give "
            "--env.dataset_path FILE for your own copy",
            where,
            reason,
            sample.name,
        )
        rows = await _in_thread(functools.partial(read_rows_file, sample), timeout)
        return LoadedRows(rows, f"built-in sample ({where} unavailable: {reason})")
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"cannot load {where}: {type(exc).__name__}: {exc}") from exc
    return LoadedRows(rows, where)


class DatasetOptions(BaseModel):
    """The data options every benchmark environment adds (``--env.<name>``)."""

    dataset_path: str | None = Field(
        default=None,
        description="A local dataset (.jsonl/.json/.csv/.tsv/.parquet or a save_to_disk "
        "folder); wins over dataset_name.",
    )
    require_dataset: bool = Field(
        default=False,
        description="Fail when dataset_name cannot be loaded (default: run the built-in sample "
        "and say so).",
    )
    dataset_load_timeout: float = Field(
        default=600.0, gt=0, description="Deadline of loading the dataset (s)."
    )
