"""The echo task, but importing it holds the actor's start until a file exists.

The file is ``$HERMES_TEST_HOLD``; each process that holds first leaves ``started-<pid>``
beside it, so a test can kill an actor whose worker is not ready yet.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hermes_async.testing.worker_tasks import echo_task

__all__ = ("echo_task",)

_hold = Path(os.environ["HERMES_TEST_HOLD"])
(_hold.parent / f"started-{os.getpid()}").touch()
_deadline = time.monotonic() + 120
while not _hold.exists() and time.monotonic() < _deadline:
    time.sleep(0.05)  # blocks the actor's loop: it is only starting
