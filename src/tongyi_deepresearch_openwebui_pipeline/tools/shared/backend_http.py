"""Backend HTTP for the search tools: TLS, bounded reading, JSON off the loop.

Backend answers are untrusted: one TLS context per process (built off the
event loop), credentials in a URL sent as Basic auth, bodies read with a cap
on the wire and after decompression (own gzip/deflate decoder), and big
answers parsed in a worker thread. Generated into search_tool.py and
scholar_tool.py by scripts/sync_root_files.py.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import asyncio
import json
import ssl
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import SplitResult, unquote

import httpx

# --- snippet ---

T = TypeVar("T")


# One TLS context for the whole process. Building one loads the CA bundle:
# ~30 ms on an idle machine, 100-300 ms under load, all of it blocking, so it
# is built once, in a worker thread, and every call's client shares it.
_SSL_CONTEXTS: list[ssl.SSLContext] = []


_SSL_LOCK = threading.Lock()


def _build_ssl_context() -> ssl.SSLContext:
    """Create the shared context once (the lock makes concurrent first calls wait)."""
    with _SSL_LOCK:
        if not _SSL_CONTEXTS:
            _SSL_CONTEXTS.append(httpx.create_ssl_context())
        return _SSL_CONTEXTS[0]


async def _ssl_context() -> ssl.SSLContext:
    """The shared TLS context; only the first call waits for it."""
    if _SSL_CONTEXTS:
        return _SSL_CONTEXTS[0]
    return await asyncio.to_thread(_build_ssl_context)


# Backend answers are untrusted: at most this many bytes are read, counted on
# the wire and again after decompression.
MAX_RESPONSE_BYTES = 5_000_000


# Larger answers are parsed in a worker thread: parsing a few MB of JSON (or
# XML) and picking its records would hold the event loop for tenths of a second.
INLINE_PARSE_BYTES = 200_000


# Only the encodings `_Inflater` decodes with a bound (httpx would also offer
# br/zstd when those packages are installed, decoded without a bound).
ACCEPT_ENCODING = "gzip, deflate"


class _TooLargeError(ValueError):
    """A backend answer over MAX_RESPONSE_BYTES, on the wire or decompressed."""


@dataclass(frozen=True)
class _Endpoint:
    """A backend URL without credentials, and the credentials as Basic auth."""

    url: str
    auth: httpx.BasicAuth | None = None


def _split_credentials(parts: SplitResult) -> tuple[str, httpx.BasicAuth | None]:
    """The host part without `user:password@`, and those as Basic auth.

    httpx logs every request URL at INFO and its errors quote it, so
    credentials written into a valve URL must not stay in the URL.
    """
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return parts.netloc, None
    user, _, password = userinfo.partition(":")
    return host, httpx.BasicAuth(unquote(user), unquote(password))


class _Inflater:
    """Bounded gzip/deflate decoding of a body (identity passes through).

    Unlike httpx's decoders, it never inflates more than the room left under
    the size cap (a 64 kB chunk can inflate to 64 MB) and refuses data after
    the end of the compressed stream instead of silently reading on.
    """

    def __init__(self, content_encoding: str) -> None:
        """Prepare for the answer's Content-Encoding (ValueError if unsupported)."""
        encoding = content_encoding.strip().lower()
        if encoding in {"", "identity"}:
            self._wbits = 0
        elif encoding in {"gzip", "x-gzip"}:
            self._wbits = zlib.MAX_WBITS | 16
        elif encoding == "deflate":
            self._wbits = zlib.MAX_WBITS  # zlib-wrapped; raw deflate as fallback
        else:
            raise ValueError("unsupported content encoding")
        self._engine = zlib.decompressobj(self._wbits) if self._wbits else None
        self._fed = False

    def feed(self, data: bytes, room: int) -> bytes:
        """Decoded bytes of one wire chunk; _TooLargeError past `room`."""
        if self._engine is None or not data:
            return data
        if self._engine.eof:
            raise ValueError("data after the end of the compressed body")
        try:
            out = self._engine.decompress(data, room + 1)
        except zlib.error:
            if self._fed or self._wbits != zlib.MAX_WBITS:
                raise ValueError("corrupt compressed body") from None
            self._wbits = -zlib.MAX_WBITS  # some servers send raw deflate
            self._engine = zlib.decompressobj(self._wbits)
            return self.feed(data, room)
        self._fed = True
        if len(out) > room:
            raise _TooLargeError
        if self._engine.unused_data:
            raise ValueError("data after the end of the compressed body")
        return out

    def finish(self) -> None:
        """Refuse a compressed body that ended before its stream did."""
        if self._engine is not None and self._fed and not self._engine.eof:
            raise ValueError("compressed body ended early")


async def _read_body(response: httpx.Response) -> bytes:
    """The decoded body; _TooLargeError past the cap on the wire or decoded."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        raise _TooLargeError
    inflater = _Inflater(response.headers.get("content-encoding", ""))
    body = bytearray()
    received = 0
    async for chunk in response.aiter_raw():
        received += len(chunk)
        if received > MAX_RESPONSE_BYTES:
            raise _TooLargeError
        body += inflater.feed(chunk, MAX_RESPONSE_BYTES - len(body))
    inflater.finish()
    return bytes(body)


async def _get(client: httpx.AsyncClient, endpoint: _Endpoint, params: dict) -> bytes:
    """GET a backend answer, bounded in size (see _read_body)."""
    async with client.stream(
        "GET",
        endpoint.url,
        params=params,
        auth=endpoint.auth,
        headers={"Accept-Encoding": ACCEPT_ENCODING},
    ) as response:
        response.raise_for_status()
        return await _read_body(response)


def _parse_json(body: bytes) -> Any:
    """A backend answer as JSON (the seam tests watch for the parsing thread)."""
    return json.loads(body)


async def _parse_off_loop(body: bytes, parse: Callable[[bytes], T]) -> T:
    """Run `parse(body)`; in a worker thread when the body is large."""
    if len(body) <= INLINE_PARSE_BYTES:
        return parse(body)
    return await asyncio.to_thread(parse, body)
