"""Direct web_extract against a loopback HTTP server: HTML, huge pages, non-HTML, slow bodies,
redirect chains, concurrency under the limiter, and the optional summarizer.

Every test injects :class:`LoopbackOnlyTransport` and :class:`FakeResolver`: no DNS query and no
connection outside 127.0.0.0/8 can happen, and any attempt fails the test.
"""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from hermes_async.limits import Limits
from hermes_async.testing.fake_web import FakeResolver, LoopbackOnlyTransport
from hermes_async.testing.http import open_loopback_server
from hermes_async.tools._web_settings import SummarizerSettings, WebSettings
from hermes_async.tools.registry import ToolRegistry, ToolRuntime, dispatch
from hermes_async.tools.web import TOOLS, web_extract

pytestmark = pytest.mark.anyio

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

PAGE = """<!doctype html><html><head><title>Async &amp; Rollouts</title>
<style>body{color:red}</style><script>var secret = 1;</script></head>
<body><article><h1>Structured concurrency</h1>
<p>Every task lives in a task group. Cancellation is a value, not an accident.</p>
<p>Cleanup is shielded and bounded, so it never hangs and is never skipped.</p>
<ul><li>asyncio</li><li>trio</li></ul></article></body></html>"""


def huge_page(paragraphs: int) -> str:
    body = "".join(
        f"<p>Paragraph {i}: the quick brown fox jumps over the lazy dog number {i}.</p>\n"
        for i in range(paragraphs)
    )
    return f"<html><head><title>Huge</title></head><body><article>{body}</article></body></html>"


@dataclass
class Site:
    """A tiny ASGI web site: path -> response, with request bookkeeping."""

    pages: dict[str, tuple[int, str, bytes]] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    slow: set[str] = field(default_factory=set)
    hits: list[str] = field(default_factory=list)
    gate: Callable[[str], Awaitable[None]] | None = None
    extra_headers: dict[str, list[tuple[bytes, bytes]]] = field(default_factory=dict)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        self.hits.append(path)
        if self.gate is not None:
            await self.gate(path)
        if path in self.redirects:
            await send(
                {
                    "type": "http.response.start",
                    "status": 302,
                    "headers": [(b"location", self.redirects[path].encode())],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        if path in self.slow:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/html")],
                }
            )
            await send({"type": "http.response.body", "body": b"<html><p>first", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        status, content_type, body = self.pages.get(path, (404, "text/plain", b"not found"))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type.encode()),
                    *self.extra_headers.get(path, []),
                ],
            }
        )
        # Several chunks, as a real server streams a big page.
        step = 65536
        for start in range(0, max(len(body), 1), step):
            last = start + step >= len(body)
            await send(
                {
                    "type": "http.response.body",
                    "body": body[start : start + step],
                    "more_body": not last,
                }
            )


@asynccontextmanager
async def serve(site: Site) -> AsyncIterator[tuple[str, LoopbackOnlyTransport]]:
    transport = LoopbackOnlyTransport()
    async with open_loopback_server(site) as base_url:
        try:
            yield base_url, transport
        finally:
            await transport.aclose()
    transport.assert_no_violations()


def settings(transport: LoopbackOnlyTransport, **overrides: Any) -> WebSettings:
    values: dict[str, Any] = {
        "extract_backend": "direct",
        "allow": ("127.0.0.1",),
        "transport": transport,
        "resolver": FakeResolver(),
        "fetch_timeout": 10.0,
    }
    values.update(overrides)
    return WebSettings(**values)


async def extract(
    urls: list[str], web: WebSettings, limits: Limits | None = None
) -> list[dict[str, Any]]:
    runtime = ToolRuntime(task_id="t1", web=web, limits=limits or Limits())
    result = await web_extract({"urls": urls}, runtime)
    assert "results" in result, result
    return list(result["results"])


async def test_html_page_becomes_text_with_title() -> None:
    site = Site(pages={"/page": (200, "text/html; charset=utf-8", PAGE.encode())})
    async with serve(site) as (base, transport):
        [page] = await extract([f"{base}/page"], settings(transport))
    assert page["error"] is None
    assert page["url"] == f"{base}/page"
    assert page["title"] == "Async & Rollouts"
    assert "Every task lives in a task group." in page["content"]
    assert "var secret" not in page["content"] and "color:red" not in page["content"]


async def test_basic_extractor_keeps_structure() -> None:
    site = Site(pages={"/page": (200, "text/html", PAGE.encode())})
    async with serve(site) as (base, transport):
        [page] = await extract([f"{base}/page"], settings(transport, html_extractor="basic"))
    assert "# Structured concurrency" in page["content"]
    assert "- asyncio" in page["content"] and "- trio" in page["content"]
    assert "var secret" not in page["content"]


