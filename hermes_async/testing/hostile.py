"""Hostile peers: a model server and a web page that attack the client's bounds on purpose.

:func:`open_hostile_server` plays one :data:`HostileCase` on every ``POST`` on loopback,
writing raw HTTP/1.1 bytes so it can break the framing itself (``GET /health`` answers 200).
A case keeps sending until the client goes away. :func:`attack` runs the client a case is
aimed at; ``python -m hermes_async.testing.hostile CASE URL --rlimit-as BYTES`` does so in a
process of its own under a memory limit. Fast wrong answers (``200 {}``, ``404``) are
:class:`~hermes_async.testing.FaultyServer`'s. docs/security.md lists the bounds crossed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Literal, get_args

import anyio
import anyio.abc

__all__ = (
    "HOSTILE_CASES",
    "POPUP_FLOOD_PAGE",
    "HostileCase",
    "HostileServer",
    "attack",
    "open_hostile_server",
)

HostileCase = Literal[
    "endless_head",
    "endless_header_line",
    "huge_content_length",
    "endless_chunked",
    "endless_close",
    "endless_error_body",
    "endless_event",
    "endless_content",
    "endless_arguments",
    "deep_json",
    "endless_tokens",
]

#: Every case, with what it sends and the bound it crosses (issue 38's row).
HOSTILE_CASES: dict[str, str] = {
    "endless_head": "W1: '200 OK', then short header lines forever (max_header_lines)",
    "endless_header_line": "W1: '200 OK', then one header line that never ends (max_head_bytes)",
    "huge_content_length": "W2: 'Content-Length: 10**11', then bytes forever (max_body_bytes)",
    "endless_chunked": "W2: a chunked body that never ends, no newline (max_body_bytes, "
    "max_line_bytes)",
    "endless_close": "W2: a body that ends at close, and never closes (max_body_bytes, "
    "max_line_bytes)",
    "endless_error_body": "W2: HTTP 500 whose chunked body never ends (read as far as the "
    "error's excerpt)",
    "endless_event": "W3: one SSE event whose 'data:' lines never end (max_event_bytes)",
    "endless_content": "W4: chat chunks of one 'content' character forever "
    "(max_completion_chars, max_chars_per_token)",
    "endless_arguments": "W4: one tool call whose argument deltas never end "
    "(max_completion_chars, max_chars_per_token)",
    "deep_json": "W5: an SSE chunk 100,000 '[' deep (a ServerProtocolError, not RecursionError)",
    "endless_tokens": "W6: vLLM token chunks forever, never a finish_reason (max_tokens)",
}

#: Bytes a case writes per send (the client's socket reads take up to 64 KiB).
_BATCH_BYTES = 64 * 2**10
#: Longest request head or body read (a test client's request is a few KB).
_MAX_REQUEST_BYTES = 16 * 2**20

_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_CONTENT_CHUNK = (
    b'data: {"id":"chatcmpl-hostile","object":"chat.completion.chunk","created":0,'
    b'"model":"hostile","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}'
    b"\n\n"
)
_CALL_OPEN = (
    b'data: {"id":"chatcmpl-hostile","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":'
    b'{"name":"terminal","arguments":""}}]},"finish_reason":null}]}\n\n'
)
_ARGUMENT_CHUNK = (
    b'data: {"id":"chatcmpl-hostile","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"tool_calls":[{"index":0,"function":{"arguments":"a"}}]},"finish_reason":null}]}'
    b"\n\n"
)
_TOKEN_CHUNK = (
    b'data: {"id":"gen-hostile","output_mode":"tokens","choices":[{"index":0,"token_ids":[11],'
    b'"logprobs":{"content":[{"token_id":11,"logprob":-0.5}]},"finish_reason":null,'
    b'"stop_reason":null}]}\n\n'
)

#: A page that opens 20 popups every 250 ms, each holding ~8 MB of JavaScript arrays and
#: opening more: what one page on an allowed host may do to the shared browser.
POPUP_FLOOD_PAGE = """<!doctype html>
<html><head><title>popups</title></head>
<body><p id="status">opening popups</p>
<script>
const hold = [];
function grow() { hold.push(new Array(1 << 20).fill(Math.random())); }
function flood() {
  for (let i = 0; i < 20; i++) {
    const w = window.open("", "_blank");
    if (w) { w.document.write("<script>const a = []; for (let i = 0; i < 8; i++) "
      + "a.push(new Array(1 << 17).fill(i));<\\/script><p>popup</p>"); }
  }
  grow();
}
setInterval(flood, 250);
flood();
</script></body></html>
"""


class HostileServer:
    """What :func:`open_hostile_server` yields.

    Attributes:
        requests: ``POST`` requests received.
        bytes_sent: Bytes written for those requests, over all connections.
        clients_gone: Connections whose client went away (closed or reset) mid-play.
    """

    def __init__(self, case: HostileCase, url: str) -> None:
        self.case = case
        self.url = url
        self.requests = 0
        self.bytes_sent = 0
        self.clients_gone = 0

    async def _serve(self, stream: anyio.abc.SocketStream) -> None:
        buffer = bytearray()
        try:
            while True:
                request = await _read_request(stream, buffer)
                if request is None:
                    return
                if request.startswith(b"GET "):
                    await self._send(stream, _response(b'{"status":"ok"}'))
                    continue
                self.requests += 1
                for data in _play(self.case):
                    await self._send(stream, data)
                return  # every case ends (if at all) by closing the connection
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self.clients_gone += 1
        finally:
            await stream.aclose()

    async def _send(self, stream: anyio.abc.SocketStream, data: bytes) -> None:
        await stream.send(data)
        self.bytes_sent += len(data)


@asynccontextmanager
async def open_hostile_server(case: HostileCase) -> AsyncIterator[HostileServer]:
    """Serve ``case`` on ``127.0.0.1`` with an ephemeral port for the block.

    Raises:
        ValueError: ``case`` is not one of :data:`HOSTILE_CASES`.
    **Cancellation**: every connection's play is cancelled and the listener closed.
    """
    if case not in get_args(HostileCase):
        raise ValueError(f"unknown hostile case {case!r}; one of: {', '.join(HOSTILE_CASES)}")
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        server = HostileServer(case, f"http://127.0.0.1:{port}")
        tg.start_soon(listener.serve, server._serve, tg)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel(reason="the hostile server's block exited")


async def _read_request(stream: anyio.abc.SocketStream, buffer: bytearray) -> bytes | None:
    """The next request's head (its body read and dropped); ``None`` when the client closed."""
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > _MAX_REQUEST_BYTES:
            raise anyio.BrokenResourceError("request head too long")
        try:
            buffer += await stream.receive()
        except anyio.EndOfStream:
            return None
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            length = min(int(value), _MAX_REQUEST_BYTES)
    buffer[:] = rest
    while len(buffer) < length:
        try:
            buffer += await stream.receive()
        except anyio.EndOfStream:
            return None
    del buffer[:length]
    return head


