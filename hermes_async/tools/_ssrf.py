"""The SSRF guard of the web tools: which URLs may be fetched, and at which address.

Only http(s) URLs whose every resolved address is public pass, unless allowlisted; each
redirect hop is vetted again, and the connection goes to the vetted address so DNS rebinding
cannot move it. Rules and residual risks: docs/architecture.md, "The SSRF guard of the web
tools".
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import anyio
import httpx

from hermes_async.errors import ToolExecutionError
from hermes_async.tools._web_settings import Resolver

__all__ = (
    "Allowlist",
    "URLRefusedError",
    "WebFetchError",
    "address_problem",
    "parse_url",
    "vet_url",
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: URL schemes a fetch may use.
_ALLOWED_SCHEMES = ("http", "https")

#: Deadline of one host-name resolution (a resolver that hangs must not hold a tool call).
_DNS_TIMEOUT_SECONDS = 10.0

# Ranges Python's ``is_global`` misses on some versions (3.11 treats 192.0.0.0/24 as global).
_EXTRA_BLOCKED: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("0.0.0.0/8"),
    ipaddress.ip_network("100.64.0.0/10"),
    ipaddress.ip_network("192.0.0.0/24"),
    ipaddress.ip_network("198.18.0.0/15"),
    ipaddress.ip_network("240.0.0.0/4"),
    ipaddress.ip_network("fec0::/10"),
)
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


class WebFetchError(ToolExecutionError):
    """A page could not be fetched (network failure, timeout, HTTP error, unreadable body)."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class URLRefusedError(WebFetchError):
    """The SSRF guard refused a URL (scheme, or an address that is not public)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"refused to fetch {url!r}: {reason}. web_extract only fetches public http(s) "
            "addresses (an operator can allow an internal host with WebSettings.allow)",
            url=url,
        )
        self.reason = reason


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for, if it is one of the IPv4-carrying forms."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        # (server, client): the client address is the one traffic ends up at.
        return ip.teredo[1]
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_problem(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be fetched (``"10.0.0.1 is a private address"``), or ``None``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            inner = address_problem(embedded)
            if inner is not None:
                return f"{ip} embeds {embedded}, and {inner}"
            return None  # judged by the IPv4 address it carries, which is public
    checks: tuple[tuple[bool, str], ...] = (
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_loopback, "a loopback address"),
        (ip.is_link_local, "a link-local address (cloud metadata lives there)"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_private, "a private address"),
        (ip.is_reserved, "a reserved address"),
        (
            any(ip in net for net in _EXTRA_BLOCKED if net.version == ip.version),
            "a reserved address",
        ),
        (not ip.is_global, "not a publicly routable address"),
    )
    for hit, what in checks:
        if hit:
            return f"{ip} is {what}"
    return None


@dataclass(frozen=True, slots=True)
class Allowlist:
    """Hosts and networks the guard lets through although they are not public.

    Entries: a host name, a ``.suffix`` domain, an IP address or a CIDR network.
    """

    hosts: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_entries(cls, entries: Iterable[str]) -> Allowlist:
        hosts: set[str] = set()
        suffixes: list[str] = []
        networks: list[IPNetwork] = []
        for raw in entries:
            entry = raw.strip().lower().rstrip(".")
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            if entry.startswith("."):
                suffixes.append(entry)
            else:
                hosts.add(entry)
        return cls(frozenset(hosts), tuple(suffixes), tuple(networks))

    def allows_host(self, host: str) -> bool:
        """Whether the host *name* is allowed (any address it resolves to is then accepted)."""
        host = host.lower().rstrip(".")
        return host in self.hosts or any(host.endswith(s) for s in self.suffixes)

    def allows_ip(self, ip: IPAddress) -> bool:
        """Whether ``ip`` lies in an allowed network."""
        return any(ip.version == net.version and ip in net for net in self.networks)


@dataclass(frozen=True, slots=True)
class _Target:
    """A vetted URL and the address the connection must go to."""

    url: httpx.URL
    ip: str

    @property
    def connect_url(self) -> httpx.URL:
        """``url`` with its host replaced by the vetted address."""
        return self.url.copy_with(host=self.ip)

    @property
    def host_header(self) -> str:
        """The ``Host`` header naming the original host (and port when not the default)."""
        return self.url.netloc.decode("ascii")

    @property
    def sni_hostname(self) -> str | None:
        """The TLS server name to send and verify (``None`` for IP literals and plain http)."""
        host = self.url.raw_host.decode("ascii")
        if self.url.scheme != "https" or _ip_literal(host) is not None:
            return None
        return host


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def parse_url(raw: str) -> httpx.URL:
    """Parse ``raw`` and check its scheme and host, without any I/O.

    Raises:
        URLRefusedError: Not a URL, a scheme other than http(s), or no host.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise URLRefusedError(str(raw), "it is not a URL")
    try:
        url = httpx.URL(raw.strip())
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise URLRefusedError(raw, f"it is not a valid URL ({exc})") from None
    scheme = url.scheme.lower()
    if scheme not in _ALLOWED_SCHEMES:
        shown = scheme or "(none)"
        raise URLRefusedError(raw, f"scheme {shown!r} is not allowed, only http and https")
    if not url.host:
        raise URLRefusedError(raw, "it has no host")
    return url