async def test_dispatch_by_name_returns_reference_shape() -> None:
    site = Site(pages={"/page": (200, "text/html", PAGE.encode())})
    async with serve(site) as (base, transport):
        runtime = ToolRuntime(task_id="t1", web=settings(transport))
        outcome = await dispatch(
            "web_extract",
            json.dumps({"urls": [f"{base}/page"]}),
            runtime,
            registry=ToolRegistry(TOOLS),
        )
    assert outcome.error is None
    body = json.loads(outcome.content)
    assert list(body) == ["results"]
    assert set(body["results"][0]) == {"url", "title", "content", "error"}


async def test_huge_page_is_cut_with_head_and_tail_note() -> None:
    html = huge_page(3000).encode()  # ~230 KB of HTML, ~200 KB of text
    site = Site(pages={"/huge": (200, "text/html", html)})
    async with serve(site) as (base, transport):
        [page] = await extract(
            [f"{base}/huge"], settings(transport, max_content_chars=5000, html_extractor="basic")
        )
    content = page["content"]
    assert page["error"] is None
    assert len(content) < 5300
    assert "Paragraph 0:" in content  # head
    assert "Paragraph 2999:" in content  # tail
    assert "Paragraph 1500:" not in content  # middle dropped
    assert "characters omitted from the middle of this page" in content


async def test_body_over_the_byte_cap_is_not_downloaded() -> None:
    html = huge_page(20000).encode()  # ~1.5 MB
    site = Site(pages={"/huge": (200, "text/html", html)})
    async with serve(site) as (base, transport):
        [page] = await extract(
            [f"{base}/huge"],
            settings(transport, max_body_bytes=100_000, max_content_chars=1_000_000),
        )
    assert page["error"] is None
    assert (
        "[page truncated: only the first 100,000 bytes were downloaded (max_body_bytes)]"
        in page["content"]
    )
    assert "Paragraph 19999" not in page["content"]
    assert len(page["content"]) < 110_000


async def test_large_page_converted_with_trafilatura_off_loop() -> None:
    pytest.importorskip("trafilatura")
    html = huge_page(6000).encode()  # > 256 000 characters: converted in a worker thread
    site = Site(pages={"/huge": (200, "text/html", html)})
    async with serve(site) as (base, transport):
        [page] = await extract([f"{base}/huge"], settings(transport, html_extractor="trafilatura"))
    assert page["error"] is None
    assert page["title"] == "Huge"
    assert "Paragraph 0:" in page["content"]


async def test_non_html_body_is_refused_and_text_is_returned() -> None:
    site = Site(
        pages={
            "/image.png": (200, "image/png", b"\x89PNG\r\n\x1a\n" + bytes(range(256))),
            "/notes.txt": (200, "text/plain; charset=utf-8", "plain text: ünïcode".encode()),
            "/data.json": (200, "application/json", b'{"a": 1}'),
            "/blob": (200, "", b"\x00\x01\x02binary"),
        }
    )
    async with serve(site) as (base, transport):
        png, txt, data, blob = await extract(
            [f"{base}/image.png", f"{base}/notes.txt", f"{base}/data.json", f"{base}/blob"],
            settings(transport),
        )
    assert "unsupported content type 'binary data without a content type'" in blob["error"]
    assert png["content"] is None
    assert "unsupported content type 'image/png'" in png["error"]
    assert txt == {
        "url": f"{base}/notes.txt",
        "title": None,
        "content": "plain text: ünïcode",
        "error": None,
    }
    assert data["content"] == '{"a": 1}'


async def test_slow_body_times_out_with_clear_error() -> None:
    site = Site(slow={"/slow"}, pages={"/ok": (200, "text/plain", b"fine")})
    async with serve(site) as (base, transport):
        start = anyio.current_time()
        slow, ok = await extract(
            [f"{base}/slow", f"{base}/ok"], settings(transport, fetch_timeout=0.5)
        )
        elapsed = anyio.current_time() - start
    assert slow["content"] is None
    assert "took longer than 0.5 seconds" in slow["error"]
    assert ok["content"] == "fine"  # one slow page does not fail the others
    assert elapsed < 5


async def test_redirect_chain_is_followed_and_bounded() -> None:
    site = Site(
        redirects={"/a": "/b", "/b": "/c", "/c": "/final", "/loop": "/loop"},
        pages={"/final": (200, "text/plain", b"arrived")},
    )
    async with serve(site) as (base, transport):
        ok, loop = await extract(
            [f"{base}/a", f"{base}/loop"], settings(transport, max_redirects=3)
        )
        [too_long] = await extract([f"{base}/a"], settings(transport, max_redirects=2))
    assert ok["content"] == "arrived" and ok["error"] is None
    assert "too many redirects" in loop["error"] and "more than 3" in loop["error"]
    assert "too many redirects" in too_long["error"]
    assert site.hits.count("/loop") == 4  # the first request and 3 redirects


