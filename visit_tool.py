"""
id: deepresearch_visit
title: DeepResearch Visit
author: tongyi-deepresearch-openwebui-pipeline contributors
author_url: https://github.com/tongyi-deepresearch-openwebui/tongyi-deepresearch-openwebui-pipeline
version: 0.2.0
license: MIT
description: Read web pages and PDFs safely; extract what matters for a goal.
requirements:
required_open_webui_version: 0.6.0
"""  # noqa: D205, D212, D415  (Open WebUI frontmatter, not prose)

# The module is self-contained on purpose: Open WebUI stores and executes this file
# on its own, so it may only import the standard library, pydantic and httpx at the
# top. pypdf, json5 and Open WebUI itself are optional and imported where used.
#
# Written as modules (tools/visit/, tools/shared/) and generated into the regions
# below by scripts/sync_root_files.py: edit the modules, not the regions. Parts:
# convert (and its source: the converter process's program), converter process
# and its thread fallback, safety, fetch, extractor client, extract, format,
# reading one URL; then the tool.

import asyncio
import base64
import codecs
import contextlib
import contextvars
import dataclasses
import email.utils
import functools
import importlib
import inspect
import io
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from html import unescape
from html.parser import HTMLParser
from typing import Any, Literal
from urllib.parse import quote, unquote, urljoin, urlsplit, urlunsplit
from weakref import WeakKeyDictionary

import httpx
from pydantic import BaseModel, Field

log = logging.getLogger(__name__)


# --- shared: tool_result (made from tools/shared/tool_result.py) ---
class ToolResult(str):
    """The text for the model, carrying whether the call worked and its sources.

    Open WebUI and the model see a plain string. The research pipe reads `ok`
    so a failed call shows as failed: the words alone cannot tell it (a page
    may well begin with "Error"); `sources`, the pages the call read, as the
    `data` of Open WebUI source events, so it can number citations; and
    `papers`, the scholarly records a search found (title, url, pdf,
    authors, year, venue, doi), so a cited paper is exported as one.
    """

    ok: bool
    sources: tuple
    papers: tuple

    def __new__(
        cls, text: str, *, ok: bool, sources: tuple = (), papers: tuple = ()
    ) -> "ToolResult":
        """Wrap ``text``; ``ok`` is False when the call produced nothing usable."""
        result = super().__new__(cls, text)
        result.ok = ok
        result.sources = tuple(sources)
        result.papers = tuple(papers)
        return result


# --- end shared: tool_result ---


# --- shared: events (made from tools/shared/events.py) ---
Emitter = Callable[[dict], Awaitable[Any]]


async def _send_event(emitter: Emitter | None, event: dict) -> None:
    """Send an event; a broken emitter never breaks the tool (the UI is optional)."""
    if emitter is None:
        return
    try:
        sent = emitter(event)
        if inspect.isawaitable(sent):
            await sent
    except Exception as exc:
        log.debug("event emitter failed: %s", type(exc).__name__)


# --- end shared: events ---


# --- shared: safe_http (made from tools/shared/safe_http.py) ---
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


# --- end shared: safe_http ---


# --- shared: convert (made from tools/visit/convert.py) ---
TRUNCATION_NOTE = "[Page truncated to fit the reading budget]"


def _debug(message: str) -> None:
    """Log the exception being handled at DEBUG, where the process logs at all.

    In the server that is the tool's logger; a converter process never imports
    `logging` for it (a library it loads may: then its records go nowhere).
    """
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger(__name__).debug(message, exc_info=True)


class _PageError(Exception):
    """The page could not be read or converted; the message is a short reason."""


class _MangledFileError(Exception):
    """Open WebUI's loader returned a file's bytes decoded as text, lossily.

    A compressed PDF's text exists only in its exact bytes, so such a file is
    downloaded again by the built-in fetcher (same checked URL, same checks).
    """


@dataclass
class _RawPage:
    """Bytes as downloaded, before conversion."""

    final_url: str
    body: bytes
    content_type: str
    truncated: bool = False
    redirects: list[str] = field(default_factory=list)


@dataclass
class _Page:
    """A readable page: text within the budget, plus where it came from.

    `reading` says what of the page `text` is: "main" (its main content),
    "whole" (the whole readable page), "document" (a PDF or a text file,
    unchanged), "loader" (the text Open WebUI's loader returned, unchanged)
    or "" (not known); `page_chars` is the length of the whole readable page,
    for the status line and the source card.
    """

    final_url: str
    title: str
    text: str
    redirects: list[str] = field(default_factory=list)
    reading: str = ""
    page_chars: int = 0


_BINARY_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"PK\x03\x04", "a ZIP archive or Office document"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf", "a 7-Zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"ID3", "an MP3 audio file"),
    (b"OggS", "an Ogg media file"),
    (b"\x00asm", "a WebAssembly binary"),
    (b"\x7fELF", "an executable"),
    (b"\xd0\xcf\x11\xe0", "a legacy Office document"),
)
_HTML_MARKER = re.compile(
    rb"<(!doctype\s+html|html|head|body|title|meta|p|div)[\s>/]", re.I
)
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml")
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([\w.:-]+)""", re.I)
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def _classify(content_type: str, body: bytes) -> tuple[str, str]:
    """("pdf" | "html" | "text" | "binary", label) from headers AND the bytes."""
    mime = content_type.split(";", maxsplit=1)[0].strip().lower()
    head = body[:2048].lstrip(b"\xef\xbb\xbf \t\r\n")
    if b"%PDF-" in body[:1024]:
        return "pdf", "a PDF"
    label = next((name for magic, name in _BINARY_MAGIC if head.startswith(magic)), "")
    if head[4:8] == b"ftyp" or (
        head.startswith(b"RIFF") and head[8:12] in (b"WEBP", b"WAVE", b"AVI ")
    ):
        label = "a media file"
    looks_html = bool(_HTML_MARKER.search(head))
    declared_text = mime.startswith(_TEXT_TYPES) or mime.endswith(("+json", "+xml"))
    wide = body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    if not (label or looks_html or wide):
        sample = body[:4096]
        garbled = sample.decode("utf-8", "replace").count("\ufffd") > 8
        if b"\x00" in sample or (garbled and not declared_text):
            label = f"a binary file ({mime or 'unknown type'})"
    if not label and mime.startswith(("image/", "audio/", "video/", "font/")):
        label = f"a binary file ({mime})"
    if label:
        return "binary", label
    if mime in _HTML_TYPES or (looks_html and not declared_text):
        return "html", "an HTML page"
    return "text", mime or "text"


def _decode(body: bytes, content_type: str, html: bool) -> str:
    """Decode by BOM, then header charset, then <meta charset>, else UTF-8."""
    for bom, codec in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF32_LE, "utf-32"),
        (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if body.startswith(bom):
            return body.decode(codec, errors="replace")
    declared = re.findall(r"charset\s*=\s*[\"']?([\w.:-]+)", content_type, re.I)
    if html:
        declared += [m.decode("ascii", "ignore") for m in _CHARSET.findall(body[:4096])]
    for name in declared:
        codec = _page_codec(name)
        if codec is None:
            continue
        try:
            return body.decode(codec, errors="replace")
        except (UnicodeError, LookupError, ValueError):  # a codec without "replace"
            continue
    return body.decode("utf-8", errors="replace")


# Text codecs Python has but no web page is written in: they transform text
# (escapes, host names) rather than encode it, and some refuse errors="replace".
_NOT_PAGE_CODECS = {"idna", "punycode", "unicode-escape", "raw-unicode-escape", "utf-7"}


def _page_codec(name: str) -> str | None:
    """The codec a declared charset names, if a page can be decoded with it.

    Only real text encodings: "rot13", "base64", "zlib", "hex" … are bytes or
    str transforms (`bytes.decode` raises on them). A BOM-less UTF-16/32
    declaration is almost always wrong, so it is ignored too.
    """
    try:
        info = codecs.lookup(name)
    except LookupError:
        return None
    codec = info.name
    if not getattr(info, "_is_text_encoding", True) or codec in _NOT_PAGE_CODECS:
        return None
    if codec.startswith(("utf-16", "utf-32")):
        return None
    return codec


def _estimate_tokens(text: str) -> float:
    """~4 characters per token for Latin text, one token per CJK character."""
    cjk = len(text) - len(_CJK.sub("", text))
    return cjk + (len(text) - cjk) / 4


def _fit_budget(
    text: str,
    max_tokens: int,
    estimate: "Callable[[str], float]" = _estimate_tokens,
) -> tuple[str, bool]:
    """Cut text to the token budget.

    Args:
        text: The page text.
        max_tokens: The reading budget.
        estimate: Counts the tokens of a piece of text (`_estimate_tokens`;
            tests watch what it is given).

    Returns:
        The text that fits, and True when something was cut.
    """
    # Every character costs at least a quarter token, so a longer text cannot
    # fit: skip the estimate, a regex pass over megabytes that holds the GIL.
    if len(text) <= 4 * max_tokens and estimate(text) <= max_tokens:
        return text, False
    used, end, block = 0.0, 0, 4096
    while end < len(text):
        cost = estimate(text[end : end + block])
        if used + cost > max_tokens:
            for char in text[end : end + block]:
                used += 1 if _CJK.match(char) else 0.25
                if used > max_tokens:
                    break
                end += 1
            break
        used += cost
        end += block
    return text[:end].rstrip(), True


class _Buffer:
    """Text sink that collapses whitespace the way a browser would."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0
        self._newlines = 2  # trailing newlines so far (start counts as a break)
        self._space = False  # a collapsed space is pending

    def text(self, data: str, pre: bool = False) -> None:
        if not pre:
            pending = self._space or data[:1].isspace()
            self._space = data[-1:].isspace()
            data = " ".join(data.split())
            if not data:
                self._space = pending
                return
            if pending and self.parts and not self.parts[-1][-1:].isspace():
                data = " " + data
        self._add(data)

    def markup(self, data: str) -> None:
        self._space = False
        self._add(data)

    def newline(self, count: int = 1) -> None:
        self._space = False
        self._add("\n" * max(count - self._newlines, 0))

    def _add(self, data: str) -> None:
        if data:
            self.parts.append(data)
            self.size += len(data)
            body = data.rstrip("\n")
            tail = len(data) - len(body)
            self._newlines = tail if body else self._newlines + tail

    def value(self) -> str:
        return "".join(self.parts)


@dataclass
class _Table:
    """A table being read: finished rows as markdown, the open row and cell."""

    rows: list[str] = field(default_factory=list)
    row: list[str] | None = None
    cell: _Buffer | None = None
    header: bool = False


_SKIP_TAGS = {
    "script", "style", "noscript", "template", "svg", "nav", "aside",
    "iframe", "object", "canvas", "select", "button", "textarea",
}  # fmt: skip
_CHROME_TAGS = {"header", "footer"}  # dropped unless inside <article>/<main>
_CHROME_ROLES = {"navigation", "banner", "contentinfo", "complementary"}
_VOID_TAGS = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link",
    "meta", "param", "source", "track", "wbr",
}  # fmt: skip
_PARAGRAPH_TAGS = {
    "p", "blockquote", "figure", "section", "article", "main", "dl",
    "address", "details", "h1", "h2", "h3", "h4", "h5", "h6",
}  # fmt: skip
_LINE_TAGS = {"div", "dt", "dd", "figcaption", "summary", "caption", "form", "br"}
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)
# Links, tables and list indents nest at most this deep: each level copies the
# text inside it once more, so unbounded nesting costs quadratic time or worse
# (hostile pages nest thousands deep; real pages a handful). Deeper ones are
# read as plain text.
_MAX_NESTING = 32