async def _default_resolver(host: str, port: int) -> list[str]:
    """Resolve ``host`` with :func:`anyio.getaddrinfo` (TCP); return the distinct addresses.

    **Cancellation**: safe to cancel; nothing to clean up.
    """
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[str, None] = {}
    for _family, _type, _proto, _canon, sockaddr in infos:
        seen.setdefault(str(sockaddr[0]).split("%", 1)[0], None)
    return list(seen)


async def vet_url(
    url: httpx.URL,
    *,
    allow: Allowlist,
    resolver: Resolver | None = None,
) -> _Target:
    """Check that ``url`` may be fetched and pick the address to connect to.

    Every resolved address must pass, unless the name or the address is allowlisted.

    Args:
        resolver: ``async (host, port) -> [ip, ...]``; default :func:`_default_resolver`.

    Raises:
        URLRefusedError: The URL's address is not allowed.
        WebFetchError: The host could not be resolved in time.

    **Cancellation**: safe to cancel; nothing to clean up.
    """
    raw = str(url)
    host = url.raw_host.decode("ascii")  # IDNA-encoded: what DNS and TLS see
    port = url.port or (443 if url.scheme == "https" else 80)
    literal = _ip_literal(host)
    if literal is not None:
        candidates: Sequence[str] = [str(literal)]
    else:
        resolve = resolver or _default_resolver
        try:
            with anyio.fail_after(_DNS_TIMEOUT_SECONDS):
                candidates = list(await resolve(host, port))
        except TimeoutError:
            raise WebFetchError(
                f"could not resolve host {host!r} of {raw!r}: no answer within "
                f"{_DNS_TIMEOUT_SECONDS:g} seconds",
                url=raw,
            ) from None
        except OSError as exc:
            raise WebFetchError(
                f"could not resolve host {host!r} of {raw!r}: {exc}", url=raw
            ) from None
        if not candidates:
            raise WebFetchError(f"host {host!r} of {raw!r} has no address", url=raw)
    name_allowed = literal is None and allow.allows_host(host)
    addresses: list[IPAddress] = []
    for text in candidates:
        try:
            ip = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            raise URLRefusedError(
                raw, f"host {host!r} resolved to {text!r}, not an IP address"
            ) from None
        if not name_allowed and not allow.allows_ip(ip):
            problem = address_problem(ip)
            if problem is not None:
                where = f"host {host!r} resolves to {ip}: " if literal is None else ""
                raise URLRefusedError(raw, f"{where}{problem}")
        addresses.append(ip)
    return _Target(url=url, ip=str(addresses[0]))
