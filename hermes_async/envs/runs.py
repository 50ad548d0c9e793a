"""A run folder: what ``hermes-async eval`` and ``process`` write, read back for a report.

``samples.jsonl`` (one line per finished rollout) is the run's one record; ``metrics.json``,
``index.html`` and the summary derive from it, ``groups.jsonl`` holds process's training
groups and ``run.json`` how the run was made. A resumed run keeps every finished line byte for
byte. Reads are bounded (:data:`MAX_LINE_BYTES`, :data:`MAX_ROWS`).
See docs/decisions/009-run-folder-and-viewer.md.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes_async._json import finite_number
from hermes_async._redact import redact
from hermes_async.envs._eval import eval_metrics, summary_from_sample
from hermes_async.envs.results import RolloutSummary
from hermes_async.jsontypes import JSONObject

__all__ = (
    "GROUPS_FILE",
    "MAX_LINE_BYTES",
    "MAX_ROWS",
    "METRICS_FILE",
    "RUNS_ROOT",
    "RUN_FILE",
    "SAMPLES_FILE",
    "VIEWER_FILE",
    "RunInfo",
    "Samples",
    "default_run_dir",
    "latest_run_dir",
    "read_samples",
    "write_metrics",
)

SAMPLES_FILE = "samples.jsonl"
GROUPS_FILE = "groups.jsonl"
METRICS_FILE = "metrics.json"
VIEWER_FILE = "index.html"
RUN_FILE = "run.json"

#: Where run folders go by default (relative to the working directory).
RUNS_ROOT = Path("runs")

#: A longer line of ``samples.jsonl`` is skipped (and counted) when it is read back.
MAX_LINE_BYTES = 64 * 1024 * 1024

#: Lines read back at most; the rest are counted, not read.
MAX_ROWS = 100_000

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def default_run_dir(env_name: str, *, root: Path = RUNS_ROOT, now: float | None = None) -> Path:
    """``root/<env_name>-<YYYYmmdd-HHMMSS>`` (local time), with a ``-2``, ``-3``... suffix
    when that folder exists already."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    base = root / f"{_UNSAFE.sub('_', env_name) or 'env'}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def latest_run_dir(env_name: str, *, root: Path = RUNS_ROOT) -> Path | None:
    """The newest ``root/<env_name>-*`` folder holding a ``samples.jsonl`` (``None``: none)."""
    prefix = f"{_UNSAFE.sub('_', env_name) or 'env'}-"
    if not root.is_dir():
        return None
    found = [
        p for p in root.iterdir() if p.name.startswith(prefix) and (p / SAMPLES_FILE).is_file()
    ]
    return max(found, key=lambda p: (p / SAMPLES_FILE).stat().st_mtime, default=None)


@dataclass(frozen=True, slots=True)
class Samples:
    """The lines of a ``samples.jsonl``; ``skipped`` lines were not records, ``unread`` ones
    lay past :data:`MAX_ROWS`."""

    rows: list[JSONObject] = field(default_factory=list)
    skipped: int = 0
    unread: int = 0

    def summaries(self) -> list[RolloutSummary]:
        """One :class:`RolloutSummary` per row (the end-of-run table's input)."""
        return [summary_from_sample(row) for row in self.rows]


def read_samples(
    path: Path, *, max_rows: int = MAX_ROWS, max_line_bytes: int = MAX_LINE_BYTES
) -> Samples:
    """Read a JSONL of objects within the bounds above; a missing file reads as empty."""
    rows: list[JSONObject] = []
    skipped = unread = 0
    if not path.is_file():
        return Samples()
    with path.open("rb") as file:
        for line, whole in _lines(file, max_line_bytes):
            if len(rows) >= max_rows:
                unread += 1
                continue
            if whole and not line.strip():
                continue  # a blank line
            record = _record(line) if whole else None
            if record is None:
                skipped += 1
                continue
            rows.append(record)
    return Samples(rows, skipped, unread)


def _lines(file: Any, limit: int) -> Iterator[tuple[bytes, bool]]:
    """``(line, whole)`` pairs: ``whole`` is False for a last line cut short (no newline) and for
    a line over ``limit`` bytes, which comes as ``b""``, read past in pieces, never held whole."""
    while True:
        line = file.readline(limit + 1)
        if not line:
            return
        if len(line) > limit:
            while line and not line.endswith(b"\n"):
                line = file.readline(limit + 1)
            yield b"", False
            continue
        yield line, line.endswith(b"\n")


def _record(line: bytes) -> JSONObject | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True, slots=True)
class RunInfo:
    """How a run was made (``run.json``); shown at the top of the viewer.

    ``command`` is redacted; ``env`` is as given; ``seconds`` is this invocation's wall time.
    """

    command: str
    env: str
    env_name: str
    mode: str
    model: str
    started: float
    seconds: float | None = None

    def to_json(self) -> JSONObject:
        """The ``run.json`` object."""
        return {
            "command": redact(self.command),
            "env": self.env,
            "env_name": self.env_name,
            "mode": self.mode,
            "model": redact(self.model),
            "started": self.started,
            "started_local": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started)),
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> RunInfo:
        """Read back a ``run.json`` object (missing fields read as empty)."""
        seconds, started = value.get("seconds"), value.get("started")
        return cls(
            command=str(value.get("command", "")),
            env=str(value.get("env", "")),
            env_name=str(value.get("env_name", "")),
            mode=str(value.get("mode", "")),
            model=str(value.get("model", "")),
            started=finite_number(started) or 0.0,
            seconds=finite_number(seconds),
        )

    def write(self, run_dir: Path) -> Path:
        """Write ``run.json`` into ``run_dir`` (atomically)."""
        return _write_json(run_dir / RUN_FILE, self.to_json())

    @classmethod
    def read(cls, run_dir: Path) -> RunInfo | None:
        """The ``run.json`` of ``run_dir``, or ``None`` if it has none (or a broken one)."""
        path = run_dir / RUN_FILE
        try:
            if path.stat().st_size > 1024 * 1024:
                return None
            value = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):
            return None
        return cls.from_json(value) if isinstance(value, dict) else None


def write_metrics(
    run_dir: Path, rows: Sequence[Mapping[str, Any]], info: RunInfo, seconds: float
) -> Path:
    """Write ``metrics.json``: the ``<mode>/*`` metrics of every row, in the shape atroposlib's
    ``evaluate_log`` writes (``config_general``, ``results.all``)."""
    metrics = eval_metrics(rows, seconds, prefix=info.mode)
    return _write_json(
        run_dir / METRICS_FILE,
        {
            "config_general": {
                "model_name": redact(info.model),
                "environment": info.env_name,
                "total_evaluation_time_seconds": str(seconds),
            },
            "results": {f"hermes_async|{info.env_name}|{info.mode}": metrics, "all": metrics},
        },
    )


def _write_json(path: Path, value: JSONObject) -> Path:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", "utf-8")
    os.replace(temporary, path)
    return path