def _response(body: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _repeat(piece: bytes) -> Iterator[bytes]:
    """``piece`` over and over, batched to about :data:`_BATCH_BYTES` per send."""
    batch = piece * max(1, _BATCH_BYTES // len(piece))
    return itertools.repeat(batch)


def _play(case: HostileCase) -> Iterator[bytes]:
    """The bytes of ``case``, in sends (endless for every case but ``deep_json``)."""
    if case == "endless_head":
        yield b"HTTP/1.1 200 OK\r\n"
        yield from _repeat(b"x-filler: a\r\n")
    elif case == "endless_header_line":
        yield b"HTTP/1.1 200 OK\r\nx-filler: "
        yield from _repeat(b"a")
    elif case == "huge_content_length":
        yield (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n["
            % (10**11)
        )
        yield from _repeat(b"0,")
    elif case == "endless_chunked":
        yield b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        yield _chunk(b"[")
        yield from _repeat(_chunk(b"0," * 2048))
    elif case == "endless_close":
        yield b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n["
        yield from _repeat(b"0,")
    elif case == "endless_error_body":
        yield b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
        yield from _repeat(_chunk(b"error " * 1024))
    elif case == "endless_event":
        yield _SSE_HEAD + _chunk(b'data: {"choices": [\n')
        yield from _repeat(_chunk(b"data: " + b"0," * 2048 + b"\n"))
    elif case == "endless_content":
        yield _SSE_HEAD
        yield from _repeat(_chunk(_CONTENT_CHUNK * 64))
    elif case == "endless_arguments":
        yield _SSE_HEAD + _chunk(_CALL_OPEN)
        yield from _repeat(_chunk(_ARGUMENT_CHUNK * 64))
    elif case == "deep_json":
        yield _SSE_HEAD + _chunk(b"data: " + b"[" * 100_000 + b"\n\n")
        yield _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    else:  # endless_tokens
        yield _SSE_HEAD
        yield from _repeat(_chunk(_TOKEN_CHUNK * 64))


#: ``max_tokens`` of the requests :func:`attack` makes.
ATTACK_MAX_TOKENS = 16


async def attack(case: HostileCase, url: str) -> None:
    """Make the request ``case`` is aimed at, with the default client options, to ``url``.

    The clients are imported here, so ``bench/hostile.py`` can run this against another tree's
    clients. Every request asks for :data:`ATTACK_MAX_TOKENS` tokens.

    Raises:
        ModelServerError: What the client makes of the attack (the bound it crossed).
    **Cancellation**: the request is abandoned and its connection closed.
    """
    from hermes_async.inference import ChatClient, SamplingParams, VLLMGenerateClient

    messages = [{"role": "user", "content": "hello"}]
    if case in ("huge_content_length", "endless_chunked", "endless_close"):
        async with ChatClient(url) as chat:
            await chat.chat_completion(messages=messages, max_tokens=ATTACK_MAX_TOKENS)
    elif case in ("endless_content", "endless_arguments"):
        async with ChatClient(url, stream=True) as chat:
            await chat.chat_completion(messages=messages, max_tokens=ATTACK_MAX_TOKENS)
    else:
        async with VLLMGenerateClient(url) as tokens:
            await tokens.generate([1, 2, 3], SamplingParams(max_tokens=ATTACK_MAX_TOKENS))


def _peak_rss_bytes() -> int:
    """Peak resident set from ``VmHWM``: ``ru_maxrss`` counts the pre-exec parent's pages."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _main() -> None:
    parser = argparse.ArgumentParser(description="Run attack(CASE, URL) and report as JSON.")
    parser.add_argument("case", choices=list(HOSTILE_CASES))
    parser.add_argument("url")
    parser.add_argument("--rlimit-as", type=int, default=0, help="address-space limit, bytes")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after, seconds")
    parser.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    args = parser.parse_args()
    if args.rlimit_as:
        resource.setrlimit(resource.RLIMIT_AS, (args.rlimit_as, args.rlimit_as))

    async def run() -> dict[str, object]:
        import hermes_async.inference  # noqa: F401  (the import is not the attack's time)

        start = time.monotonic()
        error: BaseException | None = None
        with anyio.move_on_after(args.timeout) as scope:
            try:
                await attack(args.case, args.url)
            except Exception as exc:  # what the client raised is the result
                error = exc
        seconds = time.monotonic() - start
        if scope.cancelled_caught:
            outcome, message = "timeout", f"no error within {args.timeout:g} s"
        elif error is None:
            outcome, message = "none", "the request succeeded"
        else:
            outcome, message = type(error).__name__, str(error)[:400]
        return {
            "case": args.case,
            "error": outcome,
            "message": message,
            "seconds": round(seconds, 3),
            "peak_rss_bytes": _peak_rss_bytes(),
        }

    print(json.dumps(anyio.run(run, backend=args.backend)), flush=True)


if __name__ == "__main__":
    _main()
