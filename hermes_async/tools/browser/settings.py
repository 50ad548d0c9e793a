"""Configuration of the browser tools, and where the Chromium executable comes from.

One :class:`BrowserSettings` configures one :class:`~hermes_async.tools.browser.BrowserManager`
(one browser process, one context per rollout). :meth:`BrowserSettings.from_env` reads:

=================================  =============================================================
``HERMES_BROWSER_EXECUTABLE``       Path of the Chromium (or Chrome) executable. Default: Debian's
                                    ``/usr/lib/chromium/chromium``, else ``chromium``,
                                    ``chromium-browser``, ``google-chrome-stable`` or
                                    ``google-chrome`` on ``PATH``.
``HERMES_BROWSER_ALLOW``            Comma-separated hosts and/or CIDRs the SSRF guard lets the
                                    page reach although they are not public (tests, intranet).
``HERMES_BROWSER_MAX_SESSIONS``     Browser contexts open at once (the ``browser_sessions``
                                    limiter's default size).
``BROWSER_INACTIVITY_TIMEOUT``      Seconds before an unused session is closed (the reference's
                                    variable and default, 300).
``HERMES_BROWSER_VISION_URL``       OpenAI-compatible base URL (``.../v1``) of a vision-capable
                                    model for ``browser_vision``; unset means the tool answers
                                    the reference's "unavailable" error.
``HERMES_BROWSER_VISION_MODEL``     Model name sent to that server (required with the URL).
``HERMES_BROWSER_VISION_API_KEY``   Optional bearer key for it.
=================================  =============================================================

The browser is never downloaded (``playwright install`` is not used anywhere): it is Debian's
``chromium`` package, installed with ``apt-get install chromium`` (``scripts/browser/install.sh``)
or any Chromium the operator points to.

Why Chromium is started with these flags (:func:`chromium_args`):

* ``--host-resolver-rules=MAP * ~NOTFOUND``: Chromium cannot resolve any name, nor connect to an
  IP literal, by itself. Every request the page makes is answered by the manager's route handler
  through the SSRF-guarded fetcher; anything that escaped interception (a redirect hop, a
  WebSocket from a worker, a preconnect, a beacon) fails with ``ERR_NAME_NOT_RESOLVED`` instead
  of reaching the network. This is the backstop of the no-bypass design.
* ``--force-webrtc-ip-handling-policy=disable_non_proxied_udp``: WebRTC's UDP (STUN to an IP
  literal) does not go through the host resolver, so it is switched off.
* ``--disable-quic --disable-background-networking --disable-component-update --disable-sync
  --no-first-run --no-pings``: no traffic of Chromium's own (updates, sync, field trials,
  hyperlink-auditing pings) — it would fail anyway, and try hosts on a closed network at start.
* ``--disable-gpu``: headless servers have none. ``--disable-dev-shm-usage``: containers often
  mount a 64 MB ``/dev/shm``, too small for renderers.
* ``--no-sandbox`` comes from Playwright's ``chromium_sandbox=False`` (Chromium refuses to start
  its sandbox as root). Isolation from the host is the SSRF guard's job, not the sandbox's; run
  the trainer as a non-root user to get Chromium's sandbox back
  (``BrowserSettings(chromium_sandbox=True)``).
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

#: Flags every launch gets (see the module docstring for why each one).
_BASE_ARGS: tuple[str, ...] = (
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-pings",
    "--disable-gpu",
    "--disable-dev-shm-usage",
)


@dataclass(frozen=True, slots=True)
class VisionSettings:
    """A vision-capable model behind an OpenAI-compatible chat endpoint, for ``browser_vision``.

    Attributes:
        base_url: The server's OpenAI base URL, ending in ``/v1``; requests go to
            ``{base_url}/chat/completions``. Operator-configured, so not SSRF-vetted.
        model: Model name sent in the request.
        api_key: Optional bearer key (hidden from ``repr``, redacted from errors).
        timeout: Deadline of one analysis request.
        max_tokens: ``max_tokens`` of the request (the reference's 2 000).
        transport: httpx transport for the request (tests inject one); never closed here.
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
        executable_path: The Chromium executable; ``None`` means ``HERMES_BROWSER_EXECUTABLE``
            or the first of :data:`_CHROMIUM_CANDIDATES` found.
        allow: Hosts (exact, or ``.suffix``) and IP networks the SSRF guard lets the page reach
            although they are not public. Empty by default: loopback, private, link-local and
            metadata addresses are refused for navigation, redirects and every subresource.
        max_sessions: Default size of the ``browser_sessions`` limiter (contexts open at once)
            when the manager is not given one.
        idle_timeout: A session unused this long is closed by the reaper; ``None``
            disables the reaper.
        reap_interval_seconds: Seconds between reaper passes (default ``idle / 4``, 1-30 s; the
            reference checked every 30 s).
        launch_timeout: Deadline of starting the Playwright driver and Chromium.
        create_timeout: Deadline of opening one context and its page.
        close_timeout: Deadline of closing one context (and of closing the browser).
        action_timeout: Deadline of one click, fill, key press, snapshot (the
            reference's 30 s command timeout).
        navigation_timeout: Deadline of one navigation until ``load`` (the reference's
            60 s ``open`` timeout).
        fetch_timeout: Deadline of one request the page makes (all redirect hops and
            the body included).
        max_body_bytes: Bytes of one response body kept; a longer document is cut there, a
            longer subresource is refused.
        max_redirects: Redirects followed per request (each hop vetted again).
        max_requests_per_session: Requests of one page fetched concurrently (the others wait).
        snapshot_max_chars: Snapshots longer than this are cut with a marker.
        console_max_messages: Console messages and page errors kept per session (each list).
        max_pages: Pages (tabs) one session keeps open. A page opened beyond it is closed at
            once (a popup refused), except the one a click or key press of the model opens,
            which replaces the oldest. 4: a link or two followed in new tabs; a page that
            opens popups without end holds four.
        max_session_heap_mb: Memory one session's pages' scripts may hold together (V8's
            heap, the DOM's, array buffers), in MB; past it their pages are closed and the
            session starts again on a blank page (the model is told in the console). 512:
            heavy web apps hold 100-300 MB.
        memory_check_seconds: How often each session's heap is measured (between operations
            too: a page grows while the model thinks).
        viewport_width: Viewport width in CSS pixels.
        viewport_height: Viewport height in CSS pixels.
        chromium_sandbox: Run Chromium's own sandbox (needs a non-root user).
        extra_args: More Chromium flags, appended to :func:`chromium_args`.
        vision: The vision model for ``browser_vision``; ``None`` means the tool reports that
            browser vision is unavailable.
        transport: httpx transport for every request the page makes (tests inject one). The
            tools never close it.
        resolver: Host-name resolver of the SSRF guard (default :func:`anyio.getaddrinfo`).
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
        """Build settings from environment variables (see the module docstring for the names).

        Args:
            environ: The mapping to read (default ``os.environ``).

        Raises:
            ConfigError: A variable has an invalid value (a bad allow entry, a number that is
                not one, a vision URL without a model).
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
    """The Chromium executable to start: the configured one, or the first one found.

    Args:
        configured: ``BrowserSettings.executable_path``; when ``None``,
            ``HERMES_BROWSER_EXECUTABLE`` is read from ``environ``.
        environ: The mapping to read (default ``os.environ``); its ``PATH`` is searched.
        candidates: Paths and names to look for, in order.

    Returns:
        An absolute path to an executable file.

    Raises:
        ConfigError: The configured path is not an executable file, or no candidate exists;
            the message says how to install one.
    """
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
    """The command-line flags Chromium is started with (see the module docstring)."""
    return [*_BASE_ARGS, *settings.extra_args]


def launch_environment(environ: Mapping[str, str] | None = None) -> dict[str, str | float | bool]:
    """The environment Chromium gets: an allowlist, so no host secret reaches the browser."""
    env = os.environ if environ is None else environ
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "FONTCONFIG_PATH", "FONTCONFIG_FILE")
    out: dict[str, str | float | bool] = {k: env[k] for k in keep if k in env}
    out.setdefault("PATH", "/usr/bin:/bin")
    return out
