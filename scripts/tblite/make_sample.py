#!/usr/bin/env python3
"""Write TBLiteEvalEnv's built-in sample: the task folders as openthoughts-tblite rows.

    python scripts/tblite/make_sample.py        # refresh hermes_async/envs/samples/tblite_sample.jsonl

The rows are in the Hermes/TB2 row format with this project's ``solution_tar`` and no
``docker_image`` (the image is built from ``environment_tar``; the hub's rows name
``nousresearch/tblite-<task>`` images). Archives are reproducible, so the file only changes
when a task does (tests/envs/test_tblite.py checks it is current).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hermes_async.envs.samples import TBLITE_SAMPLE, TBLITE_TASKS  # noqa: E402
from hermes_async.envs.terminalbench.rows import row_from_task_dir  # noqa: E402


def sample_rows() -> list[dict[str, str | None]]:
    """The rows of the sample's task folders, in name order."""
    return [row_from_task_dir(folder) for folder in sorted(TBLITE_TASKS.iterdir())]


def main() -> int:
    rows = sample_rows()
    TBLITE_SAMPLE.write_text(
        "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows), encoding="utf-8"
    )
    print(f"wrote {len(rows)} row(s) to {TBLITE_SAMPLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
