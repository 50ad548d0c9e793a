"""One very long SSE line through the chat client: time, event-loop stall, and the cap.

A model server that sends one huge ``data:`` line (a 40 MB completion in one chunk, an error
page without newlines) used to cost quadratic time in the line reader (the pending text was
concatenated and re-split on every socket read). This script serves such a response from a
*separate process* over loopback (so the server's work does not count against the client's
loop) and reports, per line size:

* wall time of ``ChatClient.chat_completion(stream=True)`` reading it (and the JSON decode),
* the longest event-loop stall during it (a 5 ms ticker in the same loop),
* with the default cap (``HTTPOptions.max_line_bytes``, 16 MiB): what a longer line gives.

    PYTHONPATH=. .venv/bin/python bench/sse_long_line.py                  # 1, 10, 40 MB
    PYTHONPATH=. .venv/bin/python bench/sse_long_line.py --sizes-mb 40 --backend trio

(``PYTHONPATH=.``: a script's own folder, not the working directory, starts ``sys.path``.)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import socket
import subprocess
import sys
import time

import anyio

from hermes_async.inference import ChatClient, HTTPOptions, ModelServerError


def _payload(size: int) -> bytes:
    head = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"'
    tail = b'"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    return head + b"x" * max(0, size - len(head) - len(tail)) + tail


def serve(size: int) -> None:
    """Blocking server (child process): every request gets the long-line response."""
    body = _payload(size)
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            header, _, rest = data.partition(b"\r\n\r\n")
            length = 0
            for line in header.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            while len(rest) < length:
                rest += conn.recv(65536)
            with contextlib.suppress(OSError):  # the client may leave early (the cap)
                conn.sendall(head + body)


async def _ticker(stalls: list[float], stop: anyio.Event) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await anyio.sleep(0.005)
        now = time.perf_counter()
        stalls.append(now - last - 0.005)
        last = now


async def measure(url: str, *, cap: int | None) -> tuple[float, float, str]:
    options = HTTPOptions()
    if cap is not None and "max_line_bytes" in {f.name for f in dataclasses.fields(HTTPOptions)}:
        options = HTTPOptions(max_line_bytes=cap)  # type: ignore[call-arg]
    stalls: list[float] = []
    stop = anyio.Event()
    outcome = "ok"
    client = ChatClient(url, stream=True, options=options)
    async with client, anyio.create_task_group() as tg:
        tg.start_soon(_ticker, stalls, stop)
        await anyio.sleep(0.05)
        start = time.perf_counter()
        try:
            completion = await client.chat_completion(messages=[])
            content = completion.choices[0].message.content or ""
            outcome = f"ok ({len(content) / 1e6:.1f} MB of content)"
        except ModelServerError as exc:
            outcome = f"{type(exc).__name__}: {str(exc)[:160]}"
        elapsed = time.perf_counter() - start
        stop.set()
    return elapsed, max(stalls, default=0.0), outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 10, 40])
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    print(f"backend={args.backend}")
    print(f"{'line':>8}  {'cap':>10}  {'seconds':>8}  {'max stall ms':>12}  outcome")
    for mb in args.sizes_mb:
        size = int(mb * 1e6)
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(size)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None
            port = int(child.stdout.readline())
            url = f"http://127.0.0.1:{port}/v1"
            for cap in (None, size + 1024):
                shown = "default" if cap is None else f"{math.ceil(cap / 2**20)} MiB"
                seconds, stall, outcome = anyio.run(
                    lambda url=url, cap=cap: measure(url, cap=cap), backend=args.backend
                )
                print(f"{mb:>6g}MB  {shown:>10}  {seconds:>8.3f}  {stall * 1e3:>12.1f}  {outcome}")
        finally:
            child.kill()
            child.wait()


if __name__ == "__main__":
    main()
