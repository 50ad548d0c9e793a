"""Every hostile-server case against the clients: the classified error, at once.

The cases are :mod:`hermes_async.testing.hostile`'s (issue 38, rows W1-W6). Before the bounds,
each of them grew the client's memory until the 300 s read timeout (or forever); here each
must end in the error that names its bound within a few seconds. The same cases under a 1 GiB
address-space limit, in a child process: ``test_hostile_memory.py``.
"""

from __future__ import annotations

import anyio
import pytest

from hermes_async.inference import ServerProtocolError, ServerStatusError
from hermes_async.testing.hostile import HOSTILE_CASES, HostileCase, attack, open_hostile_server

pytestmark = pytest.mark.anyio

#: Far below the read timeout (300 s); generous for a loaded 2-core machine.
SECONDS_TO_ERROR = 20.0

#: What each case must give: the error and a pattern of its message (the bound it names).
EXPECTED: dict[str, tuple[type[Exception], str]] = {
    "endless_head": (ServerProtocolError, r"HTTPOptions\.max_header_lines=128"),
    "endless_header_line": (ServerProtocolError, r"HTTPOptions\.max_head_bytes=65536"),
    "huge_content_length": (
        ServerProtocolError,
        r"max_body_bytes=67108864 .*a Content-Length of 100000000000 bytes",
    ),
    "endless_chunked": (ServerProtocolError, r"HTTPOptions\.max_body_bytes=67108864"),
    "endless_close": (ServerProtocolError, r"HTTPOptions\.max_body_bytes=67108864"),
    "endless_error_body": (ServerStatusError, r"HTTP 500 .*gave up after 4 attempts"),
    "endless_event": (ServerProtocolError, r"HTTPOptions\.max_event_bytes=16777216"),
    "endless_content": (
        ServerProtocolError,
        r"more than its bound of 16384 .*max_tokens=16 x HTTPOptions\.max_chars_per_token=1024",
    ),
    "endless_arguments": (ServerProtocolError, r"more than its bound of 16384"),
    "deep_json": (ServerProtocolError, r"not valid JSON \(JSON nested too deeply to decode\)"),
    "endless_tokens": (ServerProtocolError, r"sent 17 tokens for max_tokens=16"),
}


def test_every_case_has_an_expectation() -> None:
    assert set(EXPECTED) == set(HOSTILE_CASES)


@pytest.mark.parametrize("case", list(HOSTILE_CASES))
async def test_each_case_ends_in_its_classified_error_at_once(case: HostileCase) -> None:
    error, pattern = EXPECTED[case]
    async with open_hostile_server(case) as server:
        start = anyio.current_time()
        with anyio.fail_after(SECONDS_TO_ERROR), pytest.raises(error, match=pattern):
            await attack(case, server.url)
        elapsed = anyio.current_time() - start
        assert server.requests >= 1
    assert elapsed < SECONDS_TO_ERROR


async def test_the_tokens_kept_on_the_error_are_never_more_than_asked_for() -> None:
    async with open_hostile_server("endless_tokens") as server:
        with pytest.raises(ServerProtocolError) as info:
            await attack("endless_tokens", server.url)
    assert len(info.value.token_ids) == 16 and len(info.value.logprobs) == 16


async def test_an_error_body_is_read_only_as_far_as_its_excerpt() -> None:
    # 500 is retried: four requests, each answered by an endless body. Each attempt reads the
    # excerpt's 2,000 bytes (one socket read: up to 64 KiB) and drops the connection.
    async with open_hostile_server("endless_error_body") as server:
        with pytest.raises(ServerStatusError) as info:
            await attack("endless_error_body", server.url)
        with anyio.fail_after(10):
            while server.clients_gone < 4:
                await anyio.sleep(0.01)
    assert server.requests == 4
    assert info.value.line is not None and len(info.value.line) == 500


async def test_unknown_case_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown hostile case 'nope'; one of: endless_head"):
        async with open_hostile_server("nope"):  # type: ignore[arg-type]
            pass
