"""Reading response bodies: the line reader is linear, exact under any chunking, and capped."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Mapping

import anyio
import pytest

from hermes_async.inference import HTTPOptions, ServerProtocolError, StreamInterruptedError
from hermes_async.inference._body import BodyContext, LineReader, read_body, read_excerpt
from hermes_async.inference._transport import BodyCut

pytestmark = pytest.mark.anyio


class ChunkedResponse:
    """A response whose body is a fixed list of chunks (counts how many were asked for)."""

    status_code = 200
    reason_phrase = "OK"
    headers: Mapping[str, str] = {}

    def __init__(self, chunks: Iterable[bytes], *, cut: bool = False) -> None:
        self._chunks = iter(chunks)
        self._cut = cut
        self.reads = 0
        self.closed = False
        self.body_received = False

    async def receive_some(self, timeout: float = math.inf) -> bytes | None:
        await anyio.lowlevel.checkpoint()
        self.reads += 1
        chunk = next(self._chunks, None)
        if chunk is None and self._cut:
            raise BodyCut("connection reset")
        self.body_received = chunk is None
        return chunk

    async def aclose(self) -> None:
        self.closed = True


def reader(
    response: ChunkedResponse, max_line_bytes: int = HTTPOptions().max_line_bytes
) -> LineReader:
    context = BodyContext("POST http://m/x", 1, anyio.current_time() + 60, 30.0, 2**20)
    return LineReader(response, context, max_line_bytes=max_line_bytes)


async def lines_of(response: ChunkedResponse, max_line_bytes: int = 2**24) -> list[str]:
    lines_reader = reader(response, max_line_bytes)
    out = []
    while (line := await lines_reader.readline()) is not None:
        out.append(line)
    return out


def cut(data: bytes, rng: random.Random, max_piece: int) -> list[bytes]:
    pieces, i = [], 0
    while i < len(data):
        step = rng.randint(1, max_piece)
        pieces.append(data[i : i + step])
        i += step
    return pieces


async def test_any_chunking_gives_the_same_lines() -> None:
    text = 'data: {"a": "héllo ✓ 😀"}\r\n\r\ndata: x\n: comment\n\n\n\u2028inside\nlast without newline'
    expected = [line.removesuffix("\r") for line in text.split("\n")]
    data = text.encode()
    rng = random.Random(7)
    for max_piece in (1, 2, 3, 7, 64, len(data)):
        for _ in range(20):
            assert await lines_of(ChunkedResponse(cut(data, rng, max_piece))) == expected


async def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert await lines_of(ChunkedResponse([b"ok \xff\xfe", b"\xe2\x9c\nnext\n"])) == [
        "ok \ufffd\ufffd\ufffd",
        "next",
    ]


async def test_a_huge_line_in_small_chunks_is_read_in_linear_time() -> None:
    # 32 MiB in 64 KiB reads. The former reader re-joined the pending text on every read:
    # about 8 GB copied here (~10 s); a linear one copies it twice (well under a second).
    size, piece = 32 * 2**20, 2**16
    chunks = [b"data: "] + [b"x" * piece] * (size // piece) + [b"\n\n"]
    response = ChunkedResponse(chunks)
    start = time.perf_counter()
    lines = await lines_of(response, max_line_bytes=size + 64)
    elapsed = time.perf_counter() - start
    assert [len(line) for line in lines] == [size + len("data: "), 0]
    assert elapsed < 4.0, f"{elapsed:.2f} s for one 32 MiB line: not linear"


async def test_a_line_over_the_cap_stops_reading_with_an_error_naming_the_option() -> None:
    cap = 4096
    response = ChunkedResponse([b"data: " + b"y" * 1000] * 1000)  # never a newline
    lines_reader = reader(response, cap)
    with pytest.raises(
        ServerProtocolError, match=r"longer than HTTPOptions\.max_line_bytes=4096 bytes"
    ) as info:
        await lines_reader.readline()
    # Bounded: reading stopped as soon as the cap was passed (memory stays ~ the cap).
    assert response.reads <= cap // 1000 + 2
    assert info.value.line is not None and info.value.line.startswith("data: yyy")
    assert len(info.value.line) <= 200
    assert "Raise HTTPOptions.max_line_bytes" in str(info.value)


async def test_the_cap_is_exact() -> None:
    cap = 100
    assert await lines_of(ChunkedResponse([b"z" * 60, b"z" * 40 + b"\n"]), cap) == ["z" * 100]
    with pytest.raises(ServerProtocolError, match="max_line_bytes=100"):
        await lines_of(ChunkedResponse([b"z" * 60, b"z" * 41 + b"\n"]), cap)
    with pytest.raises(ServerProtocolError, match="max_line_bytes=100"):  # within one chunk
        await lines_of(ChunkedResponse([b"ok\n" + b"z" * 101 + b"\nmore\n"]), cap)
    with pytest.raises(ServerProtocolError, match="max_line_bytes=100"):  # the unfinished tail
        await lines_of(ChunkedResponse([b"ok\n" + b"z" * 101]), cap)


async def test_a_cut_body_is_stream_interrupted_after_the_complete_lines() -> None:
    lines_reader = reader(ChunkedResponse([b"one\ntw"], cut=True))
    assert await lines_reader.readline() == "one"
    with pytest.raises(StreamInterruptedError, match="closed before the response body ended"):
        await lines_reader.readline()


def test_max_line_bytes_is_validated() -> None:
    with pytest.raises(ValueError, match=r"max_line_bytes must be an integer >= 1, got 0"):
        HTTPOptions(max_line_bytes=0)
    assert HTTPOptions().max_line_bytes == 16 * 2**20


class EndlessResponse(ChunkedResponse):
    """A body that never ends (``piece`` forever), with the headers given."""

    def __init__(self, piece: bytes, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(iter(lambda: piece, None))
        self.headers = headers or {}


def context(max_body_bytes: int) -> BodyContext:
    return BodyContext("POST http://m/x", 1, anyio.current_time() + 60, 30.0, max_body_bytes)


async def test_read_body_refuses_a_declared_length_past_the_bound_before_reading() -> None:
    response = EndlessResponse(b"x" * 1024, {"content-length": str(10**11)})
    with pytest.raises(
        ServerProtocolError,
        match=r"longer than HTTPOptions\.max_body_bytes=4096 bytes .* a Content-Length of "
        r"100000000000 bytes",
    ):
        await read_body(response, context(4096))
    assert response.reads == 0


@pytest.mark.parametrize(
    ("declared", "refused_as"),
    [
        ("0" * 5000 + "5", None),  # llhttp takes leading zeros; int() refused 4,301+ digits
        ("\u00b2", None),  # "²": a digit to isdigit(), not to int()
        ("1" * 5000, "5000-digit"),
        ("9" * 30, "9" * 30),
    ],
)
async def test_read_body_reads_any_declared_length_without_a_raw_error(
    declared: str, refused_as: str | None
) -> None:
    response = ChunkedResponse([b"hello"])
    response.headers = {"content-length": declared}
    if refused_as is None:
        assert await read_body(response, context(4096)) == b"hello"
        return
    with pytest.raises(ServerProtocolError, match=f"a Content-Length of {refused_as} bytes"):
        await read_body(response, context(4096))
    assert response.reads == 0


async def test_read_body_stops_an_endless_body_at_the_bound() -> None:
    response = EndlessResponse(b"x" * 1000)
    with pytest.raises(ServerProtocolError, match=r"max_body_bytes=4096 .* sent 5000\+ bytes"):
        await read_body(response, context(4096))
    assert response.reads == 5
    assert await read_body(ChunkedResponse([b"a" * 4096]), context(4096)) == b"a" * 4096


async def test_read_excerpt_reads_no_further_than_it_needs() -> None:
    endless = EndlessResponse(b"e" * 300)
    assert await read_excerpt(endless, context(2**20), 1000) == (b"e" * 1000, False)
    assert endless.reads == 4
    short = ChunkedResponse([b'{"error": "busy"}'])
    assert await read_excerpt(short, context(2**20), 1000) == (b'{"error": "busy"}', True)


async def test_line_bytes_is_the_size_of_the_last_line_as_received() -> None:
    lines = reader(ChunkedResponse(["é\nab".encode(), b"c\r\n", b"tail"]))
    sizes = []
    while (line := await lines.readline()) is not None:
        sizes.append((line, lines.line_bytes))
    assert sizes == [("é", 2), ("abc", 4), ("tail", 4)]
