"""Model-server client CPU: the lean pool vs httpx, side by side, same loopback server.

Why this exists: ``ServerConnection`` speaks HTTP/1.1 through its own lean client
(``inference/_wire.py``, httptools over anyio streams) instead of httpx, because at thousands of
concurrent rollouts the client's CPU per request is what keeps the event loop responsive. This
script reproduces that decision.

Both sides run the same code above the transport seam — ``ServerConnection.open_lines`` and
its line reader, limiter, deadlines — so the only difference is the transport:

* **wire**: the default, :class:`~hermes_async.inference._wire.WirePool`;
* **httpx**: :class:`~hermes_async.inference._httpx.HttpxTransport` over
  ``httpx.AsyncHTTPTransport`` (what the connection uses behind a proxy).

The server runs in a *separate process* (a minimal asyncio HTTP/1.1 server) so its CPU does not
count: it answers every request with a chunked SSE stream of ``--events`` vLLM-shaped chunks,
``--gap-ms`` apart (so each arrives as its own read, as from a real model server), then
``data: [DONE]``. Reported per concurrency: client CPU per request (``time.process_time`` of
this process over the timed run, divided by the requests), wall time, and the ratio
httpx / wire. Each side runs ``--repeats`` times, alternating, and the median is shown.

    PYTHONPATH=. .venv/bin/python bench/http_client.py                     # 16 and 256 streams
    PYTHONPATH=. .venv/bin/python bench/http_client.py --streams 256 --backend trio
    PYTHONPATH=. .venv/bin/python bench/http_client.py --parsers

``--parsers`` measures the pool's own choice of HTTP parser, no sockets: the same streamed
response (the server's head and ``--events`` chunks, each its own read) parsed by the pool's
httptools exchange and by h11, the pure-Python parser it used before (h11 comes with httpx).

(``PYTHONPATH=.``: a script's own folder, not the working directory, starts ``sys.path``.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

import anyio
import httpx

from hermes_async.inference._http import HTTPOptions, ServerConnection
from hermes_async.inference._wire import _Exchange
from hermes_async.limits import NamedLimiter


def _event(n: int) -> bytes:
    payload = {
        "choices": [
            {
                "token_ids": [1000 + n, 2000 + n],
                "finish_reason": None,
                "logprobs": {
                    "content": [
                        {"token_id": 1000 + n, "logprob": -0.25},
                        {"token_id": 2000 + n, "logprob": -1.5},
                    ]
                },
            }
        ]
    }
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _framed(events: int) -> list[bytes]:
    """The body's chunks as the server writes them (each chunk-framed), ``[DONE]`` last."""
    chunks = [_event(n) for n in range(events)] + [b"data: [DONE]\n\n"]
    return [f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks]


# ------------------------------------------------------------------------------ server process


async def _serve(events: int, gap: float) -> None:
    framed = _framed(events)
    head = HEAD

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in header.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                writer.write(head)
                for piece in framed:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(gap)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


# ------------------------------------------------------------------------------ client


def _connection(url: str, kind: str, streams: int) -> ServerConnection:
    options = HTTPOptions(max_connections=streams, read_timeout=60)
    limiter = NamedLimiter("model_requests", streams)
    transport = (
        httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=streams))
        if kind == "httpx"
        else None
    )
    return ServerConnection(url, options=options, limiter=limiter, transport=transport)


async def _requests(conn: ServerConnection, count: int, events: int) -> None:
    for _ in range(count):
        async with conn.open_lines("/inference/v1/generate", {"token_ids": [1, 2, 3]}) as lines:
            data = 0
            while (line := await lines.readline()) is not None:
                if line.startswith("data: {"):
                    data += 1
            assert data == events, data


async def _run(
    url: str, kind: str, streams: int, per_stream: int, events: int
) -> tuple[float, float]:
    """(client CPU seconds per request, wall seconds) of one timed run after a warm-up."""
    async with _connection(url, kind, streams) as conn:
        assert conn.transport_kind == kind
        async with anyio.create_task_group() as tg:  # warm-up: open the pool's connections
            for _ in range(streams):
                tg.start_soon(_requests, conn, 1, events)
        cpu, wall = time.process_time(), time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(streams):
                tg.start_soon(_requests, conn, per_stream, events)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / (streams * per_stream), wall