async def test_compressed_body_is_decoded_within_the_byte_cap() -> None:
    # The server compresses although identity was asked for: 100 MB of zeros in ~100 KB.
    bomb = gzip.compress(bytes(100_000_000), 9)
    text = "compressed text ü " * 100
    deflated = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)  # raw, no zlib header
    raw_deflate = deflated.compress(text.encode()) + deflated.flush()
    site = Site(
        pages={
            "/bomb": (200, "text/plain", bomb),
            "/gz": (200, "text/plain; charset=utf-8", gzip.compress(text.encode())),
            "/deflate": (200, "text/plain; charset=utf-8", raw_deflate),
            "/corrupt": (200, "text/plain", b"not gzip at all"),
            "/br": (200, "text/plain", b"\x1b\x00"),
        },
        extra_headers={
            "/bomb": [(b"content-encoding", b"gzip")],
            "/gz": [(b"content-encoding", b"gzip")],
            "/deflate": [(b"content-encoding", b"deflate")],
            "/corrupt": [(b"content-encoding", b"gzip")],
            "/br": [(b"content-encoding", b"br")],
        },
    )
    async with serve(site) as (base, transport):
        web = settings(transport, max_body_bytes=1_000_000, max_content_chars=200)
        tracemalloc.start()
        try:
            [bombed] = await extract([f"{base}/bomb"], web)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        gz, deflate, corrupt, br = await extract(
            [f"{base}/gz", f"{base}/deflate", f"{base}/corrupt", f"{base}/br"],
            settings(transport),
        )
    assert bombed["error"] is None
    assert bombed["content"].endswith("the first 1,000,000 bytes were downloaded (max_body_bytes)]")
    assert peak < 20_000_000, peak  # a few times the cap, not the 100 MB it inflates to
    assert gz["content"] == text and deflate["content"] == text
    assert "its gzip data is corrupt" in corrupt["error"]
    assert "Content-Encoding 'br'" in br["error"]


async def test_charset_that_is_not_a_text_encoding_falls_back_to_utf8() -> None:
    site = Site(
        pages={
            "/rot13": (200, "text/html; charset=rot13", b"<p>caf\xc3\xa9</p>"),
            "/idna": (200, "text/plain; charset=idna", b"caf\xc3\xa9 \xff"),
            "/meta": (200, "text/html", b"<meta charset=base64><p>caf\xc3\xa9</p>"),
        }
    )
    async with serve(site) as (base, transport):
        rot13, idna, meta = await extract(
            [f"{base}/rot13", f"{base}/idna", f"{base}/meta"],
            settings(transport, html_extractor="basic"),
        )
    assert rot13["content"] == "café" and meta["content"] == "café"
    assert idna["content"] == "café \ufffd"


async def test_redirect_to_a_location_that_is_no_url_is_a_page_error() -> None:
    site = Site(redirects={"/js": "javascript:alert(1)", "/mail": "mailto:a@example.com"})
    async with serve(site) as (base, transport):
        js, mail = await extract([f"{base}/js", f"{base}/mail"], settings(transport))
    assert js["content"] is None and mail["content"] is None
    assert js["error"].startswith(f"could not fetch '{base}/js': InvalidURL")
    assert mail["error"].startswith(f"could not fetch '{base}/mail': InvalidURL")


@pytest.mark.parametrize(
    "body",
    [
        b"<title>" * 28_000,  # never closed: the title search must not be quadratic
        b"<html><body>" + b"<a" * 100_000,  # a tag never ended
        b"<html><body><p>text</p>" + b"<!--" * 60_000,  # a comment never closed
    ],
    ids=["titles", "tags", "comments"],
)
async def test_pathological_html_is_converted_in_linear_time(body: bytes) -> None:
    # Under 256 000 characters: converted on the event loop, so it must be fast.
    site = Site(pages={"/p": (200, "text/html", body)})
    async with serve(site) as (base, transport):
        for extractor in ("basic", "auto"):
            start = time.monotonic()
            [page] = await extract([f"{base}/p"], settings(transport, html_extractor=extractor))
            assert time.monotonic() - start < 3, extractor
            assert page["error"] is None


async def test_http_error_status_is_a_page_error() -> None:
    site = Site()
    async with serve(site) as (base, transport):
        [page] = await extract([f"{base}/missing"], settings(transport))
    assert page["content"] is None
    assert page["error"] == f"'{base}/missing' answered HTTP 404 Not Found"


