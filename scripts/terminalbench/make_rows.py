#!/usr/bin/env python3
"""Write bundled tasks as Hermes dataset rows: the JSONL fixture, and Parquet on request.

    python scripts/terminalbench/make_rows.py                    # refresh the JSONL fixture
    python scripts/terminalbench/make_rows.py --parquet rows.parquet   # also Parquet (pyarrow)

Rows are named ``<task>-row`` so they can run next to the folders they came from. The
archives are reproducible (sorted members, mtime 0), so an unchanged task gives the same
row bytes and the committed fixture only changes when a task does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hermes_async.envs.terminalbench import BUNDLED_ROWS, BUNDLED_TASKS  # noqa: E402
from hermes_async.envs.terminalbench.rows import row_from_task_dir, write_parquet  # noqa: E402

DEFAULT_TASKS = ("log-summary", "fix-python-bug")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--task", action="append", help=f"bundled task (default: {', '.join(DEFAULT_TASKS)})"
    )
    parser.add_argument("--jsonl", type=Path, default=BUNDLED_ROWS)
    parser.add_argument("--parquet", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for name in args.task or DEFAULT_TASKS:
        row = row_from_task_dir(BUNDLED_TASKS / name)
        row["task_name"] = f"{name}-row"
        rows.append(row)
    args.jsonl.write_text(
        "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows), encoding="utf-8"
    )
    print(f"wrote {len(rows)} row(s) to {args.jsonl}")
    if args.parquet is not None:
        write_parquet(rows, args.parquet)
        print(f"wrote {len(rows)} row(s) to {args.parquet}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