# ------------------------------------------------------------------------------ parsers alone


def _parse_httptools(reads: list[bytes]) -> int:
    exchange = _Exchange(no_body=False)
    size = 0
    for data in reads:
        exchange.feed(data)
        size += sum(map(len, exchange.body))
        exchange.body = []
    assert exchange.complete and exchange.reusable()
    return size


def _parse_h11(reads: list[bytes]) -> int:
    import h11  # httpx's dependency; the pool used it before httptools

    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=b"POST", target=b"/g", headers=[(b"host", b"x")]))
    conn.send(h11.EndOfMessage())
    size = 0
    ended = False
    for data in reads:
        conn.receive_data(data)
        while (event := conn.next_event()) is not h11.NEED_DATA:
            if type(event) is h11.Data:
                size += len(event.data)
            elif type(event) is h11.EndOfMessage:
                ended = True
                break
    assert ended
    return size


def compare_parsers(events: int, responses: int, repeats: int) -> None:
    reads = [HEAD, *_framed(events), b"0\r\n\r\n"]
    expected = sum(len(_event(n)) for n in range(events)) + len(b"data: [DONE]\n\n")
    sides = {"httptools": _parse_httptools, "h11": _parse_h11}
    results: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, parse in sides.items():
            start = time.process_time()
            for _ in range(responses):
                assert parse(reads) == expected
            results[name].append((time.process_time() - start) / responses)
    cpu = {name: statistics.median(v) for name, v in results.items()}
    print(
        f"one streamed response of {events} events, each its own read ({responses} responses, "
        f"median of {repeats}): httptools {cpu['httptools'] * 1e6:.1f} us, h11 "
        f"{cpu['h11'] * 1e6:.1f} us, ratio {cpu['h11'] / cpu['httptools']:.1f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--requests", type=int, default=1024, help="requests per timed run")
    parser.add_argument("--events", type=int, default=32, help="SSE events per response")
    parser.add_argument("--gap-ms", type=float, default=1.0, help="server pause between events")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--parsers", action="store_true", help="the HTTP parsers alone")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.parsers:
        compare_parsers(args.events, 5000, args.repeats)
        return
    if args.serve:
        asyncio.run(_serve(args.events, args.gap_ms / 1000))
        return
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            "--events",
            str(args.events),
            "--gap-ms",
            str(args.gap_ms),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        url = f"http://127.0.0.1:{int(child.stdout.readline())}"
        print(
            f"backend={args.backend} events/response={args.events} gap={args.gap_ms:g} ms "
            f"requests/run={args.requests} repeats={args.repeats} (median)"
        )
        print(
            f"{'streams':>7}  {'wire CPU/req':>12}  {'httpx CPU/req':>13}  {'ratio':>6}  wall s (wire/httpx)"
        )
        for streams in args.streams:
            per_stream = max(1, args.requests // streams)
            results: dict[str, list[tuple[float, float]]] = {"wire": [], "httpx": []}
            for _ in range(args.repeats):
                for kind in ("wire", "httpx"):
                    results[kind].append(
                        anyio.run(
                            _run, url, kind, streams, per_stream, args.events, backend=args.backend
                        )
                    )
            cpu = {k: statistics.median(r[0] for r in v) for k, v in results.items()}
            wall = {k: statistics.median(r[1] for r in v) for k, v in results.items()}
            print(
                f"{streams:>7}  {cpu['wire'] * 1e3:>9.3f} ms  {cpu['httpx'] * 1e3:>10.3f} ms  "
                f"{cpu['httpx'] / cpu['wire']:>5.2f}x  {wall['wire']:.2f} / {wall['httpx']:.2f}"
            )
    finally:
        child.kill()
        child.wait()


if __name__ == "__main__":
    main()
