"""Web tool registration, availability, settings and the pure helpers (no network at all)."""

from __future__ import annotations

import sys

import pytest

from hermes_async.errors import ConfigError
from hermes_async.tools._html import basic_html_to_text, cut_head_tail, html_to_text
from hermes_async.tools._web_providers import redact
from hermes_async.tools._web_settings import SummarizerSettings, WebSettings
from hermes_async.tools.registry import (
    ToolRegistry,
    ToolRuntime,
    builtin_registry,
    get_tool_definitions,
)
from hermes_async.tools.web import TOOLS, WEB_EXTRACT_TOOL, WEB_SEARCH_TOOL, web_extract

WEB_ENV = [
    "FIRECRAWL_API_KEY",
    "FIRECRAWL_API_URL",
    "TAVILY_API_KEY",
    "TAVILY_BASE_URL",
    "EXA_API_KEY",
    "EXA_BASE_URL",
    "HERMES_WEB_BACKEND",
    "HERMES_WEB_EXTRACT_BACKEND",
    "HERMES_WEB_DIRECT_EXTRACT",
    "HERMES_WEB_ALLOW",
    "HERMES_WEB_SUMMARIZER_URL",
    "HERMES_WEB_SUMMARIZER_MODEL",
    "HERMES_WEB_SUMMARIZER_API_KEY",
]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in WEB_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_schemas_follow_the_reference() -> None:
    assert WEB_SEARCH_TOOL.schema["function"]["name"] == "web_search"
    assert WEB_SEARCH_TOOL.parameters["required"] == ["query"]
    assert WEB_SEARCH_TOOL.parameters["properties"]["query"]["type"] == "string"
    urls = WEB_EXTRACT_TOOL.parameters["properties"]["urls"]
    assert urls["type"] == "array" and urls["items"] == {"type": "string"} and urls["maxItems"] == 5
    assert WEB_EXTRACT_TOOL.parameters["required"] == ["urls"]
    assert {t.toolset for t in TOOLS} == {"web"}


def test_builtin_registry_has_the_web_tools() -> None:
    registry = builtin_registry()
    assert "web_search" in registry and "web_extract" in registry


def test_web_toolset_offered_only_with_a_provider_key(clean_env: pytest.MonkeyPatch) -> None:
    registry = ToolRegistry(TOOLS)
    assert get_tool_definitions(["web"], registry=registry).valid_names == set()
    clean_env.setenv("TAVILY_API_KEY", "tvly-x")
    assert get_tool_definitions(["web"], registry=registry).valid_names == {
        "web_search",
        "web_extract",
    }


