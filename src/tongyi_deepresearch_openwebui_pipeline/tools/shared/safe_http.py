"""Safe HTTP for every tool: one TLS context cache, one bounded body reader.

The tools read untrusted bodies (search engines, scholarly APIs, web pages).
One TLS context per verify setting serves the whole process (built once, off
the event loop); one decoder reads every compressed body with a bound on what
it inflates, for the encodings declared once below (what Accept-Encoding
announces); one reader caps a body on the wire and decoded. What a tool does
at the cap differs (a search answer over it is refused, a page is cut) and is
the tool's. Generated into all three tools by scripts/sync_root_files.py.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import asyncio
import ssl
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx

# --- snippet ---


class _TlsContexts:
    """The TLS contexts of a process, one per verify setting, each built once.

    Building one loads the CA bundle: ~30 ms on an idle machine, 100-300 ms
    under load, all of it blocking, so `_ssl_context` builds it once, in a
    worker thread, and every client shares it. The server name to check is
    given per connection (SNI), so one context serves every host, connections
    pinned to an address included. Iterating gives the contexts built so far.
    """

    def __init__(
        self, create: Callable[..., ssl.SSLContext] = httpx.create_ssl_context
    ) -> None:
        """Hold no context yet.

        Args:
            create: Builds a context, given ``verify=`` (httpx's, as every
                client of the tools would build one).
        """
        self._create = create
        self._by_verify: dict[bool, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def get(self, verify: bool) -> ssl.SSLContext | None:
        """The context built for `verify`, or None."""
        return self._by_verify.get(verify)

    def build(self, verify: bool) -> ssl.SSLContext:
        """The context for `verify`, built now if none was (blocking).

        Calls at the same time wait for one another: one context is built.
        """
        with self._lock:
            context = self._by_verify.get(verify)
            if context is None:
                # verify=False: no certificate or host name check (CERT_NONE).
                context = self._by_verify[verify] = self._create(verify=verify)
            return context

    def __getitem__(self, verify: bool) -> ssl.SSLContext:
        """The context built for `verify` (KeyError if none was)."""
        return self._by_verify[verify]

    def __iter__(self) -> Iterator[ssl.SSLContext]:
        """The contexts built so far."""
        return iter(list(self._by_verify.values()))


# The contexts of this process, shared by every call of the tool.
_SSL_CONTEXTS = _TlsContexts()


async def _ssl_context(
    verify: bool = True, contexts: _TlsContexts = _SSL_CONTEXTS
) -> ssl.SSLContext:
    """The shared TLS context for `verify`; only the first call waits for it.

    Args:
        verify: Whether certificates and host names are checked.
        contexts: Where contexts are kept (the process's by default).

    Returns:
        The context, built off the event loop the first time.
    """
    context = contexts.get(verify)
    if context is None:
        context = await asyncio.to_thread(contexts.build, verify)
    return context


# The Content-Encodings a body may have, with zlib's window bits for each
# (gzip; deflate with a zlib header, or a gzip one, else raw deflate as some
# servers send it). Accept-Encoding announces exactly these: httpx would also
# offer br and zstd when those packages are installed, decoded without a bound.
_DECODED_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": 32 + zlib.MAX_WBITS}


# Other names of the same encodings.
_ENCODING_ALIASES = {"x-gzip": "gzip", "": "identity"}


ACCEPT_ENCODING = ", ".join(_DECODED_ENCODINGS)


# A zlib (or gzip) header is checked on its first two bytes: a deflate body
# refused there has none, and is read again as raw deflate.
_DEFLATE_HEADER_BYTES = 2


# Gzip members in one body: real ones have one, rarely a few. Each member's
# end makes zlib copy the rest of the chunk, so the count is capped.
_MAX_GZIP_MEMBERS = 64


class _UnreadableBodyError(ValueError):
    """A body that cannot be decoded (the message says why, for a reader)."""


class _BoundedDecoder:
    """Content-Encoding decoder that never produces more than asked for.

    httpx's own decoder inflates a whole network chunk at once, so a gzip bomb
    could allocate far beyond the size cap; zlib's `max_length` cannot. The
    stream's end is the body's end: gzip members that follow are inflated
    (up to `_MAX_GZIP_MEMBERS`), anything else after it is not read at all
    (`finished` tells the reader to stop), so junk after the compressed data
    is neither accumulated nor waited for.
    """

    def __init__(self, encoding: str) -> None:
        """Prepare for a body's Content-Encoding (_UnreadableBodyError if unknown)."""
        name = encoding.strip().lower()
        self.finished = False  # the body ended: read no more
        self.cut = False  # ... and more gzip members followed than are read
        self.trailing = False  # ... and bytes that are no gzip member followed
        self._members = 0
        self._between = b""  # bytes after a gzip member, too few to tell
        self._head = b""  # a deflate body's first bytes, while it may be raw
        name = _ENCODING_ALIASES.get(name, name)
        if name == "identity":
            self._wbits = 0
        elif name in _DECODED_ENCODINGS:
            self._wbits = _DECODED_ENCODINGS[name]
        else:
            shown = encoding.strip().lower()
            raise _UnreadableBodyError(f"unsupported content encoding {shown!r}")
        self._inflater = self._next_member()  # unused for an uncompressed body

    @property
    def complete(self) -> bool:
        """Whether the compressed stream ended (an uncompressed body always has)."""
        return not self._wbits or (self._inflater.eof and not self._between)

    def _next_member(self) -> "zlib._Decompress":
        self._members += 1
        return zlib.decompressobj(self._wbits)

    def feed(self, data: bytes, limit: int) -> bytes:
        """Up to `limit` decoded bytes of `data`; sets `finished` at the end.

        Output that reaches `limit` means the body goes on past it: feed no
        more (what was left of `data` is not kept).
        """
        if not self._wbits:
            return data[:limit]
        out: list[bytes] = []
        while data and limit > 0 and not self.finished:
            if self._inflater.eof:
                data = self._after_member(self._between + data)
                if not data:
                    break
            piece = self._inflate(data, limit)
            out.append(piece)
            limit -= len(piece)
            # After the end of a stream zlib keeps (a copy of) the rest of the
            # input in unused_data: handle it now, never feed it more data.
            data = self._inflater.unused_data if self._inflater.eof else b""
        return b"".join(out)

    def _inflate(self, data: bytes, limit: int) -> bytes:
        """Inflate `data`; a deflate body without a header is read as raw deflate."""
        try:
            piece = self._inflater.decompress(data, limit)
        except zlib.error as exc:
            if not self._may_be_raw_deflate():
                raise _UnreadableBodyError(
                    "the compressed response is corrupt"
                ) from exc
            data, self._head = self._head + data, b""
            self._wbits = -zlib.MAX_WBITS  # some servers send raw deflate
            self._inflater = zlib.decompressobj(self._wbits)
            return self._inflate(data, limit)
        if self._may_be_raw_deflate():
            self._head += data[: _DEFLATE_HEADER_BYTES - len(self._head)]
        return piece

    def _may_be_raw_deflate(self) -> bool:
        """Whether a deflate body's header is still being read."""
        return (
            self._wbits == _DECODED_ENCODINGS["deflate"]
            and len(self._head) < _DEFLATE_HEADER_BYTES
        )

    def _after_member(self, data: bytes) -> bytes:
        """The next gzip member's bytes, or b"" (waiting, or finished)."""
        self._between = b""
        if self._wbits != _DECODED_ENCODINGS["gzip"] or not data.startswith(
            b"\x1f\x8b"[: len(data)]
        ):
            self.finished = self.trailing = True  # not a gzip member: the end
            return b""
        if len(data) < 2:
            self._between = data  # one byte: the next chunk tells
            return b""
        if self._members >= _MAX_GZIP_MEMBERS:
            self.finished = self.cut = True
            return b""
        self._inflater = self._next_member()
        return data


@dataclass(frozen=True)
class _Download:
    """A body read within a cap, and how it ended."""

    body: bytes  # decoded, at most the cap
    over_cap: bool  # more followed, on the wire or decoded, than the cap
    more_members: bool  # more gzip members followed than are read
    trailing: bool  # bytes that are no gzip member followed the compressed body
    complete: bool  # the compressed body ended (an uncompressed one always has)


async def _download(response: httpx.Response, cap: int) -> _Download:
    """Stream a body, decoded, up to `cap` bytes on the wire and decoded.

    `cap` bounds what crosses the wire as well as what it decodes to: a body
    whose compressed bytes go past it is cut there, whatever they inflate to.
    """
    decoder = _BoundedDecoder(response.headers.get("content-encoding", ""))
    chunks: list[bytes] = []
    size = wire = 0
    over_cap = False
    async for raw in response.aiter_raw():
        wire += len(raw)
        piece = decoder.feed(raw, cap - size + 1)
        size += len(piece)
        if size > cap:  # one byte over: the body goes on past the cap
            chunks.append(piece[: len(piece) - (size - cap)])
            over_cap = True
            break
        chunks.append(piece)
        if decoder.finished:
            break
        if wire > cap:
            over_cap = True
            break
    body = await _joined(chunks)
    return _Download(body, over_cap, decoder.cut, decoder.trailing, decoder.complete)


async def _read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    """The body decoded up to `cap` bytes, and whether anything was left unread.

    Bytes after the end of a compressed body are not part of it (a browser
    ignores them too); more gzip members than are read count as left unread.
    """
    download = await _download(response, cap)
    return download.body, download.over_cap or download.more_members


_THREAD_JOIN_BYTES = 1_000_000


def _join_bytes(chunks: list[bytes]) -> bytes:
    """The chunks joined."""
    return b"".join(chunks)


async def _joined(
    chunks: list[bytes], join: Callable[[list[bytes]], bytes] = _join_bytes
) -> bytes:
    """The chunks as one bytes object; a big join runs in a worker thread.

    Copying megabytes into fresh memory takes tens of milliseconds (page faults
    included); bytes.join releases the GIL while it copies, so the loop runs on.

    Args:
        chunks: The pieces, in order.
        join: Joins them (`_join_bytes`; tests watch which thread runs it).

    Returns:
        The pieces as one bytes object.
    """
    if sum(map(len, chunks)) < _THREAD_JOIN_BYTES:
        return join(chunks)
    return await asyncio.to_thread(join, chunks)
