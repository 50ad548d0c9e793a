"""The hostile-server cases under a 1 GiB address-space limit, each client in a child process.

The child (``python -m hermes_async.testing.hostile``) sets ``RLIMIT_AS`` before it imports the
clients, runs the attack and prints the error it got; this process serves the attack. A bound
that holds shows as the classified error with the child alive and its peak RSS far below the
limit; a bound that does not shows as a ``MemoryError``, a child killed by the limit, or a
timeout. Issue 38: under 1 GiB, no case may kill the process.
"""

from __future__ import annotations

import json
import os
import sys

import anyio
import pytest

from hermes_async._asynclib import current_async_library
from hermes_async.testing.hostile import HOSTILE_CASES, HostileCase, open_hostile_server

pytestmark = pytest.mark.anyio

RLIMIT_AS_BYTES = 2**30
#: A child that peaks above this held something a bound should have stopped (the interpreter
#: with the clients imported takes ~45 MiB; a 64 MiB body read whole ~110 MiB).
PEAK_RSS_BYTES = 256 * 2**20
EXPECTED_ERRORS = {"endless_error_body": "ServerStatusError"}


@pytest.mark.parametrize("case", list(HOSTILE_CASES))
async def test_no_case_kills_a_process_with_1_gib_of_address_space(case: HostileCase) -> None:
    async with open_hostile_server(case) as server:
        command = [
            sys.executable,
            "-m",
            "hermes_async.testing.hostile",
            case,
            server.url,
            "--rlimit-as",
            str(RLIMIT_AS_BYTES),
            "--timeout",
            "60",
            "--backend",
            str(current_async_library()),  # the child's client runs on this test's backend
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        with anyio.fail_after(120):
            done = await anyio.run_process(command, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert result["error"] == EXPECTED_ERRORS.get(case, "ServerProtocolError"), result
    assert result["seconds"] < 30, result
    assert result["peak_rss_bytes"] < PEAK_RSS_BYTES, result