async def test_only_five_urls_and_fetched_concurrently_under_web_limiter() -> None:
    arrived = 0
    peak = 0
    all_in = anyio.Event()

    async def gate(path: str) -> None:
        nonlocal arrived, peak
        arrived += 1
        peak = max(peak, arrived)
        if arrived == 3:
            all_in.set()
        # Each request waits until three are in flight at once: only concurrent fetching
        # gets past this, and the limiter (3 slots) keeps a fourth from joining.
        with anyio.fail_after(10):
            await all_in.wait()
        await anyio.sleep(0.05)
        arrived -= 1

    site = Site(
        pages={f"/p{i}": (200, "text/plain", f"page {i}".encode()) for i in range(7)}, gate=gate
    )
    limits = Limits(web=3)
    async with serve(site) as (base, transport):
        results = await extract([f"{base}/p{i}" for i in range(7)], settings(transport), limits)
    assert [r["content"] for r in results] == [f"page {i}" for i in range(5)]
    assert sorted(site.hits) == [f"/p{i}" for i in range(5)]
    assert peak == 3
    assert limits["web"].statistics().acquisitions == 5


def chat_server(replies: list[dict[str, Any]], status: int = 200) -> Callable[..., Awaitable[None]]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        message = await receive()
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        replies.append(
            {"path": scope["path"], "headers": headers, "body": json.loads(message["body"])}
        )
        body = json.dumps(
            {
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "A short summary."}}
                ]
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


async def test_long_page_is_summarized_by_configured_chat_server() -> None:
    site = Site(pages={"/long": (200, "text/plain", ("word " * 3000).encode())})
    calls: list[dict[str, Any]] = []
    async with serve(site) as (base, transport), open_loopback_server(chat_server(calls)) as chat:
        summarizer = SummarizerSettings(
            base_url=f"{chat}/v1", model="tiny-model", api_key="sk-summ-secret"
        )
        [page] = await extract([f"{base}/long"], settings(transport, summarizer=summarizer))
    assert page["content"] == "[Summary of a 15,000-character page]\n\nA short summary."
    [call] = calls
    assert call["path"] == "/v1/chat/completions"
    assert call["headers"]["authorization"] == "Bearer sk-summ-secret"
    assert call["body"]["model"] == "tiny-model"
    assert "word word" in call["body"]["messages"][0]["content"]


async def test_summarizer_failure_falls_back_to_cut_and_hides_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    site = Site(pages={"/long": (200, "text/plain", ("word " * 3000).encode())})
    calls: list[dict[str, Any]] = []
    async with (
        serve(site) as (base, transport),
        open_loopback_server(chat_server(calls, status=500)) as chat,
    ):
        summarizer = SummarizerSettings(base_url=f"{chat}/v1", model="m", api_key="sk-summ-secret")
        [page] = await extract(
            [f"{base}/long"], settings(transport, summarizer=summarizer, max_content_chars=1000)
        )
    assert page["error"] is None
    assert "characters omitted from the middle" in page["content"]
    assert len(calls) == 1
    assert "summarizer failed" in caplog.text
    assert "sk-summ-secret" not in caplog.text


async def test_short_page_is_not_summarized() -> None:
    site = Site(pages={"/short": (200, "text/plain", b"tiny")})
    calls: list[dict[str, Any]] = []
    async with serve(site) as (base, transport), open_loopback_server(chat_server(calls)) as chat:
        summarizer = SummarizerSettings(base_url=f"{chat}/v1", model="m")
        [page] = await extract([f"{base}/short"], settings(transport, summarizer=summarizer))
    assert page["content"] == "tiny"
    assert calls == []


async def test_charset_from_meta_tag() -> None:
    html = '<html><head><meta charset="iso-8859-1"><title>Caf\xe9</title></head><body><p>Cr\xe8me br\xfbl\xe9e</p></body></html>'
    site = Site(pages={"/latin": (200, "text/html", html.encode("latin-1"))})
    async with serve(site) as (base, transport):
        [page] = await extract([f"{base}/latin"], settings(transport, html_extractor="basic"))
    assert page["title"] == "Café"
    assert "Crème brûlée" in page["content"]


async def test_cancellation_during_slow_fetch_propagates_and_leaks_nothing() -> None:
    site = Site(slow={"/slow"})
    async with serve(site) as (base, transport):
        web = settings(transport, fetch_timeout=30)
        with anyio.move_on_after(0.5) as scope:
            await extract([f"{base}/slow"], web)
        assert scope.cancelled_caught
    assert site.hits == ["/slow"]
