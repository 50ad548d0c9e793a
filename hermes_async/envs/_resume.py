"""Results written as they come, one line per item, and runs that resume where they stopped.

Each JSONL line carries a stable ``item_key`` and is flushed as written; ``--env.resume true``
keeps finished lines byte for byte and runs only missing or errored items. Keys, files and
what counts as errored: docs/decisions/029-resumable-results.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

__all__ = (
    "ERRORED_CATEGORIES",
    "ITEM_KEY",
    "ResultsFile",
    "default_item_key",
    "errored",
    "item_keys",
    "missing",
)

logger = logging.getLogger("hermes_async.envs.base")

#: The key each line carries.
ITEM_KEY = "item_key"

#: Failure categories that make an eval result worth re-running.
ERRORED_CATEGORIES = frozenset({"infra", "verifier", "cancelled"})

_ID_FIELDS = ("task_id", "id", "name", "task")


def default_item_key(item: Any) -> str:
    """An item's identity: its ``task_id`` / ``id`` / ``name`` / ``task`` field, else the first
    16 hex digits of the SHA-256 of its canonical JSON (``repr`` for what JSON cannot hold)."""
    if isinstance(item, Mapping):
        for field in _ID_FIELDS:
            value = item.get(field)
            if isinstance(value, str | int) and not isinstance(value, bool):
                return str(value)
    canonical = json.dumps(item, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class _Occurrences:
    """Turns base keys into run-unique keys: ``k``, ``k#2``, ``k#3``, ..."""

    def __init__(self) -> None:
        self._seen: Counter[str] = Counter()

    def __call__(self, base: str) -> str:
        self._seen[base] += 1
        count = self._seen[base]
        return base if count == 1 else f"{base}#{count}"


def item_keys(items: Sequence[Any], key: Callable[[Any], str]) -> list[str]:
    """The run-unique key of each item, in order (see the module docstring)."""
    occurrence = _Occurrences()
    return [occurrence(key(item)) for item in items]


def errored(record: Mapping[str, Any]) -> bool:
    """Whether a results line must be re-run: its failure is infra, verifier or cancelled."""
    failure = record.get("failure")
    category = failure.get("category") if isinstance(failure, Mapping) else failure
    return category in ERRORED_CATEGORIES