class _HtmlToText(HTMLParser):
    """HTML -> markdown-ish text: headings, lists, tables, links; no boilerplate."""

    def __init__(self, base_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base_url = base_url
        self.main = _Buffer()
        self._sinks = [self.main]  # text goes to the last one (links, cells)
        self._links: list[tuple[str, _Buffer]] = []
        self._tables: list[_Table] = []
        self._deep_tables = 0  # <table>s open beyond _MAX_NESTING (read as text)
        self._lists: list[list[int]] = []  # per open list: [ordered, items so far]
        self._skip: tuple[str, int] | None = None  # skipped tag and its nesting
        self._content = 0  # depth of <article>/<main>
        self._pre = 0
        self._titles = {"title": "", "og": ""}
        self._in_title = False

    def _hidden(self, tag: str, attrs: dict[str, str | None]) -> bool:
        chrome = tag in _CHROME_TAGS or attrs.get("role") in _CHROME_ROLES
        return (
            tag in _SKIP_TAGS
            or (chrome and not self._content)
            or "hidden" in attrs
            or (attrs.get("aria-hidden") or "").lower() == "true"
            or bool(_HIDDEN_STYLE.search(attrs.get("style") or ""))
        )

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip is not None:
            if tag == self._skip[0]:
                self._skip = (tag, self._skip[1] + 1)
            return
        attr = {key.lower(): value for key, value in attrs}
        if tag == "title":
            self._in_title = True
        elif tag == "base" and attr.get("href"):
            # A malformed one is ignored, as browsers do.
            self.base_url = _resolved(self.base_url, attr.get("href") or "") or (
                self.base_url
            )
        elif tag == "meta" and attr.get("property") == "og:title":
            self._titles["og"] = " ".join((attr.get("content") or "").split())
        elif tag not in _VOID_TAGS and self._hidden(tag, attr):
            self._skip = (tag, 1)
        else:
            self._open(tag, attr)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID_TAGS:
            self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if self._skip is not None:
            if tag == self._skip[0]:
                depth = self._skip[1] - 1
                self._skip = (tag, depth) if depth else None
        elif tag == "title":
            self._in_title = False
        else:
            self._close(tag)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self._titles["title"] += data
        elif self._skip is None:
            self._sinks[-1].text(data, pre=self._pre > 0)

    def _open(self, tag: str, attr: dict[str, str | None]) -> None:  # noqa: PLR0912
        sink = self._sinks[-1]
        if tag in ("article", "main"):
            self._content += 1
        if tag in _PARAGRAPH_TAGS:
            sink.newline(2)
            if tag[0] == "h" and tag[1:].isdigit():
                sink.markup("#" * int(tag[1]) + " ")
        elif tag in ("ul", "ol"):
            sink.newline(1 if self._lists else 2)
            self._lists.append([tag == "ol", 0])
        elif tag == "li":
            sink.newline(1)
            entry = self._lists[-1] if self._lists else [False, 0]
            entry[1] += 1
            bullet = f"{entry[1]}. " if entry[0] else "- "
            depth = min(len(self._lists) - 1, _MAX_NESTING)
            sink.markup("  " * max(depth, 0) + bullet)
        elif tag == "table":
            sink.newline(2)
            if len(self._tables) < _MAX_NESTING:
                self._tables.append(_Table())
            else:
                self._deep_tables += 1
        elif tag == "tr" and self._tables:
            self._end_row()
            self._tables[-1].row = []
        elif tag in ("td", "th") and self._tables:
            table = self._tables[-1]
            self._end_cell()
            if table.row is None:
                table.row = []
            table.header |= tag == "th" and not table.rows
            table.cell = _Buffer()
            self._sinks.append(table.cell)
        elif tag == "a" and len(self._links) < _MAX_NESTING:
            buffer = _Buffer()
            self._links.append((attr.get("href") or "", buffer))
            self._sinks.append(buffer)
        elif tag == "img" and self._links and attr.get("alt"):
            sink.text(f" {attr.get('alt')} ")
        elif tag == "pre":
            sink.newline(2)
            sink.markup("```\n")
            self._pre += 1
        elif tag in _LINE_TAGS or tag == "hr":
            sink.newline(1)

    def _close(self, tag: str) -> None:
        if tag in ("article", "main"):
            self._content = max(self._content - 1, 0)
        if tag == "a" and self._links and self._sinks[-1] is self._links[-1][1]:
            self._end_link()
        elif tag in ("td", "th"):
            self._end_cell()
        elif tag == "tr" and self._tables:
            self._end_row()
        elif tag == "table" and self._deep_tables:
            self._deep_tables -= 1
            self._sinks[-1].newline(2)
        elif tag == "table" and self._tables:
            self._end_row()
            rows = self._tables.pop().rows
            self._sinks[-1].markup("\n".join(rows))
            self._sinks[-1].newline(2)
        elif tag in ("ul", "ol") and self._lists:
            self._lists.pop()
            self._sinks[-1].newline(1 if self._lists else 2)
        elif tag == "pre" and self._pre:
            self._pre -= 1
            self._sinks[-1].newline(1)
            self._sinks[-1].markup("```")
            self._sinks[-1].newline(2)
        elif tag in _PARAGRAPH_TAGS:
            self._sinks[-1].newline(2)
        elif tag in _LINE_TAGS:
            self._sinks[-1].newline(1)

    def _end_link(self) -> None:
        href, buffer = self._links.pop()
        self._sinks.pop()
        raw = buffer.value()
        text, href = " ".join(raw.split()), href.strip()
        target = _resolved(self.base_url, href)
        useful = (
            text
            and href
            and not href.startswith("#")
            and urlsplit(target).scheme in ("http", "https")
            and text != target
        )
        if useful:  # keep the spacing around the link as it was
            lead = " " if raw[:1].isspace() else ""
            raw = f"{lead}[{text}]({target}){' ' if raw[-1:].isspace() else ''}"
        self._sinks[-1].text(raw)

    def _end_cell(self) -> None:
        table = self._tables[-1] if self._tables else None
        if table is None or table.cell is None or table.cell not in self._sinks:
            return
        while self._sinks[-1] is not table.cell:  # a link left open inside the cell
            self._end_link()
        self._sinks.pop()
        text = " ".join(table.cell.value().split()).replace("|", "\\|")
        table.cell = None
        if table.row is not None:
            table.row.append(text)

    def _end_row(self) -> None:
        self._end_cell()
        table = self._tables[-1]
        if table.row and any(table.row):
            table.rows.append("| " + " | ".join(table.row) + " |")
            if len(table.rows) == 1 and table.header:
                table.rows.append("|" + " --- |" * len(table.row))
        table.row = None

    def result(self) -> tuple[str, str]:
        """(text, title) once parsing is done."""
        while self._links and self._sinks[-1] is self._links[-1][1]:
            self._end_link()  # unclosed <a> at the end of the document
        while self._tables:
            self._close("table")
        lines = [line.rstrip() for line in self.main.value().splitlines()]
        lines = [ln for ln in lines if not re.fullmatch(r"\s*(-|#+|\d+\.)", ln)]
        text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
        heading = re.search(r"^# (.+)$", text, re.M)
        title = " ".join(self._titles["title"].split()) or self._titles["og"]
        return text, title or (heading.group(1) if heading else "")


def _resolved(base_url: str, href: str) -> str:
    """`urljoin`, or "" for a URL it cannot parse (an unbalanced IPv6 bracket).

    One malformed link or `<base href>` must not end the reading of the page.
    """
    try:
        target = urljoin(base_url, href)
        urlsplit(target)  # what the callers do next; it raises on the same URLs
    except ValueError:
        return ""
    return target


def _html_to_text(html: str, base_url: str, char_limit: int) -> tuple[str, str]:
    """Convert HTML, stopping early once far more text than needed is collected."""
    parser = _HtmlToText(base_url)
    try:
        for start in range(0, len(html), 65536):
            parser.feed(html[start : start + 65536])
            if parser.main.size > char_limit:
                break
        parser.close()
    except Exception:  # malformed markup: keep what was parsed
        _debug("HTML parser stopped early")
    return parser.result()


class _ConversionStoppedError(BaseException):
    """The caller of a conversion in a thread stopped waiting for it.

    A BaseException, as asyncio.CancelledError: raised from inside pypdf (see
    `_StoppableBytes`), it must not be caught by pypdf's own recovery from
    broken files (`except Exception`).
    """


class _StoppableBytes(io.BytesIO):
    """A PDF's bytes for pypdf that end the reading once `stop` is set.

    pypdf reads the file lazily, object by object, with `read`: the page tree
    (read whole before the first page: seconds for 20,000 pages) as well as
    each page's contents. Every read is a point where a thread can stop.
    """

    def __init__(self, data: bytes, stop: "threading.Event") -> None:
        """Serve `data` until `stop` is set."""
        super().__init__(data)
        self._stop = stop

    def read(self, size: "int | None" = -1, /) -> bytes:
        """`BytesIO.read`, or _ConversionStoppedError once `stop` is set."""
        if self._stop.is_set():
            raise _ConversionStoppedError
        return super().read(size)


def _pdf_to_text(
    data: bytes, char_limit: int, stop: "threading.Event | None" = None
) -> tuple[str, str]:
    """Extract a PDF's text page by page with pypdf (optional dependency).

    Args:
        data: The PDF's bytes.
        char_limit: Pages are read until their text is longer than this.
        stop: Checked before every page and every read of the file: once set,
            the reading ends with a `_PageError` (a thread converting the PDF
            cannot be killed, but it stops when its caller stopped waiting).

    Returns:
        The pages' text, each under a "--- Page n ---" line, and the title.

    Raises:
        _PageError: The PDF cannot be read, has no text, or `stop` was set.
    """
    try:
        from pypdf import PdfReader  # noqa: PLC0415  (optional dependency)
    except ImportError as exc:
        raise _PageError(
            "reading PDFs needs the optional 'pypdf' package (pip install pypdf)"
        ) from exc
    source = io.BytesIO(data) if stop is None else _StoppableBytes(data, stop)
    try:
        reader = PdfReader(source)
        if reader.is_encrypted:
            reader.decrypt("")
        pages: list[str] = []
        total = 0
        for number, page in enumerate(reader.pages, start=1):
            if stop is not None and stop.is_set():
                raise _ConversionStoppedError
            text = (page.extract_text() or "").strip()
            if text:
                pages.append(f"--- Page {number} ---\n{text}")
                total += len(text)
            if total > char_limit:
                break
        title = str((reader.metadata.title if reader.metadata else "") or "").strip()
    except _ConversionStoppedError:
        raise _PageError("the conversion was stopped") from None
    except Exception as exc:  # pypdf raises many kinds on bad files
        raise _PageError(f"the PDF could not be read ({type(exc).__name__})") from exc
    if not pages:
        raise _PageError("the PDF has no extractable text")
    return "\n\n".join(pages), title


# Main content is looked for only in pages of at most this many tags: the
# library's cost grows with the tags (up to ~100 µs each on hostile shapes),
# so a page costs the worker about two seconds at most. Real articles have a
# few thousand; bigger pages are read whole.
_MAIN_MAX_TAGS = 25_000
# Main content shorter than this (in characters, link targets not counted)
# means the library found none: the whole readable page is used.
_MIN_MAIN_CHARS = 250
# When this share of the main content was link text in the page that lost its
# link (the library drops links in tables and link lists), the page is an
# index, a list of results or a table of links: its links are its content, so
# the whole readable page is used. Articles lose under 0.1 (the page-reading
# benchmark's 91 pages); a front page of headlines over 0.5.
_MAX_LOST_LINK_SHARE = 0.25
_LINK_TARGET = re.compile(r"\]\([^()\s]*(?:\([^()\s]*\)[^()\s]*)*\)")
_ANCHOR = re.compile(r"\[([^\[\]\n]{1,500})\]\(")
_WORD = re.compile(r"\w+")


def _main_content(html: str, base_url: str) -> str:
    """The page's main content as Markdown with links ("" if none or no library).

    trafilatura (optional: installed with the package) drops navigation,
    footers, banners and related-article lists. It reads the tree
    `_cleaned_tree` leaves: what the whole-page reader would never show is
    gone first, whatever the library thinks of it. Its fast mode skips the
    fallback extractors, which cost time without better scores here
    (benchmarks/page_reading.py); `favor_recall` keeps borderline paragraphs.
    """
    if html.count("<") > _MAIN_MAX_TAGS:
        return ""
    try:
        import trafilatura  # noqa: PLC0415  (optional dependency)
    except Exception:  # absent, or broken (lxml without lxml_html_clean)
        return ""
    try:
        tree = trafilatura.load_html(html)
        if tree is None:
            return ""
        text = trafilatura.extract(
            _cleaned_tree(tree, base_url),
            url=base_url or None,
            output_format="markdown",
            include_links=True,
            include_tables=True,
            include_comments=True,
            include_images=False,
            fast=True,
            favor_recall=True,
        )
    except Exception:  # the library failed on this page: the whole page instead
        _debug("main content extraction failed")
        return ""
    if not isinstance(text, str):
        return ""
    return _TRAILING_SPACE.sub("\n", text).strip()


_TRAILING_SPACE = re.compile(r"[ \t]+\n")
# Never read as main content, as the whole-page reader never reads them:
# code, invisible or interactive parts. Navigation, asides, headers and
# footers are left to the library: it tells an article's own from the site's.
_NEVER_MAIN_TAGS = _SKIP_TAGS - {"nav", "aside"}


def _cleaned_tree(tree: Any, base_url: str) -> Any:
    """The lxml tree without what is never shown, its links absolute or gone.

    Hidden elements (the `hidden` attribute, `aria-hidden`, `display:none`)
    carry text no reader sees, a place for instructions aimed at the model.
    A link keeps its target only for http(s) URLs, resolved against the page
    (and its `<base href>`), as the whole-page reader does; other links
    (`javascript:`, in-page anchors) keep only their text.
    """
    for base in tree.iter("base"):
        if base.get("href"):
            base_url = _resolved(base_url, base.get("href") or "") or base_url
            break
    doomed, unlinked = [], []
    for element in tree.iter():
        tag = element.tag
        if not isinstance(tag, str):  # comments, processing instructions
            continue
        if tag.lower() in _NEVER_MAIN_TAGS or _hidden_element(element):
            doomed.append(element)
        elif tag.lower() == "a" and not _resolve_link(element, base_url):
            unlinked.append(element)
    for element in doomed:
        if element.getparent() is not None:
            element.drop_tree()  # keeps the text after it (its tail)
    for element in unlinked:
        if element.getparent() is not None:
            element.drop_tag()  # keeps its text and children
    return tree


def _hidden_element(element: Any) -> bool:
    """Whether the whole-page reader would skip this element as hidden."""
    return (
        element.get("hidden") is not None
        or (element.get("aria-hidden") or "").lower() == "true"
        or bool(_HIDDEN_STYLE.search(element.get("style") or ""))
    )


def _resolve_link(element: Any, base_url: str) -> bool:
    """Make a link's target absolute; False when it leads nowhere useful."""
    href = (element.get("href") or "").strip()
    target = _resolved(base_url, href) if href else ""
    if href.startswith("#") or urlsplit(target).scheme not in ("http", "https"):
        return False
    element.set("href", target)
    return True


def _plain_size(markdown: str) -> int:
    """Characters of text in Markdown, without link targets."""
    return len(_LINK_TARGET.sub("]", markdown))


def _lost_link_share(whole: str, main: str) -> float:
    """Share of `main` that was link text in `whole` and is no longer a link.

    Linear: a lost link counts when its first three words are three words of
    the main content in a row (shorter link texts, "Home", "user42", are
    never what makes a page an index).
    """
    words = _WORD.findall(_LINK_TARGET.sub("]", main))
    runs = set(zip(words, words[1:], words[2:], strict=False))
    kept = set(_ANCHOR.findall(main))
    lost = 0
    for anchor in set(_ANCHOR.findall(whole)) - kept:
        first = tuple(_WORD.findall(anchor)[:3])
        if len(first) == 3 and first in runs:
            lost += len(anchor)
    return lost / max(_plain_size(main), 1)


def _read_html(
    html: str,
    base_url: str,
    char_limit: int,
    read_whole: "Callable[[str, str, int], tuple[str, str]]" = _html_to_text,
    read_main: "Callable[[str, str], str] | None" = _main_content,
) -> tuple[str, str, str, int]:
    """(text, title, reading, page_chars): the main content, else the whole page.

    The whole page when the library found too little, dropped the links that
    make the page what it is, or saved nothing (a page that is all article
    reads better in the whole-page reader's own format).
    """
    whole, title = read_whole(html, base_url, char_limit)
    main = read_main(html, base_url) if read_main is not None else ""
    whole_complete = len(whole) < char_limit  # else the reader stopped early
    if (
        _plain_size(main) < _MIN_MAIN_CHARS
        or _lost_link_share(whole, main) >= _MAX_LOST_LINK_SHARE
        or (whole_complete and len(main) >= len(whole))
    ):
        return whole, title, "whole", len(whole)
    return main, title, "main", len(whole)


def _convert(
    raw: _RawPage,
    max_tokens: int,
    read_whole: "Callable[[str, str, int], tuple[str, str]]" = _html_to_text,
    read_main: "Callable[[str, str], str] | None" = _main_content,
    read_pdf: "Callable[[bytes, int], tuple[str, str]]" = _pdf_to_text,
) -> _Page:
    """Bytes -> `_Page` (in a worker process, or a thread: never on the loop)."""
    if not raw.body or raw.body.isspace():  # no copy of a multi-MB body
        raise _PageError("the page is empty")
    kind, label = _classify(raw.content_type, raw.body)
    char_limit = max_tokens * 5
    reading, page_chars = "document", 0
    if kind == "binary":
        raise _PageError(f"the URL points to {label}, not a readable page")
    if kind == "pdf":
        if raw.truncated:
            raise _PageError("the PDF is larger than the download limit")
        text, title = read_pdf(raw.body, char_limit)
    elif kind == "html":
        html = _decode(raw.body, raw.content_type, html=True)
        text, title, reading, page_chars = _read_html(
            html, raw.final_url, char_limit, read_whole, read_main
        )
    else:
        text, title = _decode(raw.body, raw.content_type, html=False).strip(), ""
    if not text.strip():
        raise _PageError("the page has no readable text")
    if reading == "document":
        page_chars = len(text)
    page = _Page(raw.final_url, title, text, raw.redirects, reading, page_chars)
    return _fitted(page, max_tokens, raw.truncated)


def _fitted(page: _Page, max_tokens: int, already_cut: bool = False) -> _Page:
    """The page cut to the token budget, with a note when anything was cut."""
    text, cut = _fit_budget(page.text, max_tokens)
    if cut or already_cut:
        text = f"{text}\n\n{TRUNCATION_NOTE}"
    return _Page(
        page.final_url,
        page.title,
        text,
        page.redirects,
        page.reading,
        page.page_chars,
    )


def _converter_main() -> None:
    """The converter worker: converts page after page until its stdin closes.

    After the program itself (read by `_CHILD_BOOT`), stdin holds one setup
    line ({"path": the server's sys.path, "warm": modules to import now, so
    every page after the first finds them loaded}); the worker answers
    "ready". Then, per page: a JSON header line (size, url, content_type,
    cut, max_tokens, seconds), the body, and one JSON answer line out:
    {"title", "text", "reading", "page_chars"}, or {"error"} when the page
    itself cannot be converted.
    A page error never ends the worker; the server kills it when a page takes
    too long, and `seconds` makes it end itself should the server be gone.
    """
    stdin = sys.stdin.buffer
    setup = json.loads(stdin.readline())
    sys.path[:] = setup["path"]  # import pypdf from where the server would
    for name in setup["warm"]:
        try:
            __import__(name)
        except Exception:  # optional: the page that needs it reports it
            _debug(f"no {name} in the converter")
    # From here on stderr goes nowhere: nobody drains the pipe while pages are
    # converted, and a library's warnings would fill it and block the worker.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    _answer({"ready": True})
    while True:
        line = stdin.readline()
        if not line:
            return  # the server closed the pipe (or exited): so do we
        job = json.loads(line)
        raw = _RawPage(
            job["url"], stdin.read(job["size"]), job["content_type"], job["cut"]
        )
        if hasattr(signal, "alarm"):
            signal.alarm(job["seconds"])  # SIGALRM ends an orphaned worker
        try:
            page = _convert(raw, job["max_tokens"])
            answer = {
                "title": page.title,
                "text": page.text,
                "reading": page.reading,
                "page_chars": page.page_chars,
            }
        except _PageError as exc:
            answer = {"error": str(exc)}
        except Exception as exc:  # the page broke the converter: still a page error
            reason = type(exc).__name__
            answer = {"error": f"the page could not be converted ({reason})"}
        if hasattr(signal, "alarm"):
            signal.alarm(0)
        _answer(answer)


def _answer(answer: dict) -> None:
    # ASCII JSON: any text (lone surrogates from odd PDF fonts included) survives.
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


# --- end shared: convert ---


# --- source: convert (made from tools/visit/convert.py) ---
_CONVERT_SOURCE = r'''
"""Convert: downloaded bytes -> readable text (HTML, PDF, plain text), in budget.

This module is also the whole program of the visit tool's converter process:
the generator writes its source, as it is, into visit_tool.py, and the worker
sends it to each new process, which then runs `_converter_main`. So it uses
only the standard library (pypdf and trafilatura imported where used) and
names it defines itself; it never imports `logging` (10 ms of every worker's
start). tests/test_visit_process.py runs it in a process.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code.

import codecs
import io
import json
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

# --- snippet ---

TRUNCATION_NOTE = "[Page truncated to fit the reading budget]"


def _debug(message: str) -> None:
    """Log the exception being handled at DEBUG, where the process logs at all.

    In the server that is the tool's logger; a converter process never imports
    `logging` for it (a library it loads may: then its records go nowhere).
    """
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger(__name__).debug(message, exc_info=True)


class _PageError(Exception):
    """The page could not be read or converted; the message is a short reason."""


class _MangledFileError(Exception):
    """Open WebUI's loader returned a file's bytes decoded as text, lossily.

    A compressed PDF's text exists only in its exact bytes, so such a file is
    downloaded again by the built-in fetcher (same checked URL, same checks).
    """


@dataclass
class _RawPage:
    """Bytes as downloaded, before conversion."""

    final_url: str
    body: bytes
    content_type: str
    truncated: bool = False
    redirects: list[str] = field(default_factory=list)


@dataclass
class _Page:
    """A readable page: text within the budget, plus where it came from.

    `reading` says what of the page `text` is: "main" (its main content),
    "whole" (the whole readable page), "document" (a PDF or a text file,
    unchanged), "loader" (the text Open WebUI's loader returned, unchanged)
    or "" (not known); `page_chars` is the length of the whole readable page,
    for the status line and the source card.
    """

    final_url: str
    title: str
    text: str
    redirects: list[str] = field(default_factory=list)
    reading: str = ""
    page_chars: int = 0


_BINARY_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"PK\x03\x04", "a ZIP archive or Office document"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf", "a 7-Zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"ID3", "an MP3 audio file"),
    (b"OggS", "an Ogg media file"),
    (b"\x00asm", "a WebAssembly binary"),
    (b"\x7fELF", "an executable"),
    (b"\xd0\xcf\x11\xe0", "a legacy Office document"),
)
_HTML_MARKER = re.compile(
    rb"<(!doctype\s+html|html|head|body|title|meta|p|div)[\s>/]", re.I
)
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml")
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([\w.:-]+)""", re.I)
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def _classify(content_type: str, body: bytes) -> tuple[str, str]:
    """("pdf" | "html" | "text" | "binary", label) from headers AND the bytes."""
    mime = content_type.split(";", maxsplit=1)[0].strip().lower()
    head = body[:2048].lstrip(b"\xef\xbb\xbf \t\r\n")
    if b"%PDF-" in body[:1024]:
        return "pdf", "a PDF"
    label = next((name for magic, name in _BINARY_MAGIC if head.startswith(magic)), "")
    if head[4:8] == b"ftyp" or (
        head.startswith(b"RIFF") and head[8:12] in (b"WEBP", b"WAVE", b"AVI ")
    ):
        label = "a media file"
    looks_html = bool(_HTML_MARKER.search(head))
    declared_text = mime.startswith(_TEXT_TYPES) or mime.endswith(("+json", "+xml"))
    wide = body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    if not (label or looks_html or wide):
        sample = body[:4096]
        garbled = sample.decode("utf-8", "replace").count("\ufffd") > 8
        if b"\x00" in sample or (garbled and not declared_text):
            label = f"a binary file ({mime or 'unknown type'})"
    if not label and mime.startswith(("image/", "audio/", "video/", "font/")):
        label = f"a binary file ({mime})"
    if label:
        return "binary", label
    if mime in _HTML_TYPES or (looks_html and not declared_text):
        return "html", "an HTML page"
    return "text", mime or "text"


def _decode(body: bytes, content_type: str, html: bool) -> str:
    """Decode by BOM, then header charset, then <meta charset>, else UTF-8."""
    for bom, codec in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF32_LE, "utf-32"),
        (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if body.startswith(bom):
            return body.decode(codec, errors="replace")
    declared = re.findall(r"charset\s*=\s*[\"']?([\w.:-]+)", content_type, re.I)
    if html:
        declared += [m.decode("ascii", "ignore") for m in _CHARSET.findall(body[:4096])]
    for name in declared:
        codec = _page_codec(name)
        if codec is None:
            continue
        try:
            return body.decode(codec, errors="replace")
        except (UnicodeError, LookupError, ValueError):  # a codec without "replace"
            continue
    return body.decode("utf-8", errors="replace")


# Text codecs Python has but no web page is written in: they transform text
# (escapes, host names) rather than encode it, and some refuse errors="replace".
_NOT_PAGE_CODECS = {"idna", "punycode", "unicode-escape", "raw-unicode-escape", "utf-7"}


def _page_codec(name: str) -> str | None:
    """The codec a declared charset names, if a page can be decoded with it.

    Only real text encodings: "rot13", "base64", "zlib", "hex" … are bytes or
    str transforms (`bytes.decode` raises on them). A BOM-less UTF-16/32
    declaration is almost always wrong, so it is ignored too.
    """
    try:
        info = codecs.lookup(name)
    except LookupError:
        return None
    codec = info.name
    if not getattr(info, "_is_text_encoding", True) or codec in _NOT_PAGE_CODECS:
        return None
    if codec.startswith(("utf-16", "utf-32")):
        return None
    return codec


def _estimate_tokens(text: str) -> float:
    """~4 characters per token for Latin text, one token per CJK character."""
    cjk = len(text) - len(_CJK.sub("", text))
    return cjk + (len(text) - cjk) / 4


def _fit_budget(
    text: str,
    max_tokens: int,
    estimate: "Callable[[str], float]" = _estimate_tokens,
) -> tuple[str, bool]:
    """Cut text to the token budget.

    Args:
        text: The page text.
        max_tokens: The reading budget.
        estimate: Counts the tokens of a piece of text (`_estimate_tokens`;
            tests watch what it is given).

    Returns:
        The text that fits, and True when something was cut.
    """
    # Every character costs at least a quarter token, so a longer text cannot
    # fit: skip the estimate, a regex pass over megabytes that holds the GIL.
    if len(text) <= 4 * max_tokens and estimate(text) <= max_tokens:
        return text, False
    used, end, block = 0.0, 0, 4096
    while end < len(text):
        cost = estimate(text[end : end + block])
        if used + cost > max_tokens:
            for char in text[end : end + block]:
                used += 1 if _CJK.match(char) else 0.25
                if used > max_tokens:
                    break
                end += 1
            break
        used += cost
        end += block
    return text[:end].rstrip(), True


class _Buffer:
    """Text sink that collapses whitespace the way a browser would."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0
        self._newlines = 2  # trailing newlines so far (start counts as a break)
        self._space = False  # a collapsed space is pending

    def text(self, data: str, pre: bool = False) -> None:
        if not pre:
            pending = self._space or data[:1].isspace()
            self._space = data[-1:].isspace()
            data = " ".join(data.split())
            if not data:
                self._space = pending
                return
            if pending and self.parts and not self.parts[-1][-1:].isspace():
                data = " " + data
        self._add(data)

    def markup(self, data: str) -> None:
        self._space = False
        self._add(data)

    def newline(self, count: int = 1) -> None:
        self._space = False
        self._add("\n" * max(count - self._newlines, 0))

    def _add(self, data: str) -> None:
        if data:
            self.parts.append(data)
            self.size += len(data)
            body = data.rstrip("\n")
            tail = len(data) - len(body)
            self._newlines = tail if body else self._newlines + tail

    def value(self) -> str:
        return "".join(self.parts)


@dataclass
class _Table:
    """A table being read: finished rows as markdown, the open row and cell."""

    rows: list[str] = field(default_factory=list)
    row: list[str] | None = None
    cell: _Buffer | None = None
    header: bool = False


_SKIP_TAGS = {
    "script", "style", "noscript", "template", "svg", "nav", "aside",
    "iframe", "object", "canvas", "select", "button", "textarea",
}  # fmt: skip
_CHROME_TAGS = {"header", "footer"}  # dropped unless inside <article>/<main>
_CHROME_ROLES = {"navigation", "banner", "contentinfo", "complementary"}
_VOID_TAGS = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link",
    "meta", "param", "source", "track", "wbr",
}  # fmt: skip
_PARAGRAPH_TAGS = {
    "p", "blockquote", "figure", "section", "article", "main", "dl",
    "address", "details", "h1", "h2", "h3", "h4", "h5", "h6",
}  # fmt: skip
_LINE_TAGS = {"div", "dt", "dd", "figcaption", "summary", "caption", "form", "br"}
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)
# Links, tables and list indents nest at most this deep: each level copies the
# text inside it once more, so unbounded nesting costs quadratic time or worse
# (hostile pages nest thousands deep; real pages a handful). Deeper ones are
# read as plain text.
_MAX_NESTING = 32


class _HtmlToText(HTMLParser):
    """HTML -> markdown-ish text: headings, lists, tables, links; no boilerplate."""

    def __init__(self, base_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base_url = base_url
        self.main = _Buffer()
        self._sinks = [self.main]  # text goes to the last one (links, cells)
        self._links: list[tuple[str, _Buffer]] = []
        self._tables: list[_Table] = []
        self._deep_tables = 0  # <table>s open beyond _MAX_NESTING (read as text)
        self._lists: list[list[int]] = []  # per open list: [ordered, items so far]
        self._skip: tuple[str, int] | None = None  # skipped tag and its nesting
        self._content = 0  # depth of <article>/<main>
        self._pre = 0
        self._titles = {"title": "", "og": ""}
        self._in_title = False

    def _hidden(self, tag: str, attrs: dict[str, str | None]) -> bool:
        chrome = tag in _CHROME_TAGS or attrs.get("role") in _CHROME_ROLES
        return (
            tag in _SKIP_TAGS
            or (chrome and not self._content)
            or "hidden" in attrs
            or (attrs.get("aria-hidden") or "").lower() == "true"
            or bool(_HIDDEN_STYLE.search(attrs.get("style") or ""))
        )

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip is not None:
            if tag == self._skip[0]:
                self._skip = (tag, self._skip[1] + 1)
            return
        attr = {key.lower(): value for key, value in attrs}
        if tag == "title":
            self._in_title = True
        elif tag == "base" and attr.get("href"):
            # A malformed one is ignored, as browsers do.
            self.base_url = _resolved(self.base_url, attr.get("href") or "") or (
                self.base_url
            )
        elif tag == "meta" and attr.get("property") == "og:title":
            self._titles["og"] = " ".join((attr.get("content") or "").split())
        elif tag not in _VOID_TAGS and self._hidden(tag, attr):
            self._skip = (tag, 1)
        else:
            self._open(tag, attr)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID_TAGS:
            self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if self._skip is not None:
            if tag == self._skip[0]:
                depth = self._skip[1] - 1
                self._skip = (tag, depth) if depth else None
        elif tag == "title":
            self._in_title = False
        else:
            self._close(tag)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self._titles["title"] += data
        elif self._skip is None:
            self._sinks[-1].text(data, pre=self._pre > 0)

    def _open(self, tag: str, attr: dict[str, str | None]) -> None:  # noqa: PLR0912
        sink = self._sinks[-1]
        if tag in ("article", "main"):
            self._content += 1
        if tag in _PARAGRAPH_TAGS:
            sink.newline(2)
            if tag[0] == "h" and tag[1:].isdigit():
                sink.markup("#" * int(tag[1]) + " ")
        elif tag in ("ul", "ol"):
            sink.newline(1 if self._lists else 2)
            self._lists.append([tag == "ol", 0])
        elif tag == "li":
            sink.newline(1)
            entry = self._lists[-1] if self._lists else [False, 0]
            entry[1] += 1
            bullet = f"{entry[1]}. " if entry[0] else "- "
            depth = min(len(self._lists) - 1, _MAX_NESTING)
            sink.markup("  " * max(depth, 0) + bullet)
        elif tag == "table":
            sink.newline(2)
            if len(self._tables) < _MAX_NESTING:
                self._tables.append(_Table())
            else:
                self._deep_tables += 1
        elif tag == "tr" and self._tables:
            self._end_row()
            self._tables[-1].row = []
        elif tag in ("td", "th") and self._tables:
            table = self._tables[-1]
            self._end_cell()
            if table.row is None:
                table.row = []
            table.header |= tag == "th" and not table.rows
            table.cell = _Buffer()
            self._sinks.append(table.cell)
        elif tag == "a" and len(self._links) < _MAX_NESTING:
            buffer = _Buffer()
            self._links.append((attr.get("href") or "", buffer))
            self._sinks.append(buffer)
        elif tag == "img" and self._links and attr.get("alt"):
            sink.text(f" {attr.get('alt')} ")
        elif tag == "pre":
            sink.newline(2)
            sink.markup("```\n")
            self._pre += 1
        elif tag in _LINE_TAGS or tag == "hr":
            sink.newline(1)

    def _close(self, tag: str) -> None:
        if tag in ("article", "main"):
            self._content = max(self._content - 1, 0)
        if tag == "a" and self._links and self._sinks[-1] is self._links[-1][1]:
            self._end_link()
        elif tag in ("td", "th"):
            self._end_cell()
        elif tag == "tr" and self._tables:
            self._end_row()
        elif tag == "table" and self._deep_tables:
            self._deep_tables -= 1
            self._sinks[-1].newline(2)
        elif tag == "table" and self._tables:
            self._end_row()
            rows = self._tables.pop().rows
            self._sinks[-1].markup("\n".join(rows))
            self._sinks[-1].newline(2)
        elif tag in ("ul", "ol") and self._lists:
            self._lists.pop()
            self._sinks[-1].newline(1 if self._lists else 2)
        elif tag == "pre" and self._pre:
            self._pre -= 1
            self._sinks[-1].newline(1)
            self._sinks[-1].markup("```")
            self._sinks[-1].newline(2)
        elif tag in _PARAGRAPH_TAGS:
            self._sinks[-1].newline(2)
        elif tag in _LINE_TAGS:
            self._sinks[-1].newline(1)

    def _end_link(self) -> None:
        href, buffer = self._links.pop()
        self._sinks.pop()
        raw = buffer.value()
        text, href = " ".join(raw.split()), href.strip()
        target = _resolved(self.base_url, href)
        useful = (
            text
            and href
            and not href.startswith("#")
            and urlsplit(target).scheme in ("http", "https")
            and text != target
        )
        if useful:  # keep the spacing around the link as it was
            lead = " " if raw[:1].isspace() else ""
            raw = f"{lead}[{text}]({target}){' ' if raw[-1:].isspace() else ''}"
        self._sinks[-1].text(raw)

    def _end_cell(self) -> None:
        table = self._tables[-1] if self._tables else None
        if table is None or table.cell is None or table.cell not in self._sinks:
            return
        while self._sinks[-1] is not table.cell:  # a link left open inside the cell
            self._end_link()
        self._sinks.pop()
        text = " ".join(table.cell.value().split()).replace("|", "\\|")
        table.cell = None
        if table.row is not None:
            table.row.append(text)

    def _end_row(self) -> None:
        self._end_cell()
        table = self._tables[-1]
        if table.row and any(table.row):
            table.rows.append("| " + " | ".join(table.row) + " |")
            if len(table.rows) == 1 and table.header:
                table.rows.append("|" + " --- |" * len(table.row))
        table.row = None

    def result(self) -> tuple[str, str]:
        """(text, title) once parsing is done."""
        while self._links and self._sinks[-1] is self._links[-1][1]:
            self._end_link()  # unclosed <a> at the end of the document
        while self._tables:
            self._close("table")
        lines = [line.rstrip() for line in self.main.value().splitlines()]
        lines = [ln for ln in lines if not re.fullmatch(r"\s*(-|#+|\d+\.)", ln)]
        text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
        heading = re.search(r"^# (.+)$", text, re.M)
        title = " ".join(self._titles["title"].split()) or self._titles["og"]
        return text, title or (heading.group(1) if heading else "")


def _resolved(base_url: str, href: str) -> str:
    """`urljoin`, or "" for a URL it cannot parse (an unbalanced IPv6 bracket).

    One malformed link or `<base href>` must not end the reading of the page.
    """
    try:
        target = urljoin(base_url, href)
        urlsplit(target)  # what the callers do next; it raises on the same URLs
    except ValueError:
        return ""
    return target


def _html_to_text(html: str, base_url: str, char_limit: int) -> tuple[str, str]:
    """Convert HTML, stopping early once far more text than needed is collected."""
    parser = _HtmlToText(base_url)
    try:
        for start in range(0, len(html), 65536):
            parser.feed(html[start : start + 65536])
            if parser.main.size > char_limit:
                break
        parser.close()
    except Exception:  # malformed markup: keep what was parsed
        _debug("HTML parser stopped early")
    return parser.result()


class _ConversionStoppedError(BaseException):
    """The caller of a conversion in a thread stopped waiting for it.

    A BaseException, as asyncio.CancelledError: raised from inside pypdf (see
    `_StoppableBytes`), it must not be caught by pypdf's own recovery from
    broken files (`except Exception`).
    """


class _StoppableBytes(io.BytesIO):
    """A PDF's bytes for pypdf that end the reading once `stop` is set.

    pypdf reads the file lazily, object by object, with `read`: the page tree
    (read whole before the first page: seconds for 20,000 pages) as well as
    each page's contents. Every read is a point where a thread can stop.
    """

    def __init__(self, data: bytes, stop: "threading.Event") -> None:
        """Serve `data` until `stop` is set."""
        super().__init__(data)
        self._stop = stop

    def read(self, size: "int | None" = -1, /) -> bytes:
        """`BytesIO.read`, or _ConversionStoppedError once `stop` is set."""
        if self._stop.is_set():
            raise _ConversionStoppedError
        return super().read(size)


def _pdf_to_text(
    data: bytes, char_limit: int, stop: "threading.Event | None" = None
) -> tuple[str, str]:
    """Extract a PDF's text page by page with pypdf (optional dependency).

    Args:
        data: The PDF's bytes.
        char_limit: Pages are read until their text is longer than this.
        stop: Checked before every page and every read of the file: once set,
            the reading ends with a `_PageError` (a thread converting the PDF
            cannot be killed, but it stops when its caller stopped waiting).

    Returns:
        The pages' text, each under a "--- Page n ---" line, and the title.

    Raises:
        _PageError: The PDF cannot be read, has no text, or `stop` was set.
    """
    try:
        from pypdf import PdfReader  # noqa: PLC0415  (optional dependency)
    except ImportError as exc:
        raise _PageError(
            "reading PDFs needs the optional 'pypdf' package (pip install pypdf)"
        ) from exc
    source = io.BytesIO(data) if stop is None else _StoppableBytes(data, stop)
    try:
        reader = PdfReader(source)
        if reader.is_encrypted:
            reader.decrypt("")
        pages: list[str] = []
        total = 0
        for number, page in enumerate(reader.pages, start=1):
            if stop is not None and stop.is_set():
                raise _ConversionStoppedError
            text = (page.extract_text() or "").strip()
            if text:
                pages.append(f"--- Page {number} ---\n{text}")
                total += len(text)
            if total > char_limit:
                break
        title = str((reader.metadata.title if reader.metadata else "") or "").strip()
    except _ConversionStoppedError:
        raise _PageError("the conversion was stopped") from None
    except Exception as exc:  # pypdf raises many kinds on bad files
        raise _PageError(f"the PDF could not be read ({type(exc).__name__})") from exc
    if not pages:
        raise _PageError("the PDF has no extractable text")
    return "\n\n".join(pages), title


# Main content is looked for only in pages of at most this many tags: the
# library's cost grows with the tags (up to ~100 µs each on hostile shapes),
# so a page costs the worker about two seconds at most. Real articles have a
# few thousand; bigger pages are read whole.
_MAIN_MAX_TAGS = 25_000
# Main content shorter than this (in characters, link targets not counted)
# means the library found none: the whole readable page is used.
_MIN_MAIN_CHARS = 250
# When this share of the main content was link text in the page that lost its
# link (the library drops links in tables and link lists), the page is an
# index, a list of results or a table of links: its links are its content, so
# the whole readable page is used. Articles lose under 0.1 (the page-reading
# benchmark's 91 pages); a front page of headlines over 0.5.
_MAX_LOST_LINK_SHARE = 0.25
_LINK_TARGET = re.compile(r"\]\([^()\s]*(?:\([^()\s]*\)[^()\s]*)*\)")
_ANCHOR = re.compile(r"\[([^\[\]\n]{1,500})\]\(")
_WORD = re.compile(r"\w+")


def _main_content(html: str, base_url: str) -> str:
    """The page's main content as Markdown with links ("" if none or no library).

    trafilatura (optional: installed with the package) drops navigation,
    footers, banners and related-article lists. It reads the tree
    `_cleaned_tree` leaves: what the whole-page reader would never show is
    gone first, whatever the library thinks of it. Its fast mode skips the
    fallback extractors, which cost time without better scores here
    (benchmarks/page_reading.py); `favor_recall` keeps borderline paragraphs.
    """
    if html.count("<") > _MAIN_MAX_TAGS:
        return ""
    try:
        import trafilatura  # noqa: PLC0415  (optional dependency)
    except Exception:  # absent, or broken (lxml without lxml_html_clean)
        return ""
    try:
        tree = trafilatura.load_html(html)
        if tree is None:
            return ""
        text = trafilatura.extract(
            _cleaned_tree(tree, base_url),
            url=base_url or None,
            output_format="markdown",
            include_links=True,
            include_tables=True,
            include_comments=True,
            include_images=False,
            fast=True,
            favor_recall=True,
        )
    except Exception:  # the library failed on this page: the whole page instead
        _debug("main content extraction failed")
        return ""
    if not isinstance(text, str):
        return ""
    return _TRAILING_SPACE.sub("\n", text).strip()


_TRAILING_SPACE = re.compile(r"[ \t]+\n")
# Never read as main content, as the whole-page reader never reads them:
# code, invisible or interactive parts. Navigation, asides, headers and
# footers are left to the library: it tells an article's own from the site's.
_NEVER_MAIN_TAGS = _SKIP_TAGS - {"nav", "aside"}


def _cleaned_tree(tree: Any, base_url: str) -> Any:
    """The lxml tree without what is never shown, its links absolute or gone.

    Hidden elements (the `hidden` attribute, `aria-hidden`, `display:none`)
    carry text no reader sees, a place for instructions aimed at the model.
    A link keeps its target only for http(s) URLs, resolved against the page
    (and its `<base href>`), as the whole-page reader does; other links
    (`javascript:`, in-page anchors) keep only their text.
    """
    for base in tree.iter("base"):
        if base.get("href"):
            base_url = _resolved(base_url, base.get("href") or "") or base_url
            break
    doomed, unlinked = [], []
    for element in tree.iter():
        tag = element.tag
        if not isinstance(tag, str):  # comments, processing instructions
            continue
        if tag.lower() in _NEVER_MAIN_TAGS or _hidden_element(element):
            doomed.append(element)
        elif tag.lower() == "a" and not _resolve_link(element, base_url):
            unlinked.append(element)
    for element in doomed:
        if element.getparent() is not None:
            element.drop_tree()  # keeps the text after it (its tail)
    for element in unlinked:
        if element.getparent() is not None:
            element.drop_tag()  # keeps its text and children
    return tree


def _hidden_element(element: Any) -> bool:
    """Whether the whole-page reader would skip this element as hidden."""
    return (
        element.get("hidden") is not None
        or (element.get("aria-hidden") or "").lower() == "true"
        or bool(_HIDDEN_STYLE.search(element.get("style") or ""))
    )


def _resolve_link(element: Any, base_url: str) -> bool:
    """Make a link's target absolute; False when it leads nowhere useful."""
    href = (element.get("href") or "").strip()
    target = _resolved(base_url, href) if href else ""
    if href.startswith("#") or urlsplit(target).scheme not in ("http", "https"):
        return False
    element.set("href", target)
    return True


def _plain_size(markdown: str) -> int:
    """Characters of text in Markdown, without link targets."""
    return len(_LINK_TARGET.sub("]", markdown))


def _lost_link_share(whole: str, main: str) -> float:
    """Share of `main` that was link text in `whole` and is no longer a link.

    Linear: a lost link counts when its first three words are three words of
    the main content in a row (shorter link texts, "Home", "user42", are
    never what makes a page an index).
    """
    words = _WORD.findall(_LINK_TARGET.sub("]", main))
    runs = set(zip(words, words[1:], words[2:], strict=False))
    kept = set(_ANCHOR.findall(main))
    lost = 0
    for anchor in set(_ANCHOR.findall(whole)) - kept:
        first = tuple(_WORD.findall(anchor)[:3])
        if len(first) == 3 and first in runs:
            lost += len(anchor)
    return lost / max(_plain_size(main), 1)


def _read_html(
    html: str,
    base_url: str,
    char_limit: int,
    read_whole: "Callable[[str, str, int], tuple[str, str]]" = _html_to_text,
    read_main: "Callable[[str, str], str] | None" = _main_content,
) -> tuple[str, str, str, int]:
    """(text, title, reading, page_chars): the main content, else the whole page.

    The whole page when the library found too little, dropped the links that
    make the page what it is, or saved nothing (a page that is all article
    reads better in the whole-page reader's own format).
    """
    whole, title = read_whole(html, base_url, char_limit)
    main = read_main(html, base_url) if read_main is not None else ""
    whole_complete = len(whole) < char_limit  # else the reader stopped early
    if (
        _plain_size(main) < _MIN_MAIN_CHARS
        or _lost_link_share(whole, main) >= _MAX_LOST_LINK_SHARE
        or (whole_complete and len(main) >= len(whole))
    ):
        return whole, title, "whole", len(whole)
    return main, title, "main", len(whole)


def _convert(
    raw: _RawPage,
    max_tokens: int,
    read_whole: "Callable[[str, str, int], tuple[str, str]]" = _html_to_text,
    read_main: "Callable[[str, str], str] | None" = _main_content,
    read_pdf: "Callable[[bytes, int], tuple[str, str]]" = _pdf_to_text,
) -> _Page:
    """Bytes -> `_Page` (in a worker process, or a thread: never on the loop)."""
    if not raw.body or raw.body.isspace():  # no copy of a multi-MB body
        raise _PageError("the page is empty")
    kind, label = _classify(raw.content_type, raw.body)
    char_limit = max_tokens * 5
    reading, page_chars = "document", 0
    if kind == "binary":
        raise _PageError(f"the URL points to {label}, not a readable page")
    if kind == "pdf":
        if raw.truncated:
            raise _PageError("the PDF is larger than the download limit")
        text, title = read_pdf(raw.body, char_limit)
    elif kind == "html":
        html = _decode(raw.body, raw.content_type, html=True)
        text, title, reading, page_chars = _read_html(
            html, raw.final_url, char_limit, read_whole, read_main
        )
    else:
        text, title = _decode(raw.body, raw.content_type, html=False).strip(), ""
    if not text.strip():
        raise _PageError("the page has no readable text")
    if reading == "document":
        page_chars = len(text)
    page = _Page(raw.final_url, title, text, raw.redirects, reading, page_chars)
    return _fitted(page, max_tokens, raw.truncated)


def _fitted(page: _Page, max_tokens: int, already_cut: bool = False) -> _Page:
    """The page cut to the token budget, with a note when anything was cut."""
    text, cut = _fit_budget(page.text, max_tokens)
    if cut or already_cut:
        text = f"{text}\n\n{TRUNCATION_NOTE}"
    return _Page(
        page.final_url,
        page.title,
        text,
        page.redirects,
        page.reading,
        page.page_chars,
    )


def _converter_main() -> None:
    """The converter worker: converts page after page until its stdin closes.

    After the program itself (read by `_CHILD_BOOT`), stdin holds one setup
    line ({"path": the server's sys.path, "warm": modules to import now, so
    every page after the first finds them loaded}); the worker answers
    "ready". Then, per page: a JSON header line (size, url, content_type,
    cut, max_tokens, seconds), the body, and one JSON answer line out:
    {"title", "text", "reading", "page_chars"}, or {"error"} when the page
    itself cannot be converted.
    A page error never ends the worker; the server kills it when a page takes
    too long, and `seconds` makes it end itself should the server be gone.
    """
    stdin = sys.stdin.buffer
    setup = json.loads(stdin.readline())
    sys.path[:] = setup["path"]  # import pypdf from where the server would
    for name in setup["warm"]:
        try:
            __import__(name)
        except Exception:  # optional: the page that needs it reports it
            _debug(f"no {name} in the converter")
    # From here on stderr goes nowhere: nobody drains the pipe while pages are
    # converted, and a library's warnings would fill it and block the worker.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    _answer({"ready": True})
    while True:
        line = stdin.readline()
        if not line:
            return  # the server closed the pipe (or exited): so do we
        job = json.loads(line)
        raw = _RawPage(
            job["url"], stdin.read(job["size"]), job["content_type"], job["cut"]
        )
        if hasattr(signal, "alarm"):
            signal.alarm(job["seconds"])  # SIGALRM ends an orphaned worker
        try:
            page = _convert(raw, job["max_tokens"])
            answer = {
                "title": page.title,
                "text": page.text,
                "reading": page.reading,
                "page_chars": page.page_chars,
            }
        except _PageError as exc:
            answer = {"error": str(exc)}
        except Exception as exc:  # the page broke the converter: still a page error
            reason = type(exc).__name__
            answer = {"error": f"the page could not be converted ({reason})"}
        if hasattr(signal, "alarm"):
            signal.alarm(0)
        _answer(answer)


def _answer(answer: dict) -> None:
    # ASCII JSON: any text (lone surrogates from odd PDF fonts included) survives.
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
'''.removeprefix("\n")


# --- end source: convert ---


# --- shared: thread_fallback (made from tools/visit/thread_fallback.py) ---
# A backstop for callers without a deadline of their own, in a thread or in a
# converter process (which also ends itself after this long on one page,
# should the server be gone).
_MAX_CONVERT_SECONDS = 600


# Without a worker process, HTML is read up to this many characters and tags
# (a 1 MB article has ~40,000): the reader is linear at ~10 µs a tag, so this
# caps the thread's time at about half a second whatever the page.
_FALLBACK_MAX_HTML_CHARS = 1_500_000
_FALLBACK_MAX_TAGS = 50_000
_FALLBACK_TAG = re.compile(r"(/?)([a-zA-Z][^\s/>]*)")
# An unterminated quote runs to the end of the tag instead of failing, so no
# attribute is ever scanned twice.
_FALLBACK_ATTRIBUTE = re.compile(
    r"""([^\s"'>/=]+)(?:\s*=\s*(?:"([^"]*)"?|'([^']*)'?|([^\s>]*)))?"""
)


# The stop signal of the conversion running in a thread: `_convert_in_thread`
# sets it when its caller stops waiting. asyncio.to_thread runs a function in
# a copy of its caller's context, so the thread finds the event here.
_THREAD_CONVERSION_STOP: contextvars.ContextVar[threading.Event | None] = (
    contextvars.ContextVar("visit_thread_conversion_stop", default=None)
)


async def _convert_in_thread(
    raw: _RawPage,
    max_tokens: int,
    run_in_thread: Callable[..., Awaitable[Any]] = asyncio.to_thread,
) -> _Page:
    """`_convert_budgeted` in a worker thread that stops when its caller does.

    A thread cannot be killed. HTML is read within hard caps; a PDF is read
    page by page, and when this call ends (the page timed out, the chat was
    stopped, or `_MAX_CONVERT_SECONDS` passed) the thread stops at its next
    page instead of reading on after the tool answered.

    Args:
        raw: The page as downloaded.
        max_tokens: The reading budget.
        run_in_thread: Runs `func(*args)` in another thread, in a copy of the
            current context (asyncio.to_thread; a seam for tests).

    Returns:
        The converted page.
    """
    stop = threading.Event()
    context_token = _THREAD_CONVERSION_STOP.set(stop)
    try:
        async with asyncio.timeout(_MAX_CONVERT_SECONDS):
            return await run_in_thread(_convert_budgeted, raw, max_tokens)
    finally:
        stop.set()  # done, timed out or cancelled: nothing more to read
        _THREAD_CONVERSION_STOP.reset(context_token)


def _convert_budgeted(raw: _RawPage, max_tokens: int) -> _Page:
    """`_convert` without a worker process (in a thread): HTML in linear time.

    The whole readable page, without main-content extraction: a thread cannot
    be stopped, and the library's cost is not linear in the page. PDFs still
    go through pypdf here (only when no worker process can run at all, as
    before there was one), page by page until `_convert_in_thread`'s stop.
    """
    read_pdf = functools.partial(_pdf_to_text, stop=_THREAD_CONVERSION_STOP.get())
    return _convert(
        raw, max_tokens, _html_to_text_linear, read_main=None, read_pdf=read_pdf
    )


def _html_to_text_linear(html: str, base_url: str, char_limit: int) -> tuple[str, str]:
    """`_html_to_text` with a tokenizer that looks at every character O(1) times.

    Tags, comments and script bodies are found with `str.find` from where the
    last one ended; a `<` without a `>` after it makes the rest text. The
    reader's nesting caps (`_MAX_NESTING`) keep the text building linear.
    """
    parser = _HtmlToText(base_url)
    html = html[:_FALLBACK_MAX_HTML_CHARS]
    lower = html.lower()
    pos, end = 0, len(html)
    for _tag in range(_FALLBACK_MAX_TAGS):
        if pos >= end or parser.main.size > char_limit:
            break
        start = html.find("<", pos)
        start = end if start < 0 else start
        if start > pos:  # text; more than the limit is never needed
            parser.handle_data(unescape(html[pos : min(start, pos + char_limit + 1)]))
        pos = _read_markup(parser, html, lower, start) if start < end else end
    parser.handle_data("")
    return parser.result()


def _read_markup(parser: _HtmlToText, html: str, lower: str, start: int) -> int:
    """Handle the markup at `html[start] == "<"`; where reading goes on."""
    if html.startswith("<!--", start):
        close = html.find("-->", start + 2)  # "<!-->" is an empty comment too
        return len(html) if close < 0 else close + 3
    tag = _FALLBACK_TAG.match(html, start + 1)
    if tag is None and html[start + 1 : start + 2] not in ("!", "?"):
        parser.handle_data("<")  # a lone "<" in text
        return start + 1
    close = html.find(">", start + 1)
    if close < 0:
        parser.handle_data(unescape(html[start:]))
        return len(html)
    if tag is None:  # <!doctype …>, <?xml …?>
        return close + 1
    if tag.group(1):
        parser.handle_endtag(tag.group(2).lower())
        return close + 1
    return _read_start_tag(parser, html, lower, tag, close)


def _read_start_tag(
    parser: _HtmlToText, html: str, lower: str, tag: re.Match[str], close: int
) -> int:
    """Handle a start tag ending at `close` (and a script's or style's text)."""
    name = tag.group(2).lower()
    inside = html[tag.end() : close]
    attrs: list[tuple[str, str | None]] = [
        (m.group(1).lower(), unescape(next((v for v in m.groups()[1:] if v), "")))
        for m in _FALLBACK_ATTRIBUTE.finditer(inside)
    ]
    if inside.endswith("/"):
        parser.handle_startendtag(name, attrs)
        return close + 1
    parser.handle_starttag(name, attrs)
    if name not in ("script", "style"):
        return close + 1
    finish = lower.find(f"</{name}", close + 1)  # raw text up to its end tag
    if finish < 0:
        return len(html)
    parser.handle_data(html[close + 1 : finish])
    parser.handle_endtag(name)
    after = html.find(">", finish)
    return len(html) if after < 0 else after + 1


# --- end shared: thread_fallback ---


# --- shared: converter_worker (made from tools/visit/converter_worker.py) ---
_PIPE_SLICE_BYTES = 256 * 1024
# After this many workers in a row fail to start, pages are converted in a
# thread for `_START_RETRY_SECONDS`, then a worker is tried again.
_MAX_START_FAILURES = 3
_START_RETRY_SECONDS = 600.0
# Modules a worker imports when it starts, before its first page.
# trafilatura costs ~0.5 s to import: paid when the worker starts, once.
_WARM_IMPORTS: tuple[str, ...] = ("trafilatura",)
# The child's command line: it reads its program from stdin (a length line,
# then the source), which keeps 40 kB of code out of `ps` and out of the
# command-line length limits, runs it, then its `_converter_main`; setup and
# pages follow on the same stdin.
_CHILD_BOOT = (
    "import sys; size = int(sys.stdin.buffer.readline()); "
    "exec(compile(sys.stdin.buffer.read(size), '<deepresearch converter>', 'exec')); "
    "_converter_main()"
)


def _converter_program() -> str:
    """The converter process's program: the convert module ("" if none can run)."""
    if getattr(sys, "frozen", False) or not sys.executable:
        return ""  # no Python interpreter to start (an embedded or frozen app)
    return _CONVERT_SOURCE


def _spawn_worker() -> subprocess.Popen | None:
    """Start the interpreter of a worker (it takes milliseconds: vfork + exec)."""
    command = [sys.executable, "-I", "-S", "-c", _CHILD_BOOT]
    try:
        # Isolated (no cwd on the path, no PYTHON* variables) and without
        # `site` (~30 ms): `_converter_main` takes the server's sys.path.
        return subprocess.Popen(  # noqa: S603  (our own interpreter and code)
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        log.info("no converter process (%s): converting in a thread", exc)
        return None


class _WorkerGoneError(Exception):
    """The worker process ended, or said something that is not an answer."""


@dataclass
class _Worker:
    """One converter process; its pipes are non-blocking, watched by the loop."""

    process: subprocess.Popen

    def fd(self, name: Literal["stdin", "stdout", "stderr"]) -> int:
        stream = getattr(self.process, name)
        return -1 if stream is None or stream.closed else stream.fileno()


# A page converted in a thread instead: `_convert_in_thread`'s signature.
ThreadConverter = Callable[[_RawPage, int], Awaitable[_Page]]


@dataclass
class _ConverterState:
    """The child program, the warm workers and what failed when starting one.

    The process has one (`_CONVERTER`); a visit call may be given another
    (its seams), with its own program, limits, process starter, thread
    fallback and clock.
    """

    program: str
    start_failures: int = 0  # workers in a row that failed to start
    disabled_until: float = 0.0  # `clock()` until which threads are used
    # Busy workers at once per event loop.
    max_children: int = max(2, min(8, os.cpu_count() or 2))
    max_idle: int = 2  # warm workers kept between pages
    idle: list[_Worker] = field(default_factory=list)
    dying: list[subprocess.Popen] = field(default_factory=list)  # killed, not reaped
    owner: int = field(default_factory=os.getpid)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Not a string annotation: dataclasses would look this module up in
    # sys.modules, where a tool loaded from a file may not be.
    slots: WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = field(
        default_factory=WeakKeyDictionary
    )
    # Starts a worker's interpreter (None when none can start).
    spawn: Callable[[], subprocess.Popen | None] = _spawn_worker
    # Converts a page when no worker can.
    in_thread: ThreadConverter = _convert_in_thread
    clock: Callable[[], float] = time.monotonic

    def slot(self) -> asyncio.Semaphore:
        """This event loop's limit on busy workers."""
        loop = asyncio.get_running_loop()
        semaphore = self.slots.get(loop)
        if semaphore is None:
            semaphore = self.slots[loop] = asyncio.Semaphore(self.max_children)
        return semaphore

    def usable(self) -> bool:
        """Whether pages go to a worker process (else to `_convert_budgeted`)."""
        return bool(self.program) and self.clock() >= self.disabled_until

    def take_idle(self) -> _Worker | None:
        """A warm worker that still runs, or None."""
        with self.lock:
            if self.owner != os.getpid():  # a forked server: those are not ours
                self.idle, self.dying, self.owner = [], [], os.getpid()
            while self.idle:
                worker = self.idle.pop()
                if worker.process.poll() is None:
                    return worker
                _close_pipes(worker.process)
        return None

    def keep_idle(self, worker: _Worker) -> bool:
        """Keep a worker warm for the next page; False when enough are kept."""
        with self.lock:
            if len(self.idle) >= self.max_idle or self.owner != os.getpid():
                return False
            self.idle.append(worker)
            return True

    def reap(self) -> int:
        """Collect killed workers that have exited; how many are still exiting."""
        with self.lock:
            self.dying = [p for p in self.dying if p.poll() is None]
            return len(self.dying)


_CONVERTER = _ConverterState(_converter_program())


async def _convert_page(
    raw: _RawPage, max_tokens: int, converter: _ConverterState = _CONVERTER
) -> _Page:
    """Bytes -> `_Page` off the event loop: in a worker process (or a thread).

    Args:
        raw: The page as downloaded.
        max_tokens: The reading budget.
        converter: The workers to use (the process's by default).

    Returns:
        The converted page (`_PageError` when it has no readable text).
    """
    _refuse_at_once(raw)
    if converter.usable():
        page = await _convert_in_child(raw, max_tokens, converter)
        if page is not None:
            return page
    return await converter.in_thread(raw, max_tokens)


def _refuse_at_once(raw: _RawPage) -> None:
    """Page errors the first bytes show, so no worker is needed for them."""
    if not raw.body:
        raise _PageError("the page is empty")
    kind, label = _classify(raw.content_type, raw.body)  # looks at the head only
    if kind == "binary":
        raise _PageError(f"the URL points to {label}, not a readable page")
    if kind == "pdf" and raw.truncated:
        raise _PageError("the PDF is larger than the download limit")


async def _convert_in_child(
    raw: _RawPage, max_tokens: int, converter: _ConverterState = _CONVERTER
) -> _Page | None:
    """`_convert` in a worker process; None when no worker could be started.

    A page error found by the worker is raised as usual. The caller's deadline
    bounds the page: on timeout or cancellation the worker is killed and
    reaped, so nothing goes on converting after the tool answered.
    """
    async with converter.slot(), asyncio.timeout(_MAX_CONVERT_SECONDS):
        worker = converter.take_idle() or await _start_worker(converter)
        if worker is None:
            return None
        answer: dict = {}
        try:
            answer = await _run_job(worker, raw, max_tokens)
        except _WorkerGoneError as exc:
            # Killed (the OOM killer, an administrator) or crashed: converting
            # the same document inside the server could do the same harm there.
            raise _PageError(
                "the page could not be converted (its converter was stopped)"
            ) from exc
        finally:
            if not answer or not converter.keep_idle(worker):
                await _discard(worker, converter)
    if "error" in answer:
        raise _PageError(str(answer["error"]))
    return _Page(
        raw.final_url,
        str(answer["title"]),
        str(answer["text"]),
        raw.redirects,
        str(answer.get("reading") or ""),
        _count(answer.get("page_chars")),
    )


def _count(value: Any) -> int:
    """A non-negative int from the worker's answer (0 for anything else)."""
    return value if isinstance(value, int) and value > 0 else 0


async def _run_job(worker: _Worker, raw: _RawPage, max_tokens: int) -> dict:
    """Send one page to the worker and read its answer."""
    header = {
        "size": len(raw.body),
        "url": raw.final_url,
        "content_type": raw.content_type,
        "cut": raw.truncated,
        "max_tokens": max_tokens,
        "seconds": _MAX_CONVERT_SECONDS + 5,
    }
    await _send(worker, json.dumps(header).encode() + b"\n", raw.body)
    answer = await _receive(worker)
    if not isinstance(answer, dict) or not ("error" in answer or "text" in answer):
        raise _WorkerGoneError("not a converter answer")
    return answer


async def _start_worker(converter: _ConverterState) -> _Worker | None:
    """A new worker that said it is ready; None (converting in a thread) if none."""
    process = converter.spawn()
    if process is None:
        return None
    worker = _Worker(process)
    setup = {
        "path": [entry for entry in sys.path if isinstance(entry, str)],
        "warm": list(_WARM_IMPORTS),
    }
    program = converter.program.encode()
    try:
        for name in ("stdin", "stdout", "stderr"):
            os.set_blocking(worker.fd(name), False)
        await _send(worker, b"%d\n%s" % (len(program), program))
        await _send(worker, json.dumps(setup).encode() + b"\n")
        ready = await _receive(worker) == {"ready": True}
    except _WorkerGoneError:
        ready = False
    except NotImplementedError:  # an event loop that cannot watch pipes
        log.info("the event loop cannot watch pipes: converting in threads")
        converter.disabled_until = float("inf")
        await _discard(worker, converter)
        return None
    except BaseException:  # cancelled or timed out while starting: not a failure
        await _discard(worker, converter)
        raise
    if not ready:
        await _discard(worker, converter, _stderr_tail(worker))
        converter.start_failures += 1
        if converter.start_failures >= _MAX_START_FAILURES:
            converter.start_failures = 0
            converter.disabled_until = converter.clock() + _START_RETRY_SECONDS
        return None
    converter.start_failures = 0
    _close_stream(process.stderr)  # the worker sent its stderr to /dev/null
    return worker


def _stderr_tail(worker: _Worker) -> str:
    """What a worker that failed to start wrote to stderr (its last line)."""
    fd = worker.fd("stderr")
    if fd < 0:
        return ""
    try:
        data = os.read(fd, 65536)
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()[-300:]


async def _discard(
    worker: _Worker, converter: _ConverterState, why: str | None = None
) -> None:
    """Kill the worker if it still runs, then reap it: no process is left behind."""
    process = worker.process
    if process.poll() is None:
        with contextlib.suppress(OSError):
            process.kill()
    if why is not None:
        log.warning(
            "converter process failed to start (exit %s): %s", process.poll(), why
        )
    _close_pipes(process)
    with converter.lock:
        converter.dying.append(process)
    # A killed process is gone within milliseconds; one still exiting after a
    # second (or when this task is cancelled again) is reaped by a later call.
    for _ in range(200):
        if not converter.reap():
            return
        await asyncio.sleep(0.005)


async def _stop_idle_workers(converter: _ConverterState = _CONVERTER) -> None:
    """Stop the warm workers (a fresh one starts for the next page)."""
    while (worker := converter.take_idle()) is not None:
        await _discard(worker, converter)


def _close_pipes(process: subprocess.Popen) -> None:
    for stream in (process.stdin, process.stdout, process.stderr):
        _close_stream(stream)


def _close_stream(stream: Any) -> None:
    if stream is not None:
        with contextlib.suppress(OSError):
            stream.close()


async def _send(worker: _Worker, *parts: bytes) -> None:
    """Write to the worker's stdin slice by slice, never blocking the loop."""
    fd = worker.fd("stdin")
    for part in parts:
        view = memoryview(part)
        while view:
            try:
                written = os.write(fd, view[:_PIPE_SLICE_BYTES])
            except BlockingIOError:
                await _fd_ready(fd, write=True)
                continue
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _WorkerGoneError("the worker stopped reading") from exc
            view = view[written:]


async def _receive(worker: _Worker) -> Any:
    """One JSON line from the worker's stdout."""
    fd = worker.fd("stdout")
    parts: list[bytes] = []
    while True:
        try:
            data = os.read(fd, 1 << 20)
        except BlockingIOError:
            await _fd_ready(fd, write=False)
            continue
        if not data:
            raise _WorkerGoneError("the worker exited")
        end = data.find(b"\n")
        if end >= 0:
            parts.append(data[:end])
            break
        parts.append(data)
    try:
        return json.loads(b"".join(parts))
    except ValueError as exc:
        raise _WorkerGoneError("the worker answered something else") from exc


async def _fd_ready(fd: int, write: bool) -> None:
    """Wait until a pipe can be read or written (NotImplementedError if no way)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if write:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


# --- end shared: converter_worker ---


# --- shared: safety (made from tools/visit/safety.py) ---
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


# --- end shared: safety ---


# --- shared: fetch (made from tools/visit/fetch.py) ---
_USER_AGENT = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0 Safari/537.36 DeepResearchVisit/0.1"
)
_ACCEPT = "text/html,application/xhtml+xml,application/pdf;q=0.9,text/*;q=0.8,*/*;q=0.5"
_OWUI_INVALID_URL = "The URL you provided is invalid"

# Open WebUI web loader engines that are a plain GET plus HTML-to-text, which
# the built-in fetcher does too; any other engine renders or scrapes remotely.
_PLAIN_LOADER_ENGINES = ("", "safe_web")


def _openwebui_content_loader() -> Callable[..., Any] | None:
    """Open WebUI's `get_content_from_url`, or None outside Open WebUI."""
    try:
        from open_webui.retrieval.utils import get_content_from_url  # type: ignore  # noqa: PLC0415
    except Exception:  # absent, or an Open WebUI that fails to import
        return None
    return get_content_from_url


async def _openwebui_loader_engine(request: Any) -> str | None:
    """Open WebUI's configured WEB_LOADER_ENGINE, or None when it cannot be read."""
    state = getattr(getattr(request, "app", None), "state", None)
    config = getattr(state, "config", None)
    if config is not None:  # 0.6 / 0.8: request.app.state.config.<ENV NAME>
        try:
            return str(config.WEB_LOADER_ENGINE or "")
        except Exception:  # an older Open WebUI without the setting
            return None
    try:  # 0.11+: settings live in the config table
        from open_webui.models.config import Config  # type: ignore  # noqa: PLC0415

        value = Config.get("web.loader.engine", "")
        if inspect.isawaitable(value):
            value = await value
    except Exception:  # not inside Open WebUI, or another shape
        return None
    return str(value or "")


async def _wants_openwebui_loader(mode: str, request: Any) -> bool:
    """True when this page goes to Open WebUI's loader rather than the built-in."""
    if request is None or mode == "builtin":
        return False
    if mode == "openwebui":
        return True
    engine = await _openwebui_loader_engine(request)
    return engine is not None and engine.strip().lower() not in _PLAIN_LOADER_ENGINES


# Finds Open WebUI's loader (None outside Open WebUI).
LoaderFinder = Callable[[], Callable[..., Any] | None]


async def _load_with_openwebui(
    request: Any,
    url: str,
    valves: "Tools.Valves",
    *,
    find_loader: LoaderFinder = _openwebui_content_loader,
    converter: _ConverterState = _CONVERTER,
) -> _Page | None:
    """Read through the admin's configured loader; None when it cannot serve.

    `url` was checked by `_check_url` already. What comes back is classified
    like a downloaded body: a PDF goes to the PDF reader, binary is refused.

    Args:
        request: The request Open WebUI passed to the tool.
        url: The checked URL.
        valves: The call's settings.
        find_loader: Finds Open WebUI's loader (`_openwebui_content_loader`).
        converter: Converts what the loader gave (the process's workers).

    Returns:
        The page, or None when the loader gave nothing.
    """
    loader = find_loader()
    if loader is None:
        return None
    try:
        if inspect.iscoroutinefunction(loader):
            result = await loader(request, url)  # 0.11+ (0.12 adds config=)
        else:
            result = await asyncio.to_thread(loader, request, url)  # 0.6 / 0.8
        if inspect.isawaitable(result):
            result = await result
    except ValueError as exc:
        if _OWUI_INVALID_URL in str(exc):
            raise _RefusedError("Open WebUI refused the URL") from exc
        log.info("Open WebUI loader failed for %s: %s", url, type(exc).__name__)
        return None
    except Exception as exc:  # any loader failure: the caller decides
        log.info("Open WebUI loader failed for %s: %s", url, type(exc).__name__)
        return None
    content, docs = result if isinstance(result, tuple) else (result, [])
    if not isinstance(content, str) or not content.strip():
        return None
    raw = await asyncio.to_thread(_loaded_body, url, content, valves.MAX_DOWNLOAD_BYTES)
    if raw is None:
        raise _MangledFileError(url)
    page = await _convert_page(raw, valves.MAX_PAGE_TOKENS, converter)
    title = _loader_title(docs) or page.title
    # Text (not HTML, not a PDF) is the loader's own reading of the page, given
    # as it came: a browser engine's visible text, a service's Markdown.
    loaded = _classify(raw.content_type, raw.body)[0] == "text"
    reading = "loader" if loaded else page.reading
    return dataclasses.replace(page, title=title, reading=reading)


def _loaded_body(url: str, content: str, cap: int) -> _RawPage | None:
    """The loader's text as bytes again, capped, for the checks a download gets.

    Some loaders (0.8.12's default) return a binary body decoded as text. A PDF
    survives that only when every character is one byte (a latin-1 decoding);
    any other decoding lost bytes, and None asks for the file itself. The
    charset is given, so the text is never decoded again as something else.
    """
    body = b""
    if "%PDF-" in content[:1024]:
        try:
            body = content.encode("latin-1")
        except UnicodeEncodeError:
            return None
    if not body:
        body = content.encode("utf-8", "replace")  # lone surrogates from odd pages
    return _RawPage(url, body[:cap], "; charset=utf-8", len(body) > cap)


def _loader_title(docs: Any) -> str:
    """The first document title Open WebUI's loader reported, if any."""
    for doc in docs if isinstance(docs, list | tuple) else []:
        meta = (
            doc.get("metadata")
            if isinstance(doc, dict)
            else getattr(doc, "metadata", None)
        )
        if isinstance(meta, dict) and meta.get("title"):
            return str(meta["title"]).strip()
    return ""


# Makes the built-in fetcher's client: (TLS verify setting or context, timeout).
ClientFactory = Callable[[bool | ssl.SSLContext, float], httpx.AsyncClient]


def _http_client(verify: bool | ssl.SSLContext, timeout: float) -> httpx.AsyncClient:
    """The builtin fetcher's client (a visit call's client factory by default).

    No environment proxies (they would defeat IP pinning), no connection reuse
    (a pooled TLS connection to one IP must not serve another host), and no
    automatic redirects (each hop is checked by `_check_url`). `verify` is the
    shared context from `_ssl_context` (a bool would build a new one).
    """
    return httpx.AsyncClient(
        verify=verify,
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


async def _fetch_builtin(
    first: _Target,
    valves: "Tools.Valves",
    *,
    resolve: Resolver = _resolve,
    http_client: ClientFactory = _http_client,
    tls: _TlsContexts = _SSL_CONTEXTS,
) -> _RawPage:
    """GET the URL, following redirects by hand and re-checking every hop.

    Args:
        first: The checked URL.
        valves: The call's settings.
        resolve: Resolves the host of each redirect (`_resolve`: DNS).
        http_client: Makes the client (`_http_client`).
        tls: The TLS contexts to connect with (the process's).

    Returns:
        The body as downloaded, capped, with the redirects followed.
    """
    target = first
    redirects: list[str] = []
    verify = await _ssl_context(valves.VERIFY_SSL, tls)
    async with http_client(verify, valves.PAGE_TIMEOUT_SECONDS) as client:
        for _hop in range(valves.MAX_REDIRECTS + 1):
            # Connect to the address that was checked, not to a fresh DNS answer:
            # that closes the DNS-rebinding window. Host header and TLS SNI keep
            # the real name, so virtual hosting and certificate checks still work.
            ip = f"[{target.ip}]" if ":" in target.ip else target.ip
            pinned = f"{target.scheme}://{ip}:{target.port}{target.path}"
            extensions = (
                {"sni_hostname": target.host} if target.scheme == "https" else {}
            )
            headers = {
                "Host": target.host_header,
                "User-Agent": _USER_AGENT,
                "Accept": _ACCEPT,
                "Accept-Encoding": ACCEPT_ENCODING,
            }
            request = client.build_request(
                "GET", pinned, headers=headers, extensions=extensions
            )
            response = await client.send(request, stream=True)
            try:
                status = response.status_code
                location = response.headers.get("location", "").strip()
                if status >= 400 or (300 <= status < 400 and not location):
                    raise _PageError(f"the server answered HTTP {status}")
                if status < 300:
                    try:
                        cap = valves.MAX_DOWNLOAD_BYTES
                        body, cut = await _read_capped(response, cap)
                    except _UnreadableBodyError as exc:
                        raise _PageError(str(exc)) from exc
                    content_type = response.headers.get("content-type", "")
                    return _RawPage(target.url, body, content_type, cut, redirects)
                next_url = _resolved(target.url, location)
            finally:
                await response.aclose()
            if not next_url:  # a Location no URL parser can read
                raise _PageError("the server redirected to an invalid URL")
            redirects.append(next_url)
            target = await _check_url(
                next_url, valves.ALLOW_PRIVATE_URLS, resolve=resolve
            )
    raise _PageError(f"more than {valves.MAX_REDIRECTS} redirects")


class _PageCache:
    """Bounded LRU of read pages keyed by (chat id, normalized URL), with a TTL."""

    def __init__(self, max_entries: int = 64) -> None:
        self._entries: OrderedDict[tuple[str, str], tuple[float, _Page]] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str], ttl: float) -> _Page | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or time.monotonic() - entry[0] > ttl:
                self._entries.pop(key, None)
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key: tuple[str, str], page: _Page) -> None:
        with self._lock:
            self._entries[key] = (time.monotonic(), page)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_PAGE_CACHE = _PageCache()