def test_direct_extract_option_offers_web_extract_alone(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HERMES_WEB_DIRECT_EXTRACT", "1")
    names = get_tool_definitions(["web"], registry=ToolRegistry(TOOLS)).valid_names
    assert names == {"web_extract"}


def test_self_hosted_firecrawl_url_counts_as_configured(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FIRECRAWL_API_URL", "http://firecrawl.internal:3002")
    assert WEB_SEARCH_TOOL.is_available()


def test_bad_env_hides_the_tools_with_a_warning(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("TAVILY_API_KEY", "tvly-x")
    clean_env.setenv("HERMES_WEB_BACKEND", "bing")
    assert not WEB_SEARCH_TOOL.is_available()
    assert (
        "HERMES_WEB_BACKEND='bing' is not a web backend; available: firecrawl, tavily, exa"
        in caplog.text
    )


def test_from_env_reads_everything(clean_env: pytest.MonkeyPatch) -> None:
    env = {
        "EXA_API_KEY": "exa-k",
        "EXA_BASE_URL": "http://127.0.0.1:9/",
        "HERMES_WEB_BACKEND": "Exa",
        "HERMES_WEB_EXTRACT_BACKEND": "direct",
        "HERMES_WEB_ALLOW": " intranet.local, 10.0.0.0/8 ,",
        "HERMES_WEB_SUMMARIZER_URL": "http://127.0.0.1:8000/v1",
        "HERMES_WEB_SUMMARIZER_MODEL": "qwen",
        "HERMES_WEB_SUMMARIZER_API_KEY": "sk-s",
    }
    web = WebSettings.from_env(env)
    assert web.provider() == "exa" and web.search_available()
    assert web.base_url("exa") == "http://127.0.0.1:9"
    assert web.extract_provider() is None  # direct
    assert web.allow == ("intranet.local", "10.0.0.0/8")
    assert web.summarizer == SummarizerSettings("http://127.0.0.1:8000/v1", "qwen", "sk-s")
    assert set(web.secrets()) == {"exa-k", "sk-s"}


def test_from_env_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="HERMES_WEB_SUMMARIZER_MODEL is not"):
        WebSettings.from_env({"HERMES_WEB_SUMMARIZER_URL": "http://x/v1"})
    with pytest.raises(ConfigError, match="HERMES_WEB_EXTRACT_BACKEND='sometimes' is invalid"):
        WebSettings.from_env({"HERMES_WEB_EXTRACT_BACKEND": "sometimes"})


def test_provider_order_and_extract_routing() -> None:
    assert WebSettings(exa_api_key="e", tavily_api_key="t").provider() == "tavily"
    assert (
        WebSettings(exa_api_key="e", tavily_api_key="t", firecrawl_api_key="f").provider()
        == "firecrawl"
    )
    assert WebSettings().provider() is None
    assert WebSettings(exa_api_key="e").extract_provider() == "exa"
    assert WebSettings(direct_extract=True).extract_provider() is None
    assert WebSettings(exa_api_key="e", extract_backend="direct").extract_provider() is None


def test_settings_repr_hides_every_key() -> None:
    web = WebSettings(
        firecrawl_api_key="fc-hidden-1",
        tavily_api_key="tvly-hidden-2",
        exa_api_key="exa-hidden-3",
        summarizer=SummarizerSettings("http://s/v1", "m", api_key="sk-hidden-4"),
    )
    text = repr(web) + str(web)
    for secret in ("fc-hidden-1", "tvly-hidden-2", "exa-hidden-3", "sk-hidden-4"):
        assert secret not in text
    assert "tavily_url='https://api.tavily.com'" in text


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("backend", "bing", "unknown web backend 'bing'; available: firecrawl, tavily, exa"),
        ("max_body_bytes", 0, r"WebSettings\.max_body_bytes must be an integer >= 1, got 0"),
        ("fetch_timeout", 0, r"WebSettings\.fetch_timeout must be > 0"),
        ("html_extractor", "regex", "unknown html_extractor 'regex'"),
    ],
)
def test_invalid_settings_are_config_errors(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WebSettings(**{field: value})  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_extract_argument_errors() -> None:
    runtime = ToolRuntime(task_id="t", web=WebSettings(direct_extract=True))
    assert await web_extract({"urls": []}, runtime) == {
        "error": "Error extracting content: 'urls' must be a non-empty list of URLs"
    }
    missing = ToolRuntime(task_id="t", web=WebSettings(extract_backend="provider"))
    result = await web_extract({"urls": ["https://a.example/"]}, missing)
    assert result == {
        "error": "Error extracting content: web backend 'firecrawl' is selected but FIRECRAWL_API_KEY is not set"
    }


# --------------------------------------------------------------------------------------------
# Pure helpers


def test_cut_head_tail() -> None:
    text = "".join(f"{i:05d}" for i in range(2000))  # 10 000 chars
    cut, was_cut = cut_head_tail(text, 1000)
    assert was_cut
    assert cut.startswith(text[:700]) and cut.endswith(text[-300:])
    assert (
        "[... 9,000 characters omitted from the middle of this page (10,000 characters in total) ...]"
        in cut
    )
    assert cut_head_tail("short", 1000) == ("short", False)


def test_basic_converter() -> None:
    html = (
        "<html><head><title>x</title><style>p{}</style></head><body>"
        "<h2>Title</h2><p>Hello <b>bold</b>&nbsp;world &amp; more</p>"
        "<script>alert(1)</script><pre>a\n  b</pre><table><tr><td>1</td><td>2</td></tr></table>"
        "</body></html>"
    )
    text = basic_html_to_text(html)
    assert "## Title" in text
    assert "Hello bold world & more" in text
    assert "alert" not in text and "p{}" not in text
    assert "```\na\n  b\n```" in text
    assert "| 1 | 2" in text


def test_trafilatura_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "trafilatura", None)  # import now raises ImportError
    with pytest.raises(
        ConfigError, match=r"install the web extra: pip install 'hermes-async\[web\]'"
    ):
        html_to_text("<p>x</p>", extractor="trafilatura")
    title, text = html_to_text("<title>T</title><p>fallback works</p>", extractor="auto")
    assert (title, text) == ("T", "fallback works")


def test_trafilatura_crash_falls_back_to_basic(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    trafilatura = pytest.importorskip("trafilatura")

    def boom(*args: object, **kwargs: object) -> str:
        raise RecursionError("deeply nested markup")

    monkeypatch.setattr(trafilatura, "extract", boom)
    title, text = html_to_text("<title>T</title><p>still readable</p>", url="http://x/")
    assert (title, text) == ("T", "still readable")
    assert "trafilatura failed on http://x/ (RecursionError" in caplog.text


def test_redact() -> None:
    assert (
        redact("key abc123 and abc123456", ["abc123", "abc123456"])
        == "key [REDACTED] and [REDACTED]"
    )
    assert redact("nothing", []) == "nothing"
