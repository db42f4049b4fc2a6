"""Safety: every URL and every redirect hop is checked before any byte is sent.

Only http(s) URLs without credentials, whose host resolves to public
addresses only (unless private ones are allowed); the fetcher then connects
to the address checked here. DNS lookups run on their own bounded executor.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import asyncio
import functools
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

# --- snippet ---


class _RefusedError(Exception):
    """The URL is not allowed (scheme, address, form). Final: never retried."""


_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_BAD_URL_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")
# The longest DNS name (RFC 1035, without the root dot).
_MAX_HOST_CHARS = 253


@dataclass(frozen=True)
class _Target:
    """A checked URL: where to connect (ip) and what to ask for (host, path)."""

    scheme: str
    host: str
    port: int
    path: str
    ip: str

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == default else f"{name}:{self.port}"

    @property
    def url(self) -> str:
        """The normalized URL (no fragment): cache key and redirect base."""
        return f"{self.scheme}://{self.host_header}{self.path}"


# Lookups run on threads of their own (getaddrinfo blocks and cannot be
# stopped): a slow resolver holds at most these, and nothing else (TLS setup,
# joins, the fallback converter, other tools) can make a lookup wait its turn.
_DNS_THREADS = 8
_DNS_EXECUTOR = ThreadPoolExecutor(_DNS_THREADS, thread_name_prefix="visit-dns")
# A lookup's own limit; it also counts against the page timeout (`_get_page`).
_DNS_TIMEOUT_SECONDS = 10.0


# Resolves a host name to its IP addresses.
Resolver = Callable[[str], Awaitable[list[str]]]


async def _resolve(host: str) -> list[str]:
    """Resolve a host name to IP addresses (a visit call's resolver by default)."""
    loop = asyncio.get_running_loop()
    lookup = functools.partial(socket.getaddrinfo, host, None, type=socket.SOCK_STREAM)
    infos = await loop.run_in_executor(_DNS_EXECUTOR, lookup)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address carries (mapped, 6to4, Teredo, NAT64)."""
    found: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour:
        found.append(ip.sixtofour)
    if ip.teredo:
        found.extend(ip.teredo)
    if ip in _NAT64 or (ip.packed[:12] == bytes(12) and int(ip) > 1):
        found.append(ipaddress.IPv4Address(ip.packed[12:]))
    return found


def _is_public(address: str) -> bool:
    """True only for globally routable unicast addresses."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id or ip in _NAT64_LOCAL or ip.is_site_local:
            return False
        embedded = _embedded_ipv4(ip)
        if embedded:
            # The IPv4 inside decides: ::ffff:127.0.0.1 is loopback in disguise.
            return all(_is_public(str(v4)) for v4 in embedded)
    elif ip in _CGNAT:
        return False
    return ip.is_global and not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def _ascii_host(host: str) -> str:
    """The host as ASCII (IDNA), or refuse it."""
    try:
        return host if host.isascii() else host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise _RefusedError("invalid host name") from exc


async def _check_url(
    url: str,
    allow_private: bool,
    *,
    resolve: Resolver = _resolve,
    dns_timeout: float = _DNS_TIMEOUT_SECONDS,
) -> _Target:
    """Parse, validate and resolve a URL; refuse anything not safe to fetch.

    Args:
        url: The URL as the model wrote it (or a redirect's target).
        allow_private: Whether private and loopback addresses may be read.
        resolve: Resolves the host name (`_resolve`: DNS).
        dns_timeout: The lookup's own time limit, in seconds.

    Returns:
        The checked target, pinned to the address to connect to.

    Raises:
        _RefusedError: The URL is not safe to fetch, or its host has no address.
    """
    url = url.strip().replace(" ", "%20")  # as a browser would send it
    if _BAD_URL_CHARS.search(url):
        raise _RefusedError("the URL contains control characters or '\\'")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _RefusedError("malformed URL") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _RefusedError("only http and https URLs can be read")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise _RefusedError("URLs with user names or passwords are not read")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError as exc:
        raise _RefusedError("invalid port") from exc
    host = _ascii_host((parts.hostname or "").rstrip("."))
    if not host or "%" in host:
        raise _RefusedError("the URL has no valid host")
    if len(host) > _MAX_HOST_CHARS:  # never resolvable, and too long to echo
        raise _RefusedError(
            f"the host name is longer than {_MAX_HOST_CHARS} characters"
        )
    addresses = await _host_addresses(host, resolve, dns_timeout)
    if not allow_private:
        blocked = [a for a in addresses if not _is_public(a)]
        if blocked:
            raise _RefusedError(
                f"{host} is a private or reserved address ({blocked[0]})"
            )
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(scheme, host, port, path, addresses[0])


async def _host_addresses(
    host: str, resolve: Resolver, dns_timeout: float
) -> list[str]:
    """The IPs a host stands for: itself if a literal, else what `resolve` says."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    labels = host.lower().split(".")
    if _NUMERIC_LABEL.match(labels[-1]):
        # 2130706433, 0x7f.1, 017700000001, 127.1: legacy spellings of an IP
        # that resolvers expand; legitimate sites never use them.
        raise _RefusedError("numeric host names in non-standard form are not read")
    try:
        async with asyncio.timeout(dns_timeout):
            addresses = await resolve(host)
    except TimeoutError as exc:
        raise _RefusedError(f"could not resolve {host} (DNS timed out)") from exc
    except (OSError, UnicodeError) as exc:
        raise _RefusedError(f"could not resolve {host}") from exc
    if not addresses:
        raise _RefusedError(f"could not resolve {host}")
    return addresses


def _normalize_url(url: str) -> str:
    """A cache / de-duplication key: lower-case scheme and host, no fragment."""
    try:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").rstrip(".")
        port = f":{parts.port}" if parts.port else ""
        query = f"?{parts.query}" if parts.query else ""
    except ValueError:
        return url.strip()
    return f"{parts.scheme.lower()}://{host}{port}{parts.path or '/'}{query}"