# --- end shared: fetch ---


# --- shared: extractor_client (made from tools/visit/extractor_client.py) ---
_BACKOFF_BASE_SECONDS = 1.0
_MAX_RETRY_AFTER_SECONDS = 60.0


class _ExtractorError(Exception):
    """The extractor endpoint cannot be used; the message is user-facing."""


# Waits between extractor retries.
Sleep = Callable[[float], Awaitable[None]]


async def _sleep(seconds: float) -> None:
    """Wait between extractor retries (a visit call's sleep by default)."""
    await asyncio.sleep(seconds)


# The extractor's credentials: the key valve and any user:password written into
# EXTRACTOR_BASE_URL. They go to that endpoint in the Authorization header only;
# every text that leaves the extractor's code is redacted against all the forms
# they could take there (as written, trimmed, JSON-escaped, URL-quoted, base64).
_REDACTED = "***"
# The reference agent's placeholder for servers that need no key.
_NO_KEY = "EMPTY"
# An error body is searched and quoted from its beginning only.
_ERROR_SCAN_CHARS = 4_000
_INVALID_EXTRACTOR_URL = (
    "the extractor URL is invalid; check the EXTRACTOR_BASE_URL valve"
)

# By default the extractor is the research model: a reasoning model that would
# otherwise think through its whole reply budget before writing the JSON. These
# fields ask the server to skip thinking (EXTRACTOR_DISABLE_THINKING):
# - chat_template_kwargs: vLLM, SGLang and llama.cpp's server hand it to the
#   chat template. Qwen3-style templates, Tongyi-DeepResearch's included, then
#   write an empty `<think>\n\n</think>` themselves, so the model answers at once
#   (it may still think a little: the reply is read after the last `</think>`).
# - reasoning_effort "none": Ollama's /v1 endpoint maps it to think=false (it
#   ignores chat_template_kwargs); recent vLLM releases accept it too.
# Servers ignore fields they do not know, but some validate them: older vLLM
# and SGLang allow only low/medium/high efforts, strict APIs refuse unknown
# fields. A 400/422 naming a field is answered by sending the request again
# without it, and that endpoint does not get the field again in this process.
_THINKING_OFF: dict[str, Any] = {
    "chat_template_kwargs": {"enable_thinking": False},
    "reasoning_effort": "none",
}
# How a refusal names each field (Ollama says "invalid reasoning value").
_FIELD_NAMED = {
    "chat_template_kwargs": re.compile(r"chat_template|enable_thinking", re.I),
    "reasoning_effort": re.compile(r"reasoning", re.I),
}
# Endpoint base URL (no credentials) -> fields it refused. Bounded: the oldest
# endpoint is forgotten first.
_REFUSED_FIELDS: dict[str, set[str]] = {}
_MAX_REMEMBERED_ENDPOINTS = 64
_TOO_LONG = re.compile(
    r"context.{0,20}(length|window|size)|too long|maximum.{0,40}tokens", re.I
)


