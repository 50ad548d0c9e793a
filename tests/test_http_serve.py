"""The small loopback GET server behind ``serve_metrics`` and ``hermes-async view --serve``."""

from __future__ import annotations

import anyio
import httpx
import pytest

from hermes_async._http_serve import MAX_REQUEST_BYTES, serve_get

pytestmark = pytest.mark.anyio


def answer(path: str) -> tuple[str, str, bytes]:
    if path == "/":
        return "200 OK", "text/html; charset=utf-8", b"<p>hello</p>"
    return "404 Not Found", "text/plain", b"no\n"


async def test_answers_get_and_refuses_the_rest() -> None:
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_get, answer, 0)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            page = await client.get("/?x=1")
            assert (page.status_code, page.text) == (200, "<p>hello</p>")
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert (await client.get("/other")).status_code == 404
            assert (await client.post("/", content=b"x")).status_code == 405
        tg.cancel_scope.cancel("test over")


async def test_a_huge_request_head_is_not_read_further() -> None:
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_get, answer, 0)
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_REQUEST_BYTES * 4))
            reply = b""
            with anyio.fail_after(10):
                while True:
                    try:
                        reply += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break
        assert reply.startswith(b"HTTP/1.1 200 OK")
        tg.cancel_scope.cancel("test over")
