"""Configuration of the browser tools, and where the Chromium executable comes from.

One :class:`BrowserSettings` configures one :class:`~hermes_async.tools.browser.BrowserManager`.
The browser is never downloaded: it is Debian's ``chromium`` (``scripts/browser/install.sh``)
or one the operator points to. Chromium resolves no name itself, so every request of the page
goes through the SSRF guard (docs/decisions/028-browser-network.md); :data:`_BASE_ARGS` says
why each flag is there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from hermes_async._checks import INTEGER_AT_LEAST_ONE, POSITIVE_SECONDS, check_fields
from hermes_async.errors import ConfigError
from hermes_async.tools._web_settings import (
    Resolver,
    WebSettings,
    allow_list_from_env,
    check_allow_entry,
    env_reader,
    model_endpoint_from_env,
)

__all__ = (
    "DEFAULT_IDLE_TIMEOUT_SECONDS",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SNAPSHOT_MAX_CHARS",
    "INSTALL_HINT",
    "BrowserSettings",
    "VisionSettings",
    "chromium_args",
    "find_chromium",
    "launch_environment",
)

#: Environment variable naming the Chromium executable.
_EXECUTABLE_ENV = "HERMES_BROWSER_EXECUTABLE"

#: Where Chromium is looked for, in order (absolute paths first, then names on ``PATH``).
#: Debian's ``/usr/bin/chromium`` is a shell launcher that sources ``/etc/chromium.d`` (extra
#: extensions, API keys); the binary behind it is started directly.
_CHROMIUM_CANDIDATES: tuple[str, ...] = (
    "/usr/lib/chromium/chromium",
    "chromium",
    "chromium-browser",
    "google-chrome-stable",
    "google-chrome",
)

#: What to tell an operator whose machine has no Chromium.
INSTALL_HINT = (
    "install Debian's package with `apt-get install chromium` (scripts/browser/install.sh), or "
    f"point {_EXECUTABLE_ENV} (BrowserSettings.executable_path) at a Chromium or Chrome "
    "executable; the project never downloads a browser"
)

#: Snapshots longer than this are cut with a marker (the reference's 8 000 characters).
DEFAULT_SNAPSHOT_MAX_CHARS = 8_000

#: Seconds an unused session lives (the reference's ``BROWSER_INACTIVITY_TIMEOUT`` default).
DEFAULT_IDLE_TIMEOUT_SECONDS = 300.0

#: Browser contexts open at once. Each context with one page costs a renderer process
#: (~25-40 MB resident for a small page, see ``bench/browser.py``); 16 keeps a 2-core machine
#: responsive while rollouts that wait for a slot queue in order.
DEFAULT_MAX_SESSIONS = 16

#: Flags every launch gets. ``--no-sandbox`` comes from Playwright's ``chromium_sandbox=False``:
#: Chromium refuses its sandbox as root; isolation from the host is the SSRF guard's job.
_BASE_ARGS: tuple[str, ...] = (
    # The backstop: a request that escaped interception (a redirect hop, a worker's WebSocket,
    # a preconnect, a beacon) fails with ERR_NAME_NOT_RESOLVED instead of reaching the network.
    "--host-resolver-rules=MAP * ~NOTFOUND",
    # WebRTC's UDP (STUN to an IP literal) bypasses the host resolver.
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    # No traffic of Chromium's own (updates, sync, field trials, pings): it would fail anyway.
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-pings",
    "--disable-gpu",  # headless servers have none
    "--disable-dev-shm-usage",  # containers often mount a 64 MB /dev/shm, too small
)


@dataclass(frozen=True, slots=True)
class VisionSettings:
    """A vision-capable model behind an OpenAI-compatible chat endpoint, for ``browser_vision``.

    ``base_url`` ends in ``/v1``; it is the operator's, so not SSRF-vetted. ``api_key`` is
    hidden from ``repr`` and errors. ``transport`` is never closed here.
    """

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 60.0
    max_tokens: int = 2_000
    transport: httpx.AsyncBaseTransport | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class BrowserSettings:
    """How the browser manager starts Chromium, opens sessions and guards the page's requests.

    Attributes:
        executable_path: ``None``: ``HERMES_BROWSER_EXECUTABLE`` or the first candidate found.
        allow: Hosts (exact, or ``.suffix``) and IP networks the SSRF guard lets the page reach
            although they are not public.
        max_sessions: The ``browser_sessions`` limiter's size when the manager gets none.
        idle_timeout: An unused session is closed after this; ``None`` disables the reaper.
        reap_interval_seconds: Default ``idle / 4``, within 1-30 s (the reference: 30 s).
        action_timeout: One click, fill, key press or snapshot (the reference's 30 s).
        navigation_timeout: One navigation until ``load`` (the reference's 60 s).
        fetch_timeout: One request of the page, redirect hops and body included.
        max_body_bytes: A longer document is cut there, a longer subresource refused.
        max_pages: Tabs one session keeps. A page opened beyond it is closed at once, except
            one the model's click or key press opens, which replaces the oldest.
        max_session_heap_mb: Script memory of one session's pages; past it they are closed and
            the session starts again on a blank page. 512: heavy web apps hold 100-300 MB.
        memory_check_seconds: How often each session's heap is measured, also between calls.
        chromium_sandbox: Run Chromium's own sandbox (needs a non-root user).
        vision: ``None``: ``browser_vision`` reports that it is unavailable.
        transport: For every request of the page (tests inject one); never closed here.
    """

    executable_path: str | None = None
    allow: tuple[str, ...] = ()
    max_sessions: int = DEFAULT_MAX_SESSIONS
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT_SECONDS
    reap_interval_seconds: float | None = None
    launch_timeout: float = 60.0
    create_timeout: float = 30.0
    close_timeout: float = 10.0
    action_timeout: float = 30.0
    navigation_timeout: float = 60.0
    fetch_timeout: float = 20.0
    max_body_bytes: int = 10_000_000
    max_redirects: int = 10
    max_requests_per_session: int = 6
    snapshot_max_chars: int = DEFAULT_SNAPSHOT_MAX_CHARS
    console_max_messages: int = 200
    max_pages: int = 4
    max_session_heap_mb: int = 512
    memory_check_seconds: float = 2.0
    viewport_width: int = 1280
    viewport_height: int = 720
    chromium_sandbox: bool = False
    extra_args: tuple[str, ...] = ()
    vision: VisionSettings | None = None
    transport: httpx.AsyncBaseTransport | None = field(default=None, repr=False, compare=False)
    resolver: Resolver | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_fields(
            self,
            (
                "max_sessions",
                "max_body_bytes",
                "max_requests_per_session",
                "console_max_messages",
                "max_pages",
                "max_session_heap_mb",
                "viewport_width",
                "viewport_height",
            ),
            INTEGER_AT_LEAST_ONE,
        )
        if self.snapshot_max_chars < 200:
            raise ConfigError(
                f"BrowserSettings.snapshot_max_chars must be >= 200, got {self.snapshot_max_chars!r}"
            )
        if self.max_redirects < 0:
            raise ConfigError(
                f"BrowserSettings.max_redirects must be >= 0, got {self.max_redirects!r}"
            )
        check_fields(
            self,
            (
                "launch_timeout",
                "create_timeout",
                "close_timeout",
                "action_timeout",
                "navigation_timeout",
                "fetch_timeout",
                "memory_check_seconds",
            ),
            POSITIVE_SECONDS,
        )
        check_fields(self, ("idle_timeout", "reap_interval_seconds"), POSITIVE_SECONDS.or_none())
        for entry in self.allow:
            check_allow_entry(entry, "BrowserSettings")

    @property
    def reap_interval(self) -> float:
        """Seconds between reaper passes (see ``reap_interval_seconds``)."""
        if self.reap_interval_seconds is not None:
            return self.reap_interval_seconds
        idle = self.idle_timeout or DEFAULT_IDLE_TIMEOUT_SECONDS
        return min(30.0, max(1.0, idle / 4))

    def fetch_settings(self) -> WebSettings:
        """The fetcher configuration the page's requests go through (caps, guard, transport)."""
        return WebSettings(
            allow=self.allow,
            fetch_timeout=self.fetch_timeout,
            max_redirects=self.max_redirects,
            max_body_bytes=self.max_body_bytes,
            transport=self.transport,
            resolver=self.resolver,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BrowserSettings:
        """Build settings from ``environ`` (default ``os.environ``).

        Reads ``HERMES_BROWSER_EXECUTABLE``, ``HERMES_BROWSER_ALLOW`` (comma-separated hosts
        and CIDRs), ``HERMES_BROWSER_MAX_SESSIONS``, ``BROWSER_INACTIVITY_TIMEOUT`` (seconds,
        the reference's variable) and ``HERMES_BROWSER_VISION_URL`` / ``_MODEL`` (required
        with the URL) / ``_API_KEY``. An invalid value is a ``ConfigError``.
        """
        get = env_reader(environ)

        def number(name: str) -> float | None:
            raw = get(name)
            if raw is None:
                return None
            try:
                return float(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None

        vision = None
        if endpoint := model_endpoint_from_env(get, "HERMES_BROWSER_VISION", "the vision"):
            url, model, key = endpoint
            vision = VisionSettings(base_url=url, model=model, api_key=key)
        kwargs: dict[str, object] = {}
        sessions = get("HERMES_BROWSER_MAX_SESSIONS")
        if sessions is not None:
            try:
                kwargs["max_sessions"] = int(sessions)
            except ValueError:
                raise ConfigError(
                    f"HERMES_BROWSER_MAX_SESSIONS={sessions!r} is not an integer"
                ) from None
        idle = number("BROWSER_INACTIVITY_TIMEOUT")
        if idle is not None:
            kwargs["idle_timeout"] = idle
        return cls(
            executable_path=get(_EXECUTABLE_ENV),
            allow=allow_list_from_env(get, "HERMES_BROWSER_ALLOW"),
            vision=vision,
            **kwargs,  # type: ignore[arg-type]
        )


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_chromium(
    configured: str | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    candidates: tuple[str, ...] = _CHROMIUM_CANDIDATES,
) -> str:
    """The absolute path of Chromium: ``configured``, ``HERMES_BROWSER_EXECUTABLE``, or the
    first of ``candidates`` on ``PATH``; else ``ConfigError`` saying how to install one."""
    env = os.environ if environ is None else environ
    chosen = configured or env_reader(env)(_EXECUTABLE_ENV)
    if chosen is not None:
        path = chosen if os.sep in chosen else (shutil.which(chosen) or chosen)
        if not _executable(path):
            raise ConfigError(
                f"the browser executable {chosen!r} (from "
                f"{'BrowserSettings.executable_path' if configured else _EXECUTABLE_ENV}) is not "
                f"an executable file; {INSTALL_HINT}"
            )
        return os.path.abspath(path)
    for candidate in candidates:
        found = candidate if os.sep in candidate else shutil.which(candidate, path=env.get("PATH"))
        if found is not None and _executable(found):
            return os.path.abspath(found)
    raise ConfigError(
        f"no Chromium executable found (looked for {', '.join(candidates)}); {INSTALL_HINT}"
    )


def chromium_args(settings: BrowserSettings) -> list[str]:
    """The command-line flags Chromium is started with."""
    return [*_BASE_ARGS, *settings.extra_args]


def launch_environment(environ: Mapping[str, str] | None = None) -> dict[str, str | float | bool]:
    """The environment Chromium gets: an allowlist, so no host secret reaches the browser."""
    env = os.environ if environ is None else environ
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "FONTCONFIG_PATH", "FONTCONFIG_FILE")
    out: dict[str, str | float | bool] = {k: env[k] for k in keep if k in env}
    out.setdefault("PATH", "/usr/bin:/bin")
    return out