@dataclass(frozen=True)
class _Endpoint:
    """The extractor endpoint: a base URL without credentials, and how to sign in."""

    base_url: str
    api_key: str
    headers: dict[str, str]
    secrets: tuple[str, ...]


def _api_base(base_url: str) -> str:
    """The OpenAI base URL (the SDK appends /chat/completions itself)."""
    base = base_url.strip().rstrip("/")
    return base.removesuffix("/chat/completions").rstrip("/")


def _secret_forms(values: list[str]) -> tuple[str, ...]:
    """Every spelling of each secret that could appear in a reply, longest first."""
    forms: set[str] = set()
    for value in values:
        for variant in (value, value.strip()):
            if variant.strip():
                forms.update(
                    (variant, json.dumps(variant)[1:-1], quote(variant, safe=""))
                )
    return tuple(sorted(forms, key=len, reverse=True))


def _redact(text: str, secrets: tuple[str, ...]) -> str:
    """The text with every secret form replaced (run it before any cut)."""
    for secret in secrets:
        text = text.replace(secret, _REDACTED)
    return text


def _endpoint(valves: "Tools.Valves") -> _Endpoint:
    """Split EXTRACTOR_BASE_URL into a clean URL and credentials; check its form."""
    key = valves.EXTRACTOR_API_KEY
    secrets = [key]
    try:
        parts = urlsplit(_api_base(valves.EXTRACTOR_BASE_URL))
        valid = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:
        parts, valid = urlsplit(""), False
    userinfo, _, hostport = parts.netloc.rpartition("@")
    headers: dict[str, str] = {}
    if userinfo:
        user, _, password = userinfo.partition(":")
        pair = f"{unquote(user)}:{unquote(password)}"
        basic = base64.b64encode(pair.encode()).decode("ascii")
        secrets += [userinfo, password, unquote(password), pair, basic]
        if not key.strip():  # the key valve, when set, wins the one header
            headers["Authorization"] = f"Basic {basic}"
    if not valid:
        raise _ExtractorError(_INVALID_EXTRACTOR_URL)
    base = urlunsplit((parts.scheme, hostport, parts.path, parts.query, ""))
    return _Endpoint(base, key.strip() or _NO_KEY, headers, _secret_forms(secrets))


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (number or HTTP date)."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