class ResultsFile:
    """A JSONL file of results, one line per item key, written line by line.

    Args:
        path: The file.
        resume: Keep what is there; else start a new, empty file.
        keep: Which existing lines count as finished (default: all with a key).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        resume: bool,
        keep: Callable[[Mapping[str, Any]], bool] = lambda record: True,
    ) -> None:
        self.path = Path(path)
        self.resume = resume
        self._keep = keep
        #: Finished records already in the file, by key (filled by :meth:`open`).
        self.done: dict[str, dict[str, Any]] = {}
        self._file: TextIO | None = None
        self._next = _Occurrences()

    def open(self) -> ResultsFile:
        """Prepare the file: on resume, load the finished lines (dropping a cut last line and
        errored ones); otherwise truncate it. Then open it for appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.resume and self.path.exists():
            self._load()
        else:
            self.path.write_bytes(b"")
        self._file = self.path.open("a", encoding="utf-8")
        return self

    def _load(self) -> None:
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline; else a line cut short
        kept: list[bytes] = []
        dropped = 1 if tail else 0
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # RecursionError: nested too deeply
                dropped += 1
                continue
            key = record.get(ITEM_KEY) if isinstance(record, dict) else None
            if not isinstance(key, str):
                kept.append(line)  # not ours: left as it is, never matched
                continue
            if key in self.done or not self._keep(record):
                dropped += 1
                continue
            self.done[key] = record
            kept.append(line)
        if dropped:
            temporary = self.path.with_name(self.path.name + ".resume-tmp")
            with temporary.open("wb") as out:
                out.write(b"".join(line + b"\n" for line in kept))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
        logger.info(
            "resuming %s: %d finished items kept, %d lines dropped (cut short or errored)",
            self.path,
            len(self.done),
            dropped,
        )

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one result line (``record`` carries ``item_key``) and flush it."""
        if self._file is None:
            raise RuntimeError(f"results file {self.path} is not open")
        if not isinstance(record.get(ITEM_KEY), str):
            raise ValueError(f"a result line needs a string {ITEM_KEY!r}")
        self._file.write(_line(record))
        self._file.flush()

    def write(self, record: Mapping[str, Any]) -> None:
        """jsonlines' ``Writer.write``: :meth:`append`, keyless records included."""
        if self._file is None:
            raise RuntimeError(f"results file {self.path} is not open")
        self._file.write(_line(record))
        self._file.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _line(record: Mapping[str, Any]) -> str:
    text = json.dumps(record, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (a file name of non-UTF-8 bytes) cannot be written as UTF-8; as a
        # JSON \u escape it can, and it reads back as the same string (the same item key).
        text = json.dumps(record)
    return text + "\n"


def missing(keys: Iterable[str], done: Mapping[str, object]) -> list[int]:
    """Indexes of ``keys`` not in ``done``."""
    return [i for i, key in enumerate(keys) if key not in done]


# --------------------------------------------------------------------------------------------
# process mode: atroposlib's loop, with keyed, flushed, resumable group lines


def hide_groups_file_from_atroposlib(config: Any) -> str | None:
    """On ``resume``, hide ``data_path_to_save_groups`` from ``BaseEnv.__init__``."""
    path = getattr(config, "data_path_to_save_groups", None)
    if not (getattr(config, "resume", False) and path and os.path.exists(path)):
        return None
    config.data_path_to_save_groups = None
    return str(path)


def open_groups_file(env: Any, resumed: str | None) -> ResultsFile | None:
    """Replace atroposlib's JSONL writer with a :class:`ResultsFile`, restoring ``resumed``."""
    config = env.config
    if resumed is not None:
        config.data_path_to_save_groups = resumed
    path = config.data_path_to_save_groups
    if path is None:
        return None
    previous = getattr(env, "jsonl_writer", None)
    if previous is not None:
        previous.close()  # atroposlib's buffered writer on the (new, empty) file
    results = ResultsFile(path, resume=resumed is not None).open()
    env.jsonl_writer = results
    return results


class ProcessItems:
    """Wraps ``get_next_item`` for ``process`` mode: keys each item, skips finished ones.

    The current item's key is :attr:`current_key`.
    """

    def __init__(self, env: Any, results: ResultsFile | None) -> None:
        self.env = env
        self.results = results
        self.current_key: str | None = None
        self.skipped = 0
        self._next = _Occurrences()

    async def __call__(self) -> Any:
        """The next item not finished in an earlier run (``None`` when there is none).

        **Cancellation**: as the environment's ``get_next_item``.
        """
        env = self.env
        while True:
            with env._waiting(f"{type(env).__name__}.get_next_item()"):
                item = await type(env).get_next_item(env)
            if item is None:
                self.current_key = None
                return None
            key = self._next(env.item_key(item))
            if self.results is not None and key in self.results.done:
                self.skipped += 1
                continue
            self.current_key = key
            return item

    def take_key(self) -> str | None:
        """The key of the item just handed out (once)."""
        key, self.current_key = self.current_key, None
        return key

    def __enter__(self) -> ProcessItems:
        done = len(self.results.done) if self.results is not None else 0
        if done:
            env = self.env
            before = int(getattr(env, "n_groups_to_process", 0) or 0)
            env.n_groups_to_process = max(0, before - done)
            logger.info(
                "resume: %d of %d groups already written; processing %d more",
                done,
                before,
                env.n_groups_to_process,
            )
        self.env.get_next_item = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.env.__dict__.pop("get_next_item", None)
