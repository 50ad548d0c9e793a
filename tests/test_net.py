"""What the HTTP users share: URL redaction, the TLS context, the httpx drain."""

from __future__ import annotations

import ssl
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given, strategies as st

from hermes_async._net import (
    REDACTED,
    aclose_httpx_stream,
    default_ssl_context,
    redact_url,
    redact_urls,
)
from hermes_async.testing import open_loopback_server


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://user:pw@host:8000/v1", f"http://{REDACTED}@host:8000/v1"),
        ("https://ghp_token@github.com/x.git", f"https://{REDACTED}@github.com/x.git"),
        ("http://u:p%40ss@h/x?y=1", f"http://{REDACTED}@h/x?y=1"),
        ("http://a:b@c@h/", f"http://{REDACTED}@h/"),  # the last @ ends the userinfo
        (
            "https://h/v1?api_key=sk-123&n=2&Token=t0k",
            f"https://h/v1?api_key={REDACTED}&n=2&Token={REDACTED}",
        ),
        (
            "https://b.s3.amazonaws.com/o?X-Amz-Signature=abc&X-Amz-Credential=AKIA/x&v=1",
            f"https://b.s3.amazonaws.com/o?X-Amz-Signature={REDACTED}"
            f"&X-Amz-Credential={REDACTED}&v=1",
        ),
        ("https://h/blob?sig=xyz#frag", f"https://h/blob?sig={REDACTED}#frag"),
        ("http://h/p?password=&flag", "http://h/p?password=&flag"),  # nothing to hide
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
        ("http://[::1]:8000/v1/chat", "http://[::1]:8000/v1/chat"),
        ("http://h/user@example.com", "http://h/user@example.com"),  # @ in the path
        ("not a url", "not a url"),
        ("", ""),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redact_urls_in_free_text() -> None:
    text = (
        "ConnectError: http://admin:hunter2@db:5432/x refused; "
        "retry 'https://h/?access_token=abc' later"
    )
    shown = redact_urls(text)
    assert "hunter2" not in shown
    assert "abc" not in shown
    assert f"http://{REDACTED}@db:5432/x refused" in shown
    assert f"'https://h/?access_token={REDACTED}' later" in shown
    assert redact_urls("no urls here") == "no urls here"


@given(
    user=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.~", min_size=1, max_size=12),
    password=st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC0123456789-_.~!$", min_size=8),
    host=st.sampled_from(["h", "127.0.0.1", "[::1]", "example.com:8443"]),
    path=st.sampled_from(["", "/", "/v1", "/v1/chat/completions"]),
)
def test_a_password_in_a_url_never_survives(user: str, password: str, host: str, path: str) -> None:
    url = f"https://{user}:{password}@{host}{path}"
    assert password not in redact_url(url)
    assert password not in redact_urls(f"failed: {url} (refused)")
    assert redact_url(url).endswith(f"@{host}{path}")


@given(st.text())
def test_redaction_never_raises(text: str) -> None:
    redact_url(text)
    redact_urls(text)


def test_one_shared_verifying_tls_context() -> None:
    context = default_ssl_context()
    assert context is default_ssl_context()
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0  # certifi's bundle at least


async def _endless(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    while True:
        await send({"type": "http.response.body", "body": b"x" * 1024, "more_body": True})
        await anyio.sleep(0.001)


@pytest.mark.anyio
async def test_aclose_httpx_stream_finishes_an_abandoned_body_under_cancellation() -> None:
    async with (
        open_loopback_server(_endless) as url,
        httpx.AsyncClient(trust_env=False) as client,
    ):
        response = await client.send(client.build_request("GET", url), stream=True)
        chunks = response.aiter_bytes()
        assert await chunks.__anext__()
        with anyio.CancelScope() as scope:
            scope.cancel("the caller gave up")
            await aclose_httpx_stream(response, chunks, what="close test response")
        assert response.is_closed
        with pytest.raises(StopAsyncIteration):  # the chain finished: nothing left suspended
            await chunks.__anext__()