@dataclass(frozen=True)
class _Reply:
    """One extractor reply, its thinking set apart.

    `answer` is the content after the last `</think>` (a thought may mention
    the tag; an answer quoting it is rarer, and a thought's draft must never
    pass for the answer). `thought` is the thinking, wherever the server put it.
    """

    answer: str = ""
    thought: str = ""
    cut: bool = False  # finish_reason "length": the reply budget ran out


def _text(value: Any) -> str:
    """A message field as text (content parts joined; anything else is empty)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    return ""


def _reply_parts(completion: Any) -> _Reply:
    """Split a chat completion into answer and thinking, in every server's style.

    The thinking arrives as `reasoning_content` (vLLM/SGLang with a reasoning
    parser, llama.cpp), as `reasoning` (OpenRouter, Ollama), inline as
    `<think>…</think>` (raw servers), or opened by the chat template so that the
    content starts mid-thought and only `</think>` appears.
    """
    try:
        choice = completion.choices[0]
        message = choice.message
    except (AttributeError, IndexError, KeyError, TypeError):
        return _Reply()
    content = _text(getattr(message, "content", None))
    thought = _text(getattr(message, "reasoning_content", None)) or _text(
        getattr(message, "reasoning", None)
    )
    cut = getattr(choice, "finish_reason", None) == "length"
    head, closed, tail = content.rpartition("</think>")
    if closed:
        inline = head.partition("<think>")[2] if "<think>" in head else head
        return _Reply(tail, "\n".join(filter(None, (thought, inline))), cut)
    if content.lstrip().startswith("<think>"):  # thinking that never closed
        inline = content.lstrip().removeprefix("<think>")
        return _Reply("", "\n".join(filter(None, (thought, inline))), cut)
    return _Reply(content, thought, cut)


def _config_error(status: int, detail: str, valves: "Tools.Valves") -> _ExtractorError:
    """A clear error naming the valve to fix; no credential is ever included."""
    if status in (401, 403):
        names = "EXTRACTOR_API_KEY"
    elif status == 404:
        names = "EXTRACTOR_BASE_URL / EXTRACTOR_MODEL"
    elif status in (400, 422):
        names = "EXTRACTOR_MODEL / EXTRACTOR_MAX_TOKENS"
    else:
        names = "EXTRACTOR_BASE_URL"
    secrets = _endpoint_secrets(valves)
    detail = _redact(detail, secrets)  # the whole body, before anything is cut
    with contextlib.suppress(ValueError, AttributeError, TypeError, RecursionError):
        detail = _redact(str(json.loads(detail)["error"]["message"]), secrets)
    detail = " ".join(detail[:_ERROR_SCAN_CHARS].split())[:160]
    return _ExtractorError(
        f"the extractor endpoint answered HTTP {status} ({detail}); "
        f"check the {names} valve of the DeepResearch Visit tool"
    )


def _endpoint_secrets(valves: "Tools.Valves") -> tuple[str, ...]:
    """The secret forms of the valves, even when the URL itself is unusable."""
    try:
        return _endpoint(valves).secrets
    except _ExtractorError:
        return _secret_forms([valves.EXTRACTOR_API_KEY, valves.EXTRACTOR_BASE_URL])


def _extractor_options(
    prompt: str, valves: "Tools.Valves", not_given: Any, extra: dict[str, Any]
) -> dict:
    """Keyword arguments of one chat.completions.create call."""
    options: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "model": valves.EXTRACTOR_MODEL.strip() or not_given,
        "temperature": valves.EXTRACTOR_TEMPERATURE,
        "stream": False,
    }
    if valves.EXTRACTOR_MAX_TOKENS > 0:
        options["max_tokens"] = valves.EXTRACTOR_MAX_TOKENS
    if extra:  # sent as they are: the SDK checks no server-specific field
        options["extra_body"] = extra
    return options


def _thinking_fields(valves: "Tools.Valves", endpoint: str) -> dict[str, Any]:
    """The thinking controls for this endpoint, less those it has refused."""
    if not valves.EXTRACTOR_DISABLE_THINKING:
        return {}
    refused = _REFUSED_FIELDS.get(endpoint, set())
    return {name: v for name, v in _THINKING_OFF.items() if name not in refused}


def _refused_fields(response: httpx.Response, sent: dict[str, Any]) -> set[str]:
    """The sent thinking fields a 400/422 names (none for a too-long prompt)."""
    detail = response.text[:_ERROR_SCAN_CHARS]
    if response.status_code not in (400, 422) or _TOO_LONG.search(detail):
        return set()
    return {name for name in sent if _FIELD_NAMED[name].search(detail)}


def _remember_refused(endpoint: str, fields: set[str]) -> None:
    """Never send these fields to this endpoint again (in this process)."""
    if endpoint not in _REFUSED_FIELDS and len(_REFUSED_FIELDS) >= (
        _MAX_REMEMBERED_ENDPOINTS
    ):
        _REFUSED_FIELDS.pop(next(iter(_REFUSED_FIELDS)))
    _REFUSED_FIELDS.setdefault(endpoint, set()).update(fields)
    log.info("extractor endpoint refused %s; not sent again", sorted(fields))


def _retry_delay(
    response: httpx.Response, backoff: float, valves: "Tools.Valves"
) -> float | None:
    """Seconds to wait before retrying a failed reply; None if the prompt is too long.

    Raises `_ExtractorError` for errors that retrying cannot fix (auth, config).
    """
    status, detail = response.status_code, response.text
    if status in (400, 413, 422) and _TOO_LONG.search(detail[:_ERROR_SCAN_CHARS]):
        return None
    if status not in (408, 409, 425, 429) and status < 500:
        raise _config_error(status, detail, valves)
    waited = _retry_after(response.headers.get("retry-after"))
    return backoff if waited is None else waited


# Modules imported whole by `_import_whole`. Not `sys.modules`: while one
# thread runs a package's first import, sys.modules already holds the partly
# initialised module, and a second visit reading it there would find no
# `AsyncOpenAI` yet (two pages read at once did exactly that).
_WHOLE_MODULES: dict[str, Any] = {}
_IMPORT_LOCK = threading.Lock()


def _import_whole(name: str) -> Any:
    """Import `name` once, returning it only when its import has finished."""
    with _IMPORT_LOCK:
        module = _WHOLE_MODULES.get(name)
        if module is None:
            module = _WHOLE_MODULES[name] = importlib.import_module(name)
        return module


async def _openai_sdk(name: str = "openai") -> Any:
    """The `openai` package; the first import runs in a thread (it takes ~0.5 s)."""
    module = _WHOLE_MODULES.get(name)
    if module is not None:
        return module
    try:
        return await asyncio.to_thread(_import_whole, name)
    except ImportError as exc:
        raise _ExtractorError(
            "the extractor needs the 'openai' Python package (pip install openai)"
        ) from exc


@contextlib.asynccontextmanager
async def _extractor_client(
    openai: Any, valves: "Tools.Valves", tls: _TlsContexts = _SSL_CONTEXTS
) -> AsyncIterator[Any]:
    """An `openai.AsyncOpenAI` on our own httpx client, for one URL's extraction.

    Our client: the shared TLS context, the valve's timeouts, no environment
    proxies. The SDK's own retries are off: `_call_extractor` is the one retry
    policy (backoff, Retry-After, the reference's give-up rules).

    Args:
        openai: The `openai` package (`_openai_sdk`).
        valves: The call's settings.
        tls: The TLS contexts to connect with (the process's).

    Yields:
        The SDK's client, closed when the block ends.
    """
    endpoint = _endpoint(valves)
    timeout = httpx.Timeout(
        valves.EXTRACTOR_TIMEOUT_SECONDS,
        connect=min(10.0, valves.EXTRACTOR_TIMEOUT_SECONDS),
    )
    verify = await _ssl_context(True, tls)  # the extractor is always verified
    async with httpx.AsyncClient(
        timeout=timeout, verify=verify, trust_env=False
    ) as http:
        client = openai.AsyncOpenAI(
            api_key=endpoint.api_key,
            base_url=endpoint.base_url,
            timeout=timeout,
            max_retries=0,
            default_headers=endpoint.headers or None,
            http_client=http,
        )
        # The SDK fills these from OPENAI_ORG_ID / OPENAI_PROJECT_ID and sends
        # them as headers: the server's own environment must not reach an
        # extractor endpoint the admin configured.
        client.organization = None
        client.project = None
        yield client


async def _call_extractor(
    openai: Any,
    client: Any,
    prompt: str,
    valves: "Tools.Valves",
    *,
    sleep: Sleep = _sleep,
) -> _Reply:
    """One extractor request, retrying transient errors with backoff.

    A thinking field the server refuses is dropped and the request sent again
    at once (at most once per field).

    Args:
        openai: The `openai` package (its error classes).
        client: The SDK's client (`_extractor_client`).
        prompt: The extractor prompt.
        valves: The call's settings.
        sleep: Waits between retries (`_sleep`).

    Returns:
        The reply; empty when the endpoint says the prompt is too long, or the
        reply cannot be read, so the caller shrinks it.

    Raises:
        _ExtractorError: A configuration error, or an outage retries did not end.
    """
    endpoint = _endpoint(valves).base_url
    problem = ""
    attempt = 0
    while True:
        extra = _thinking_fields(valves, endpoint)
        options = _extractor_options(prompt, valves, openai.NOT_GIVEN, extra)
        delay = min(_BACKOFF_BASE_SECONDS * 2**attempt, 30.0)
        try:
            completion = await client.chat.completions.create(**options)
        except openai.APIStatusError as exc:
            refused = _refused_fields(exc.response, extra)
            if refused:
                _remember_refused(endpoint, refused)
                continue  # without them; each field can go only once
            waited = _retry_delay(exc.response, delay, valves)
            if waited is None:
                return _Reply()
            problem = f"the extractor endpoint answered HTTP {exc.status_code}"
            if waited > _MAX_RETRY_AFTER_SECONDS:
                break
            delay = waited
        except openai.APIConnectionError as exc:  # timeouts included
            cause = exc.__cause__
            if isinstance(cause, httpx.UnsupportedProtocol | httpx.InvalidURL):
                raise _ExtractorError(_INVALID_EXTRACTOR_URL) from exc
            problem = f"{type(cause or exc).__name__} talking to the extractor endpoint"
        except (openai.OpenAIError, ValueError, TypeError):
            log.info("extractor reply could not be read")  # e.g. a 200 that is no JSON
            return _Reply()
        else:
            return _reply_parts(completion)
        if attempt >= valves.EXTRACTOR_MAX_RETRIES:
            break
        attempt += 1
        await sleep(delay)
    raise _ExtractorError(f"{problem}; gave up after retries")


# --- end shared: extractor_client ---


# --- shared: extract (made from tools/visit/extract.py) ---
# The reference agent's extractor prompt, byte for byte (typos and the trailing
# space after "Webpage Content" included): the extractor was tuned on it.
EXTRACTOR_PROMPT = (
    "Please process the following webpage content and user goal to extract "
    "relevant information:\n"
    "\n"
    "## **Webpage Content** \n"
    "{webpage_content}\n"
    "\n"
    "## **User Goal**\n"
    "{goal}\n"
    "\n"
    "## **Task Guidelines**\n"
    "1. **Content Scanning for Rationale**: Locate the **specific sections/data** "
    "directly related to the user's goal within the webpage content\n"
    "2. **Key Extraction for Evidence**: Identify and extract the **most relevant "
    "information** from the content, you never miss any important information, "
    "output the **full original context** of the content as far as possible, it "
    "can be more than three paragraphs.\n"
    "3. **Summary Output for Summary**: Organize into a concise paragraph with "
    "logical flow, prioritizing clarity and judge the contribution of the "
    "information to the goal.\n"
    "\n"
    '**Final Output Format using JSON format has "rational", "evidence", '
    '"summary" feilds**\n'
)

# What the model reads for a URL that could not be read (the reference's words).
FAILURE_EVIDENCE = (
    "The provided webpage content could not be accessed. "
    "Please check the URL or file format."
)
FAILURE_SUMMARY = (
    "The webpage content could not be processed, "
    "and therefore, no information is available."
)
# The reference's last try: the page cut to this many characters.
_FINAL_CUT_CHARS = 25_000


@dataclass
class _Outcome:
    """What one URL produced: extracted, a raw excerpt, or a failure."""

    kind: Literal["extracted", "excerpt", "failed"]
    evidence: str = FAILURE_EVIDENCE
    summary: str = FAILURE_SUMMARY
    page: _Page | None = None
    reason: str = ""


# json5 is pure Python (10-20 µs a character, more when nested): above this size
# a reply that is not strict JSON goes to the linear field scraper instead.
_JSON5_MAX_CHARS = 1_000
# Nested lists in a reply are flattened this deep, no deeper.
_MAX_RENDER_DEPTH = 8
# Where an answer object starts: `{` then one of the extractor's keys.
_ANSWER_START = re.compile(r"\{\s*[\"']?(?:rationale?|evidence|summary)\b", re.I)
# Objects tried, from the end of a thought, before giving up on it.
_MAX_ANSWER_STARTS = 8
_BUDGET_SPENT = "the extractor spent its whole reply budget thinking"
_NO_JSON = "the extractor replied without JSON, with thinking only"


def _render(value: Any, depth: int = 0) -> str:
    """Evidence/summary as text: lists line by line, objects as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        if depth >= _MAX_RENDER_DEPTH:
            return ""
        return "\n".join(filter(None, (_render(item, depth + 1) for item in value)))
    if isinstance(value, dict):
        return _json_text(value)
    return str(value)


def _json_text(value: dict) -> str:
    """An object as JSON text ("" when it is nested too deeply to write)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return ""


def _loads(text: str) -> Any:
    """Strict JSON (raw newlines allowed), then json5 on small texts; else None."""
    try:
        return json.loads(text, strict=False)  # C speed, linear
    except (ValueError, RecursionError):
        pass
    if len(text) > _JSON5_MAX_CHARS:
        return None  # the caller's linear scraper takes over
    try:
        import json5  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError:
        return None
    try:
        return json5.loads(text)
    except Exception:  # json5 raises ValueError, RecursionError and others
        return None


_FIELD = re.compile(
    r"[\"']?\b(rationale|rational|evidence|summary)\b[\"']?\s*:\s*", re.I
)


def _scrape_fields(text: str) -> dict[str, Any]:
    """Last resort for broken JSON (unescaped quotes, raw newlines): split on keys.

    Linear in the text: only the last occurrence of each key is read (it is the
    one that counts), so at most four values are parsed.
    """
    matches = list(_FIELD.finditer(text))
    last = {match.group(1).lower(): index for index, match in enumerate(matches)}
    fields: dict[str, Any] = {}
    for key, index in sorted(last.items(), key=lambda item: item[1]):
        match = matches[index]
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        value = text[match.end() : end].strip().rstrip("}").strip().rstrip(",").strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        parsed = _loads(value) if value.startswith("[") else None
        fields[key] = (
            parsed
            if parsed is not None
            else (value.replace("\\n", "\n").replace('\\"', '"'))
        )
    return fields


def _strip_fences(text: str) -> str:
    """Remove outer code fences only: a ``` inside the evidence is page content."""
    if text.startswith("```"):
        rest = text[3:]
        text = rest[len(rest) - len(rest.lstrip(_FENCE_LANGUAGE)) :].lstrip()
    if text.endswith("```"):
        text = text[:-3].rstrip()
    return text


_FENCE_LANGUAGE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _parse_extraction(reply: str) -> tuple[str, str] | None:
    """(evidence, summary) from the extractor reply, or None if unusable.

    Linear in the reply: strict JSON first, json5 only on small replies, then
    the field scraper; no regular expression here can backtrack.
    """
    text = _strip_fences(reply.strip())
    start, end = text.find("{"), text.rfind("}")
    candidate = text[start : end + 1] if start != -1 and end > start else text
    data = _loads(candidate)
    if not isinstance(data, dict):
        data = _scrape_fields(candidate)
    return _fields(data)


def _fields(data: dict) -> tuple[str, str] | None:
    """(evidence, summary) of a parsed reply, or None if it has neither."""
    data = {str(k).lower(): v for k, v in data.items()}
    evidence, summary = _render(data.get("evidence")), _render(data.get("summary"))
    if not evidence and not summary:
        return None
    return (
        evidence or "No verbatim evidence was quoted by the extractor.",
        summary or "The extractor gave no summary.",
    )


def _answer_ending(thought: str) -> tuple[str, str] | None:
    """The answer a thought ends with, if it ends with a well-formed JSON object.

    Used only when the content is empty: with thinking turned off, some
    reasoning parsers (vLLM's deepseek_r1) see no `</think>` and move the whole
    answer into the reasoning field. A thought is otherwise not an answer, so
    the object must close the text and parse as JSON: a draft in mid-thought, or
    broken JSON that only the lenient field scraper would read, is not taken.
    """
    text = _strip_fences(thought.strip())
    if not text.endswith("}"):
        return None
    starts = [match.start() for match in _ANSWER_START.finditer(text)]
    for start in reversed(starts[-_MAX_ANSWER_STARTS:]):
        data = _loads(text[start:])  # an object inside the answer is not closed
        if isinstance(data, dict):
            return _fields(data)
    return None


def _read_reply(reply: _Reply) -> tuple[tuple[str, str] | None, str]:
    """(evidence, summary), or why to stop trying ("" = shrink and retry).

    A reply cut at its token limit before any answer began, or one that is
    thinking only, comes back the same way if asked again: the page start is
    given at once instead of the reference's four shrinking retries.
    """
    answer = reply.answer.strip()
    # A cut reply is read only where an answer visibly began: without think
    # tags, text that does not start like JSON may be a thought the chat
    # template opened, and a draft in it must not pass for the answer.
    if reply.cut and not _strip_fences(answer).startswith("{"):
        answer = ""
    if answer:
        parsed = _parse_extraction(answer) if len(answer) >= 10 else None
        return parsed, ""  # without usable JSON: the reference's retries
    if reply.cut:
        return None, _BUDGET_SPENT
    if reply.thought.strip():
        return _answer_ending(reply.thought), _NO_JSON
    return None, ""  # nothing at all: the reference's retries


def _document(page: _Page) -> str:
    """The page as the extractor sees it (the reference used Jina Reader's layout)."""
    return (
        f"Title: {page.title}\n\nURL Source: {page.final_url}\n\n"
        f"Markdown Content:\n{page.text}"
    )


def _excerpt(
    page: _Page, note: str, valves: "Tools.Valves", reason: str = ""
) -> _Outcome:
    """Fallback when no extractor can run: the page's beginning, clearly labelled.

    `note` opens the model-facing summary; `reason` is the short cause the
    user sees in the status line (the note when not given).
    """
    text = page.text[: valves.RAW_EXCERPT_CHARS].rstrip()
    if len(page.text) > valves.RAW_EXCERPT_CHARS:
        text += "\n[…]"
    summary = (
        f"{note}, so the evidence above is the beginning of the page text, "
        "not a goal-focused extract."
    )
    return _Outcome("excerpt", text, summary, page, reason or note)


def _fallback_status(url: str, outcome: _Outcome) -> str:
    """What the user is told when a page is given as its start, not extracted."""
    return (
        f"Could not extract from {url} ({outcome.reason}); gave the page start instead"
    )


async def _extract(
    page: _Page,
    goal: str,
    valves: "Tools.Valves",
    *,
    sleep: Sleep = _sleep,
    openai_sdk: Callable[[], Awaitable[Any]] = _openai_sdk,
    tls: _TlsContexts = _SSL_CONTEXTS,
) -> _Outcome:
    """Run the extractor like the reference: shrink 70% ×3, then 25,000 chars.

    Args:
        page: The page read.
        goal: The model's goal for it.
        valves: The call's settings.
        sleep: Waits between retries (`_sleep`).
        openai_sdk: Imports the `openai` package (`_openai_sdk`).
        tls: The TLS contexts to connect with (the process's).

    Returns:
        The extract; the page start when no extractor can run.
    """
    if not valves.EXTRACTOR_BASE_URL.strip():
        return _excerpt(
            page,
            "No extractor model is configured (EXTRACTOR_BASE_URL valve)",
            valves,
            "no extractor model is configured",
        )
    try:
        openai = await openai_sdk()
        async with _extractor_client(openai, valves, tls) as client:
            ask = functools.partial(
                _call_extractor, openai, client, valves=valves, sleep=sleep
            )
            return await _extract_with_retries(page, goal, valves, ask)
    except _ExtractorError as exc:
        # The one exit of extractor errors: redacted before anyone sees them.
        reason = _redact(str(exc), _endpoint_secrets(valves))
        return _excerpt(page, f"Extraction failed: {reason}", valves, reason)


async def _extract_with_retries(
    page: _Page,
    goal: str,
    valves: "Tools.Valves",
    ask: Callable[[str], Awaitable[_Reply]],
) -> _Outcome:
    """The reference's attempts: an unusable reply shrinks the page and retries.

    Args:
        page: The page read.
        goal: The model's goal for it.
        valves: The call's settings.
        ask: Sends a prompt to the extractor (`_call_extractor`).

    Returns:
        The extract, the page start after a reply that was all thinking, or
        a failure when no reply was usable.
    """
    # The prompt must be encodable: see `_well_formed`.
    content, goal = _well_formed(_document(page)), _well_formed(goal)
    for attempt in range(5):
        prompt = EXTRACTOR_PROMPT.format(webpage_content=content, goal=goal)
        reply = await ask(prompt)
        parsed, stop = _read_reply(reply)
        if parsed:
            return _Outcome("extracted", parsed[0], parsed[1], page)
        log.info(
            "extractor reply unusable (attempt %d, %d chars, %s)",
            attempt + 1,
            len(reply.answer) + len(reply.thought),
            stop or "retrying",
        )
        if stop:
            return _thinking_excerpt(page, stop, valves)
        # Like the reference: 70% of the content three times, then 25,000 chars.
        if attempt < 3:
            content = content[: int(len(content) * 0.7)]
        else:
            content = content[:_FINAL_CUT_CHARS]
    return _Outcome("failed", page=page, reason="the extractor gave no usable answer")


# Surrogate code points: half of a UTF-16 pair, never a character of their own.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _well_formed(text: str) -> str:
    r"""`text` with every surrogate code point replaced by U+FFFD.

    A Python string can hold lone surrogates that no UTF-8 encoder accepts:
    json.loads makes one of the `"\ud83d"` a model may write in its tool
    call's goal, and a page's text may hold them too. Sent as they are, they
    make the extractor request fail to encode (UnicodeEncodeError), and every
    attempt with it.
    """
    # Checked in C first (isascii reads a flag; encoding a page takes about a
    # millisecond): the regex pass, several milliseconds a page on the event
    # loop, runs only when a surrogate is there.
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _thinking_excerpt(page: _Page, reason: str, valves: "Tools.Valves") -> _Outcome:
    """The page start after a reply that was all thinking, with what to change."""
    if reason == _BUDGET_SPENT:
        hint = "EXTRACTOR_MAX_TOKENS is its reply budget"
    else:
        hint = "EXTRACTOR_DISABLE_THINKING asks the server to skip thinking"
    return _excerpt(page, f"Extraction failed: {reason} ({hint})", valves, reason)


# --- end shared: extract ---


# --- shared: format (made from tools/visit/format.py) ---
INVALID_REQUEST = (
    "[Visit] Invalid request format: Input must be a JSON object containing "
    "'url' and 'goal' fields"
)
URL_SEPARATOR = "\n=======\n"


def _format_block(url: str, goal: str, evidence: str, summary: str) -> str:
    return (
        f"The useful information in {url} for user goal {goal} as follows: \n\n"
        f"Evidence in page: \n{evidence}\n\n"
        f"Summary: \n{summary}\n\n"
    )


def _coerce_urls(url: Any) -> list[str] | None:
    """A list of non-empty URL strings, or None if the input is unusable."""
    if isinstance(url, str):
        text = url.strip()
        if text.startswith("["):  # a JSON array sent as a string
            with contextlib.suppress(ValueError):
                url = json.loads(text)
        if isinstance(url, str):
            url = [text]
    if not isinstance(url, list | tuple) or not all(isinstance(u, str) for u in url):
        return None
    urls = [u.strip() for u in url if u.strip()]
    return urls or None


def _kept_note(page: _Page) -> str:
    """How much of the page the extractor reads, e.g. "main content, 5,210 of 10,377".

    Empty when not known (a page from an older cache).
    """
    text = page.text.removesuffix(TRUNCATION_NOTE).rstrip()
    kept = len(text)
    cut = ", cut to the reading budget" if len(text) < len(page.text) else ""
    if page.reading == "main" and page.page_chars:
        return f"main content, {kept:,} of {page.page_chars:,} characters{cut}"
    if page.reading == "whole":
        return f"whole page, {kept:,} characters{cut}"
    if page.reading == "document":
        return f"whole document, {kept:,} characters{cut}"
    if page.reading == "loader":
        return f"text from Open WebUI's loader, {kept:,} characters{cut}"
    return ""


def _status(description: str, done: bool = False) -> dict:
    return {"type": "status", "data": {"description": description, "done": done}}


def _source_event(url: str, goal: str, outcome: _Outcome) -> dict:
    """The source card: the evidence, and how much of the page was read."""
    page = outcome.page or _Page(url, "", "")
    title = page.title or url
    kept = _kept_note(page)
    card = f"{outcome.evidence}\n\n[Read: {kept}]" if kept else outcome.evidence
    meta = {
        "source": url,
        "name": title,
        "url": url,
        "final_url": page.final_url,
        "redirects": list(page.redirects),
        "goal": goal,
        "summary": outcome.summary,
        "kept": kept,
    }
    return {
        "type": "source",
        "data": {
            "source": {"name": title, "url": url},
            "document": [card],
            "metadata": [meta],
        },
    }


# --- end shared: format ---


# --- shared: read (made from tools/visit/read.py) ---
# Pages being loaded, by cache key: a second read of the same page in the same
# chat (a heavy run's rollouts often read the same pages at the same time)
# waits for the first instead of fetching it again.
_LOADING: dict[tuple[str, str], "asyncio.Future[_Page]"] = {}


@dataclass(frozen=True)
class _Seams:
    """How a visit call reaches the world: the real parts unless others are given.

    `Tools(seams=...)` gives a tool other ones (tests give fakes). Each default
    is this module's own part, looked up when the seams are made (at the start
    of a call given none), not when the module is loaded.
    """

    # Resolves a host name (DNS).
    resolve: Resolver = field(default_factory=lambda: _resolve)
    # Finds Open WebUI's page loader.
    find_loader: LoaderFinder = field(default_factory=lambda: _openwebui_content_loader)
    # Makes the built-in fetcher's HTTP client.
    http_client: ClientFactory = field(default_factory=lambda: _http_client)
    # The TLS contexts to connect with.
    tls: _TlsContexts = field(default_factory=lambda: _SSL_CONTEXTS)
    # Converts pages: worker processes, or a thread when none can run.
    converter: _ConverterState = field(default_factory=lambda: _CONVERTER)
    # Waits between extractor retries.
    sleep: Sleep = field(default_factory=lambda: _sleep)
    # Imports the `openai` package the extractor is called through.
    openai_sdk: Callable[[], Awaitable[Any]] = field(
        default_factory=lambda: _openai_sdk
    )
    # Pages read, per chat; and the pages being loaded now.
    pages: _PageCache = field(default_factory=lambda: _PAGE_CACHE)
    loading: dict[tuple[str, str], "asyncio.Future[_Page]"] = field(
        default_factory=lambda: _LOADING
    )


@dataclass
class _CallContext:
    """Everything one `visit` call shares between its URLs (never on `self`)."""

    valves: "Tools.Valves"
    goal: str
    request: Any
    chat_id: str
    emitter: Callable[[dict], Awaitable[Any]] | None
    semaphore: asyncio.Semaphore
    seams: _Seams = field(default_factory=_Seams)


async def _visit_one(url: str, ctx: "_CallContext") -> _Outcome:
    """Read and extract one URL; every failure becomes a failed outcome."""
    reason = ""
    try:
        async with ctx.semaphore, asyncio.timeout(ctx.valves.URL_TIMEOUT_SECONDS):
            await _send_event(ctx.emitter, _status(f"Reading: {url}"))
            page = await _get_page(url, ctx)
            if kept := _kept_note(page):
                await _send_event(ctx.emitter, _status(f"Reading {url}: {kept}"))
            seams = ctx.seams
            outcome = await _extract(
                page,
                ctx.goal,
                ctx.valves,
                sleep=seams.sleep,
                openai_sdk=seams.openai_sdk,
                tls=seams.tls,
            )
        if outcome.kind == "excerpt":
            await _send_event(ctx.emitter, _status(_fallback_status(url, outcome)))
        if outcome.kind != "failed":
            await _send_event(ctx.emitter, _source_event(url, ctx.goal, outcome))
            return outcome
        reason = outcome.reason
    except _RefusedError as exc:
        reason = f"refused: {exc}"
    except _PageError as exc:
        reason = str(exc)
    except TimeoutError:
        reason = "timed out"
    except Exception as exc:  # one bad URL never fails the batch
        log.exception("visit failed for %s", url)
        reason = f"unexpected error ({type(exc).__name__})"
    log.info("visit: could not read %s: %s", url, reason)
    await _send_event(ctx.emitter, _status(f"Could not read {url}: {reason}"))
    return _Outcome("failed", reason=reason)


async def _get_page(url: str, ctx: "_CallContext") -> _Page:
    """Safety check first, then the chat's cache, then a loader."""
    valves = ctx.valves
    # One wall-clock budget for the page, the DNS lookup of the check included.
    deadline = asyncio.get_running_loop().time() + valves.PAGE_TIMEOUT_SECONDS
    async with asyncio.timeout_at(deadline):
        target = await _check_url(
            url, valves.ALLOW_PRIVATE_URLS, resolve=ctx.seams.resolve
        )
    key = (ctx.chat_id, target.url)
    use_cache = bool(ctx.chat_id) and valves.CACHE_TTL_SECONDS > 0
    pages = ctx.seams.pages
    cached = pages.get(key, valves.CACHE_TTL_SECONDS) if use_cache else None
    if cached is not None:
        return cached
    if not use_cache:
        async with asyncio.timeout_at(deadline):
            return await _load(target, ctx)
    async with asyncio.timeout_at(deadline):
        return await _load_once(key, target, ctx)


async def _load_once(
    key: tuple[str, str], target: _Target, ctx: "_CallContext"
) -> _Page:
    """`_load`, once per page and chat at a time; the page is cached."""
    in_flight = ctx.seams.loading
    loading = in_flight.get(key)
    if loading is not None and loading.get_loop() is asyncio.get_running_loop():
        try:
            return await asyncio.shield(loading)
        except asyncio.CancelledError:
            if not loading.cancelled():
                raise  # this read itself was cancelled
            # The first reader was stopped (its chat's run was): read it here.
    future: asyncio.Future[_Page] = asyncio.get_running_loop().create_future()
    in_flight[key] = future
    try:
        page = await _load(target, ctx)
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(exc)
            future.exception()  # retrieved: no warning when nobody waits
        raise
    else:
        future.set_result(page)
        ctx.seams.pages.put(key, page)
        return page
    finally:
        if in_flight.get(key) is future:
            del in_flight[key]


async def _load(target: _Target, ctx: "_CallContext") -> _Page:
    """The built-in fetcher, or Open WebUI's loader when it is the one to use."""
    valves, seams = ctx.valves, ctx.seams
    if await _wants_openwebui_loader(valves.PAGE_LOADER, ctx.request):
        try:
            page = await _load_with_openwebui(
                ctx.request,
                target.url,
                valves,
                find_loader=seams.find_loader,
                converter=seams.converter,
            )
        except _MangledFileError:
            # A file (a PDF) the loader decoded as text, in either mode: only
            # its exact bytes hold its text, and a browser adds nothing to it.
            log.info("Open WebUI's loader mangled a file; downloading it")
        else:
            if page is not None:
                return page
            if valves.PAGE_LOADER == "openwebui":
                raise _PageError("Open WebUI's page loader returned nothing")
        # auto: a browser/service engine that gave nothing. The built-in fetcher
        # is the stricter path, so a page cannot weaken the checks this way.
    try:
        raw = await _fetch_builtin(
            target,
            valves,
            resolve=seams.resolve,
            http_client=seams.http_client,
            tls=seams.tls,
        )
    except httpx.TimeoutException as exc:
        raise _PageError("timed out") from exc
    except httpx.HTTPError as exc:
        raise _PageError(f"network error ({type(exc).__name__})") from exc
    return await _convert_page(raw, valves.MAX_PAGE_TOKENS, seams.converter)


def _task_outcome(task: "asyncio.Task[_Outcome]") -> _Outcome:
    """A finished task's outcome; a crashed task counts as a failure."""
    if task.cancelled() or task.exception() is not None:
        return _Outcome("failed", reason="internal error")
    return task.result()


# --- end shared: read ---


# Open WebUI 0.6 offers every callable attribute of `Tools` not named `__*` as a
# tool (private `_x` methods included, which then fail its spec builder), so
# the class holds the tool method only; its helpers are the functions above.


class Tools:
    """Open WebUI Tools module with one tool: `visit`."""

    class Valves(BaseModel):
        """Settings an administrator can change in Open WebUI."""

        PAGE_LOADER: Literal["auto", "openwebui", "builtin"] = Field(
            default="auto",
            description="auto: the built-in fetcher (checks every address and "
            "redirect, connects to the checked address, caps size); inside Open "
            "WebUI its loader instead when its web loader engine is a browser or "
            "service (playwright, firecrawl, tavily, external…), with the built-in "
            "fetcher when that returns nothing. openwebui: Open WebUI's loader "
            "only (the tool checks each URL's addresses first; redirects and the "
            "connection are then Open WebUI's). builtin: the built-in fetcher only.",
        )
        ALLOW_PRIVATE_URLS: bool = Field(
            default=False,
            description="Also read private/loopback addresses (intranets). Inside "
            "Open WebUI its loader also needs ENABLE_LOCAL_WEB_FETCH "
            "(ENABLE_RAG_LOCAL_WEB_FETCH before 0.11).",
        )
        VERIFY_SSL: bool = Field(default=True, description="Verify TLS certificates.")
        MAX_REDIRECTS: int = Field(
            default=5, ge=0, le=20, description="Redirects per URL."
        )
        MAX_DOWNLOAD_BYTES: int = Field(
            default=10_000_000,
            ge=10_000,
            description="Body size cap, on the wire and after decompression.",
        )
        PAGE_TIMEOUT_SECONDS: float = Field(
            default=30, gt=0, description="Time to read a page."
        )
        URL_TIMEOUT_SECONDS: float = Field(
            default=300,
            gt=0,
            description="Time per URL, reading and extraction together.",
        )
        MAX_PAGE_TOKENS: int = Field(
            default=95_000,
            ge=1_000,
            description="Reading budget per page (estimated tokens).",
        )
        MAX_URLS_PER_CALL: int = Field(
            default=5, ge=1, le=50, description="URLs per call."
        )
        CONCURRENT_URLS: int = Field(
            default=5, ge=1, le=20, description="URLs read at once."
        )
        CACHE_TTL_SECONDS: int = Field(
            default=3600,
            ge=0,
            description="Reuse a page within a chat this long (0 = off).",
        )
        EXTRACTOR_BASE_URL: str = Field(
            default="",
            description="OpenAI-compatible base URL, e.g. http://host:8000/v1 "
            "(user:password@ in it is sent as Basic auth when no key is set).",
        )
        EXTRACTOR_API_KEY: str = Field(
            default="", description="Extractor API key (optional)."
        )
        EXTRACTOR_MODEL: str = Field(default="", description="Extractor model name.")
        EXTRACTOR_TEMPERATURE: float = Field(
            default=0.7, ge=0, le=2, description="Temperature."
        )
        EXTRACTOR_MAX_TOKENS: int = Field(
            default=8192,
            ge=0,
            description="Extractor reply limit (0 = server default).",
        )
        EXTRACTOR_TIMEOUT_SECONDS: float = Field(
            default=180, gt=0, description="Timeout of one extractor request."
        )
        EXTRACTOR_DISABLE_THINKING: bool = Field(
            default=True,
            description="Ask the server to skip the extractor's thinking "
            "(chat_template_kwargs enable_thinking=false for vLLM, SGLang and "
            "llama.cpp; reasoning_effort none for Ollama). A server that refuses "
            "a field is asked again without it. Turn off for an extractor that "
            "should think.",
        )
        EXTRACTOR_MAX_RETRIES: int = Field(
            default=3, ge=0, le=10, description="Retries after timeouts, 429 and 5xx."
        )
        RAW_EXCERPT_CHARS: int = Field(
            default=6000,
            ge=500,
            description="Page text shown when no extractor can run.",
        )

    def __init__(self, seams: "_Seams | None" = None) -> None:
        """Create the tool with default valves.

        Args:
            seams: How its calls reach the world (DNS, Open WebUI's loader,
                HTTP, TLS, the converter, waits); None for the real parts.
                Open WebUI passes none; tests pass fakes.
        """
        self.valves = self.Valves()
        self.citation = False  # sources are emitted by the tool itself
        # Data, not a callable: Open WebUI offers callable attributes as tools.
        self._seams = seams

    async def visit(  # noqa: PLR0917  (Open WebUI's reserved parameters)
        self,
        url: list[str],
        goal: str,
        __request__: Any = None,
        __user__: dict | None = None,
        __event_emitter__: Callable[[dict], Awaitable[Any]] | None = None,
        __chat_id__: str | None = None,
    ) -> str:
        """Visit webpage(s) and return the summary of the content.

        :param url: The URL(s) of the webpage(s) to visit, as an array of URLs.
        :param goal: The goal of the visit for webpage(s).
        """
        urls = _coerce_urls(url)
        if urls is None or not isinstance(goal, str):
            return ToolResult(INVALID_REQUEST, ok=False)
        valves = self.valves.model_copy()  # read at call time: the pipe may set them
        kept, skipped = (
            urls[: valves.MAX_URLS_PER_CALL],
            urls[valves.MAX_URLS_PER_CALL :],
        )
        ctx = _CallContext(
            valves, goal, __request__, str(__chat_id__ or ""), __event_emitter__,
            asyncio.Semaphore(valves.CONCURRENT_URLS), self._seams or _Seams(),
        )  # fmt: skip
        tasks: dict[str, asyncio.Task[_Outcome]] = {}
        for item in kept:  # the same URL twice in one call is read once
            key = _normalize_url(item)
            if key not in tasks:
                tasks[key] = asyncio.create_task(_visit_one(item, ctx))
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        outcomes = {key: _task_outcome(task) for key, task in tasks.items()}
        blocks = []
        for item in kept:
            outcome = outcomes[_normalize_url(item)]
            blocks.append(_format_block(item, goal, outcome.evidence, outcome.summary))
        text = URL_SEPARATOR.join(blocks)
        if skipped:
            text += (
                f"\n\n[Visit] Only {len(kept)} URLs are read per call; not read: "
                f"{', '.join(skipped)}. Visit them in another call if still needed."
            )
        read = sum(1 for o in outcomes.values() if o.kind != "failed")
        await _send_event(
            ctx.emitter, _status(f"Read {read} of {len(outcomes)} page(s)", done=True)
        )
        # The pages read, in the order asked for (the source events the tool
        # emitted as each page came in carry the same data).
        first_asked: dict[str, str] = {}
        for item in kept:
            first_asked.setdefault(_normalize_url(item), item)
        sources = [
            _source_event(item, goal, outcomes[key])["data"]
            for key, item in first_asked.items()
            if outcomes[key].kind != "failed"
        ]
        # A page read (even as a plain excerpt) makes the call a success.
        return ToolResult(text.strip(), ok=read > 0, sources=tuple(sources))
