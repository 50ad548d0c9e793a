"""Configuration of the web tools: providers, keys, fetch guard, caps and the optional summarizer.

One :class:`WebSettings` travels on ``ToolRuntime.web``; when it is ``None`` the tools read
:meth:`WebSettings.from_env` on every call. API keys live only here: ``repr()`` never shows
them, and the tools redact them from every error.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import httpx

from hermes_async._checks import INTEGER_AT_LEAST_ONE, POSITIVE, check_fields
from hermes_async.errors import ConfigError

__all__ = (
    "PROVIDER_KEY_ENV",
    "PROVIDER_ORDER",
    "Provider",
    "Resolver",
    "SummarizerSettings",
    "WebSettings",
    "allow_list_from_env",
    "check_allow_entry",
    "env_reader",
    "model_endpoint_from_env",
)

#: A web provider this package can talk to.
Provider = Literal["firecrawl", "tavily", "exa"]

#: Where ``web_extract`` gets pages: ``auto`` = the provider if one is configured, else direct.
_ExtractBackend = Literal["auto", "provider", "direct"]

#: The reference's preference order when no backend is chosen explicitly (its "parallel"
#: provider is not implemented here).
PROVIDER_ORDER: tuple[Provider, ...] = ("firecrawl", "tavily", "exa")

#: Environment variable holding each provider's API key.
PROVIDER_KEY_ENV: Mapping[Provider, str] = {
    "firecrawl": "FIRECRAWL_API_KEY",
    "tavily": "TAVILY_API_KEY",
    "exa": "EXA_API_KEY",
}

#: Public base URL of each provider's HTTP API.
_DEFAULT_PROVIDER_URLS: Mapping[Provider, str] = {
    "firecrawl": "https://api.firecrawl.dev",
    "tavily": "https://api.tavily.com",
    "exa": "https://api.exa.ai",
}

_URL_ENV: Mapping[Provider, str] = {
    "firecrawl": "FIRECRAWL_API_URL",
    "tavily": "TAVILY_BASE_URL",
    "exa": "EXA_BASE_URL",
}

#: ``async (host, port) -> [ip, ...]``: how the SSRF guard resolves host names. The default is
#: :func:`anyio.getaddrinfo`; tests inject a fake so that no real DNS query is made.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class SummarizerSettings:
    """An OpenAI-compatible chat server that summarizes pages longer than ``min_chars``.

    When it fails, the page is cut (head + tail) instead.

    Attributes:
        base_url: The server's OpenAI base URL, ending in ``/v1``.
        max_input_chars: Longer pages are cut (head + tail) before being sent.
    """

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 60.0
    min_chars: int = 5_000
    max_input_chars: int = 100_000
    max_output_chars: int = 5_000


@dataclass(frozen=True, slots=True)
class WebSettings:
    """How the web tools search and fetch.

    ``backend`` picks the provider, else the first configured in :data:`PROVIDER_ORDER`.
    ``extract_backend="direct"`` (or ``"auto"`` with no provider) fetches pages directly.

    Attributes:
        allow: Hosts (exact, or ``.suffix``) and IP networks the SSRF guard lets through.
        max_concurrent_fetches: Concurrency cap of one extract call without a ``web`` limiter.
        max_body_bytes: Bytes of a directly fetched body kept, after decompression.
        html_extractor: ``auto`` (trafilatura if installed), ``trafilatura`` or ``basic``.
        trust_env: Use the environment's proxies for provider and summarizer requests. Never
            for direct fetches: a proxy would resolve the host itself and defeat the pinning.
        transport: httpx transport for every outgoing request; its owner closes it.
    """

    backend: Provider | None = None
    firecrawl_api_key: str | None = field(default=None, repr=False)
    tavily_api_key: str | None = field(default=None, repr=False)
    exa_api_key: str | None = field(default=None, repr=False)
    firecrawl_url: str = _DEFAULT_PROVIDER_URLS["firecrawl"]
    tavily_url: str = _DEFAULT_PROVIDER_URLS["tavily"]
    exa_url: str = _DEFAULT_PROVIDER_URLS["exa"]
    extract_backend: _ExtractBackend = "auto"
    direct_extract: bool = False
    allow: tuple[str, ...] = ()
    search_limit: int = 5
    max_concurrent_fetches: int = 5
    request_timeout: float = 30.0
    fetch_timeout: float = 20.0
    max_redirects: int = 5
    max_body_bytes: int = 2_000_000
    max_content_chars: int = 20_000
    html_extractor: Literal["auto", "trafilatura", "basic"] = "auto"
    user_agent: str = "hermes-async/0.1 (web_extract)"
    summarizer: SummarizerSettings | None = None
    trust_env: bool = True
    transport: httpx.AsyncBaseTransport | None = field(default=None, repr=False, compare=False)
    resolver: Resolver | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in PROVIDER_ORDER:
            raise ConfigError(
                f"unknown web backend {self.backend!r}; available: {', '.join(PROVIDER_ORDER)}"
            )
        if self.extract_backend not in ("auto", "provider", "direct"):
            raise ConfigError(
                f"unknown web extract backend {self.extract_backend!r}; "
                "available: auto, provider, direct"
            )
        if self.html_extractor not in ("auto", "trafilatura", "basic"):
            raise ConfigError(
                f"unknown html_extractor {self.html_extractor!r}; available: auto, trafilatura, basic"
            )
        check_fields(
            self, ("search_limit", "max_concurrent_fetches", "max_body_bytes"), INTEGER_AT_LEAST_ONE
        )
        if self.max_content_chars < 200:
            raise ConfigError(
                f"WebSettings.max_content_chars must be >= 200, got {self.max_content_chars!r}"
            )
        if self.max_redirects < 0:
            raise ConfigError(f"WebSettings.max_redirects must be >= 0, got {self.max_redirects!r}")
        check_fields(self, ("request_timeout", "fetch_timeout"), POSITIVE)
        for entry in self.allow:
            check_allow_entry(entry)

    # ----------------------------------------------------------------------------------------
    # Provider selection

    def api_key(self, provider: Provider) -> str | None:
        """The configured key of ``provider`` (``None`` when unset or empty)."""
        key = {
            "firecrawl": self.firecrawl_api_key,
            "tavily": self.tavily_api_key,
            "exa": self.exa_api_key,
        }[provider]
        return key or None

    def base_url(self, provider: Provider) -> str:
        """The API base URL of ``provider``, without a trailing slash."""
        url = {"firecrawl": self.firecrawl_url, "tavily": self.tavily_url, "exa": self.exa_url}
        return url[provider].rstrip("/")

    def is_configured(self, provider: Provider) -> bool:
        """Whether ``provider`` can be used: it has a key (or is a self-hosted Firecrawl)."""
        if self.api_key(provider):
            return True
        return provider == "firecrawl" and self.base_url("firecrawl") != _DEFAULT_PROVIDER_URLS[
            "firecrawl"
        ].rstrip("/")

    def provider(self) -> Provider | None:
        """The provider to use: ``backend`` if set, else the first configured."""
        if self.backend is not None:
            return self.backend
        for name in PROVIDER_ORDER:
            if self.is_configured(name):
                return name
        return None

    def search_available(self) -> bool:
        """Whether ``web_search`` should be offered (a provider is configured)."""
        provider = self.provider()
        return provider is not None and self.is_configured(provider)

    def extract_available(self) -> bool:
        """Whether ``web_extract`` should be offered (a provider, or direct extraction enabled)."""
        if self.extract_backend == "direct":
            return True
        return self.search_available() or self.direct_extract

    def extract_provider(self) -> Provider | None:
        """The provider ``web_extract`` goes through, or ``None`` for direct fetches."""
        if self.extract_backend == "direct":
            return None
        if self.extract_backend == "provider":
            return self.provider() or PROVIDER_ORDER[0]
        return self.provider() if self.search_available() else None

    def secrets(self) -> tuple[str, ...]:
        values = [self.firecrawl_api_key, self.tavily_api_key, self.exa_api_key]
        if self.summarizer is not None:
            values.append(self.summarizer.api_key)
        return tuple(v for v in values if v)

    # ----------------------------------------------------------------------------------------
    # Construction

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WebSettings:
        """Build settings from environment variables.

        Reads ``FIRECRAWL_API_KEY`` / ``_URL``, ``TAVILY_API_KEY``, ``TAVILY_BASE_URL``,
        ``EXA_API_KEY``, ``EXA_BASE_URL``, ``HERMES_WEB_BACKEND`` (firecrawl, tavily or exa),
        ``HERMES_WEB_EXTRACT_BACKEND`` (auto, provider or direct), ``HERMES_WEB_DIRECT_EXTRACT=1``,
        ``HERMES_WEB_ALLOW`` (comma-separated hosts and CIDRs) and
        ``HERMES_WEB_SUMMARIZER_URL`` / ``_MODEL`` / ``_API_KEY``.

        Raises:
            ConfigError: An invalid value (unknown backend, bad allow entry, URL without a model).
        """
        get = env_reader(environ)
        backend = get("HERMES_WEB_BACKEND")
        if backend is not None:
            backend = backend.lower()
            if backend not in PROVIDER_ORDER:
                raise ConfigError(
                    f"HERMES_WEB_BACKEND={backend!r} is not a web backend; "
                    f"available: {', '.join(PROVIDER_ORDER)}"
                )
        extract_backend = (get("HERMES_WEB_EXTRACT_BACKEND") or "auto").lower()
        if extract_backend not in ("auto", "provider", "direct"):
            raise ConfigError(
                f"HERMES_WEB_EXTRACT_BACKEND={extract_backend!r} is invalid; "
                "available: auto, provider, direct"
            )
        summarizer = None
        if endpoint := model_endpoint_from_env(get, "HERMES_WEB_SUMMARIZER", "the summarizer"):
            url, model, key = endpoint
            summarizer = SummarizerSettings(base_url=url, model=model, api_key=key)
        return cls(
            backend=backend,
            firecrawl_api_key=get(PROVIDER_KEY_ENV["firecrawl"]),
            tavily_api_key=get(PROVIDER_KEY_ENV["tavily"]),
            exa_api_key=get(PROVIDER_KEY_ENV["exa"]),
            firecrawl_url=get(_URL_ENV["firecrawl"]) or _DEFAULT_PROVIDER_URLS["firecrawl"],
            tavily_url=get(_URL_ENV["tavily"]) or _DEFAULT_PROVIDER_URLS["tavily"],
            exa_url=get(_URL_ENV["exa"]) or _DEFAULT_PROVIDER_URLS["exa"],
            extract_backend=cast(_ExtractBackend, extract_backend),
            direct_extract=(get("HERMES_WEB_DIRECT_EXTRACT") or "").lower() in _TRUE,
            allow=allow_list_from_env(get, "HERMES_WEB_ALLOW"),
            summarizer=summarizer,
        )


def check_allow_entry(entry: str, owner: str = "WebSettings") -> None:
    """Raise :class:`ConfigError` unless ``entry`` is a host name or a CIDR network."""
    if not isinstance(entry, str) or not entry.strip():
        raise ConfigError(f"{owner}.allow entries must be non-empty strings, got {entry!r}")
    if "/" in entry:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError as exc:
            raise ConfigError(
                f"{owner}.allow entry {entry!r} is neither a host name nor a valid CIDR "
                f"network: {exc}"
            ) from None


def env_reader(environ: Mapping[str, str] | None = None) -> Callable[[str], str | None]:
    """A lookup in ``environ``: the stripped value, ``None`` when unset or blank."""
    env = os.environ if environ is None else environ

    def get(name: str) -> str | None:
        return env.get(name, "").strip() or None

    return get


def allow_list_from_env(get: Callable[[str], str | None], name: str) -> tuple[str, ...]:
    """The comma-separated entries of variable ``name`` (blanks dropped)."""
    return tuple(part.strip() for part in (get(name) or "").split(",") if part.strip())


def model_endpoint_from_env(
    get: Callable[[str], str | None], prefix: str, what: str
) -> tuple[str, str, str | None] | None:
    """``(base_url, model, api_key)`` from ``{prefix}_URL`` / ``_MODEL`` / ``_API_KEY``, or None.

    Raises:
        ConfigError: A URL without a model.
    """
    url = get(f"{prefix}_URL")
    if url is None:
        return None
    model = get(f"{prefix}_MODEL")
    if model is None:
        raise ConfigError(
            f"{prefix}_URL is set but {prefix}_MODEL is not; "
            f"set the name {what} server serves the model under"
        )
    return url, model, get(f"{prefix}_API_KEY")
