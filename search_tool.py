"""
id: deepresearch_search
title: DeepResearch Search
author: tongyi-deepresearch-openwebui-pipeline contributors
author_url: https://github.com/tongyi-deepresearch-openwebui/tongyi-deepresearch-openwebui-pipeline
version: 0.2.0
license: MIT
description: Web search for Tongyi DeepResearch, answered in the exact text format the model was trained on (Open WebUI's web search engine or a SearXNG instance).
requirements:
required_open_webui_version: 0.6.0
"""  # noqa: D205, D212, D415, E501  (Open WebUI frontmatter)

# The `search` tool of Tongyi DeepResearch as an Open WebUI Tools module.
#
# It searches through the web search engine the administrator configured in
# Open WebUI (Admin Settings -> Web Search) or, when the SEARXNG_URL valve is
# set, straight against a SearXNG instance. The output reproduces the reference
# agent's format byte for byte, because the model was trained on it.
#
# Decision on empty results: the reference prints "found 0 results" for an empty
# Serper list and "No results found ... Try with a more general query." when the
# answer has no result list. Open WebUI engines return an empty list both for
# "nothing found" and for swallowed engine errors, so an empty list is reported
# with the no-results text: it is a reference format and it tells the model
# what to do next.
#
# Decision on "Source:": the reference prints Serper's "source" (a site name)
# under each result that has one. SearXNG results get the link's host in that
# line (its engine name would name no site); Open WebUI's engines return only
# title, link and snippet, so their results have no Source line, as Serper
# results without the field have none.
#
# This file is self-contained (stdlib, pydantic, httpx) so Open WebUI can load it
# on its own; Open WebUI is imported only inside `_import_openwebui`.

import asyncio
import inspect
import json
import logging
import math
import re
import ssl
import threading
import traceback
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Any, TypeVar
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import httpx
from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

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


# --- shared: search_common (made from tools/shared/search_common.py) ---
Made = TypeVar("Made")


SEPARATOR = "\n=======\n"


MAX_URL_CHARS = 2_000


TITLE_CHARS = 300


# Open WebUI raises e.g. "No SEARXNG_QUERY_URL found in environment variables"
# or "No search engine API key found ..." when the engine lacks its settings.
MISSING_CONFIG = re.compile(r"^No .*found", re.IGNORECASE)


_NOT_IN_URL = re.compile(r"[\s\x00-\x1f\x7f]")


def _link(value: Any) -> str:
    """An http(s) URL from a backend, or '' when it is not one a reader could open.

    Links are untrusted: anything else (a `javascript:` link, an unparsable
    host such as `http://[::1`, a line break that would forge a result line)
    would reach the model as a citation and the user's browser as a source.
    """
    url = value.strip() if isinstance(value, str) else ""
    if not url or len(url) > MAX_URL_CHARS or _NOT_IN_URL.search(url):
        return ""
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # both raise on malformed hosts
    except ValueError:
        return ""
    return url if parts.scheme.lower() in {"http", "https"} and host else ""


def _score(result: dict) -> float:
    """A SearXNG score as a number; anything but a finite number counts as 0."""
    value = result.get("score")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    try:
        number = float(value)
    except OverflowError:
        return 0.0
    return number if math.isfinite(number) else 0.0


async def _emit(emitter: Emitter | None, **data: Any) -> None:
    """Send a status event; a failing emitter never stops the search."""
    await _send_event(emitter, {"type": "status", "data": data})


def _ranked(results: list) -> list[dict]:
    """The results that are objects, best SearXNG score first (as Open WebUI)."""
    return sorted((r for r in results if isinstance(r, dict)), key=_score, reverse=True)


def _normalise_queries(query: Any) -> list[str] | None:
    """Distinct, stripped queries in input order; None when the input is invalid."""
    if isinstance(query, str):
        query = [query]
    if not isinstance(query, list) or not all(isinstance(q, str) for q in query):
        return None
    return list(dict.fromkeys(q.strip() for q in query if q.strip())) or None


def _skipped_note(skipped: list[str], limit: int) -> str:
    """Model-facing note naming the queries that were over the per-call limit."""
    names = ", ".join(f"'{q}'" for q in skipped)
    return (
        f"\n\nNote: only the first {limit} queries of this call were searched "
        f"(limit per call). Not searched: {names}. "
        "Call the tool again with these queries if you still need them."
    )


def _positive(value: Any, default: int, ceiling: int | None = None) -> int:
    """A valve limit as an int from 1 (to `ceiling`); non-numbers give the default."""
    try:
        number = max(int(value), 1)
    except (TypeError, ValueError):
        return default
    return number if ceiling is None else min(number, ceiling)


def _cut(text: str, limit: int) -> str:
    """Text of at most about `limit` characters, cut at a word."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " …"


def _field(item: Any, name: str) -> Any:
    """Read a field from a dict or an object (Open WebUI's SearchResult)."""
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _first_made(
    items: list, count: int, make: Callable[[Any], Made | None]
) -> list[Made]:
    """The first `count` items `make` turns into a result (None: not one).

    An item `make` cannot read (an odd result object) is skipped.
    """
    made: list[Made] = []
    for item in items:
        if len(made) >= count:
            break
        try:
            result = make(item)
        except Exception:  # noqa: S112  (an odd result object)
            continue
        if result:
            made.append(result)
    return made


# --- end shared: search_common ---


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


# --- shared: backend_http (made from tools/shared/backend_http.py) ---
T = TypeVar("T")


# Backend answers are untrusted: at most this many bytes are read, counted on
# the wire and again after decompression.
MAX_RESPONSE_BYTES = 5_000_000


# Larger answers are parsed in a worker thread: parsing a few MB of JSON (or
# XML) and picking its records would hold the event loop for tenths of a second.
# The thread parses in steps (see _parse_json) between which the loop runs; an
# answer this small is one step, parsed on the loop.
INLINE_PARSE_BYTES = 65_536


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


async def _read_body(response: httpx.Response) -> bytes:
    """The decoded body; _TooLargeError past the cap, ValueError if unreadable.

    A backend answer is data, read whole or not at all: bytes after the end
    of its compressed stream, or a stream that ends early, make it unreadable.
    """
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        raise _TooLargeError
    download = await _download(response, MAX_RESPONSE_BYTES)
    if download.over_cap:
        raise _TooLargeError
    if download.trailing or download.more_members:
        raise ValueError("data after the end of the compressed body")
    if not download.complete:
        raise ValueError("compressed body ended early")
    return download.body


def _backend_failure(
    exc: BaseException, service: str, unreadable: tuple[type[Exception], ...] = ()
) -> str:
    """A short reason a backend call failed, without URLs or secrets.

    Args:
        exc: What the call raised.
        service: The backend as the model reads it ("the search engine").
        unreadable: Errors of a parser besides ValueError: the answer could
            not be read.

    Returns:
        The reason, e.g. "the search engine answered HTTP 503".
    """
    if isinstance(exc, _TooLargeError):
        limit = MAX_RESPONSE_BYTES // 1_000_000
        return f"{service} sent an answer larger than {limit} MB"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{service} answered HTTP {exc.response.status_code}"
    if isinstance(exc, httpx.TransportError):
        return f"{service} could not be reached"
    if isinstance(exc, (ValueError, *unreadable)):
        return f"{service} sent an answer that could not be read"
    return f"unexpected error ({type(exc).__name__})"


class _RedirectLoopError(httpx.TransportError):
    """A backend that redirected more often than httpx follows: no answer came.

    A transport error, so the tools tell the model the service could not be
    reached (httpx's TooManyRedirects is not one: the tools called it an
    unexpected error).
    """


async def _get(client: httpx.AsyncClient, endpoint: _Endpoint, params: dict) -> bytes:
    """GET a backend answer, bounded in size (see _read_body)."""
    try:
        async with client.stream(
            "GET",
            endpoint.url,
            params=params,
            auth=endpoint.auth,
            headers={"Accept-Encoding": ACCEPT_ENCODING},
        ) as response:
            response.raise_for_status()
            return await _read_body(response)
    except httpx.TooManyRedirects as exc:
        raise _RedirectLoopError("the backend redirected too many times") from exc


# json's C parser holds the interpreter lock for a whole call: one json.loads
# of a 5 MB answer stalled the event loop for tenths of a second, even from a
# worker thread. Answers are parsed in steps of at most this many characters
# instead (well under a millisecond each), and the worker thread hands the
# lock back to the event loop between steps.
JSON_STEP_CHARS = 65_536


# A list or object bigger than a step is read member by member (each member in
# steps again): at most this deep (an answer's result list, a big record and
# its author list: three or four) ...
JSON_MAX_SPLIT_DEPTH = 8


# ... and at most this many members in all (a result list of hundreds, ten
# thousand for a big SearXNG page; 2.4 million bare zeros are not an answer).
JSON_MAX_SPLIT_VALUES = 100_000


# A value is first tried in a window this big (or twice the size of the
# member before it: records in a list are alike), then four times bigger up
# to a step: a member costs a few times its size at most, never a whole step.
_JSON_FIRST_WINDOW = 256


_JSON_RAW_DECODE = json.JSONDecoder().raw_decode


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


# Whole units of a JSON string (no quote, no control character, complete
# escapes): a step boundary placed after them never splits an escape.
_JSON_STRING_UNITS = re.compile(
    r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*+'
)


_JSON_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")


RawDecode = Callable[[str, int], tuple[Any, int]]


def _parse_json(body: bytes, raw_decode: RawDecode = _JSON_RAW_DECODE) -> Any:
    """A backend answer as JSON: json.loads's value, read in bounded steps.

    (Tests watch this function to see which thread parses an answer.)

    Args:
        body: The answer's bytes (UTF-8, -16 or -32, as json.loads reads them).
        raw_decode: json's `JSONDecoder.raw_decode` (the value at an index,
            and where it ends); no call is given more than JSON_STEP_CHARS
            characters.

    Returns:
        The value json.loads(body) gives.

    Raises:
        ValueError: What json.loads refuses, and answers that nest big values
            deeper than JSON_MAX_SPLIT_DEPTH or hold more than
            JSON_MAX_SPLIT_VALUES members of big values.
    """
    return _JsonSteps(_json_text(body), raw_decode).document()


def _json_text(body: bytes) -> str:
    """The body decoded as json.loads decodes bytes, a step at a time."""
    import codecs  # noqa: PLC0415  (the tools' import lists are not shared code)

    decoder = codecs.getincrementaldecoder(json.detect_encoding(body))("surrogatepass")
    pieces = [
        decoder.decode(body[start : start + JSON_STEP_CHARS])
        for start in range(0, len(body), JSON_STEP_CHARS)
    ]
    pieces.append(decoder.decode(b"", final=True))
    return "".join(pieces)


def _next_window(size: int) -> int:
    """The first window for a member after one of `size` characters."""
    return min(max(2 * size, _JSON_FIRST_WINDOW), JSON_STEP_CHARS)


class _JsonSteps:
    """One JSON text read in steps: each value whole if it fits, else by members."""

    def __init__(self, text: str, raw_decode: RawDecode) -> None:
        """Prepare to read `text` with json's `raw_decode`."""
        self.text = text
        self.raw_decode = raw_decode
        self.split_values = 0

    def document(self) -> Any:
        """The text's one value (whitespace around it allowed, nothing else)."""
        start = self.space(0)
        # A text longer than a step holds a longer value (but for trailing
        # spaces): no need to try it whole.
        fits = len(self.text) - start <= JSON_STEP_CHARS
        whole = self.whole(start, JSON_STEP_CHARS) if fits else None
        value, end = whole or self.split(start, 0)
        if self.space(end) != len(self.text):
            raise ValueError(f"Extra data at character {end}")
        return value

    def space(self, pos: int) -> int:
        """Where the whitespace starting at `pos` ends."""
        while True:
            spaces = _JSON_SPACE.match(self.text, pos, pos + JSON_STEP_CHARS)
            end = spaces.end() if spaces is not None else pos
            if end < pos + JSON_STEP_CHARS:
                return end
            pos = end

    def value(
        self, pos: int, depth: int, window: int = _JSON_FIRST_WINDOW
    ) -> tuple[Any, int]:
        """The value starting at `pos` (tried in `window` first), and its end."""
        return self.whole(pos, window) or self.split(pos, depth)

    def whole(self, pos: int, window: int) -> tuple[Any, int] | None:
        """The value at `pos` read in one step, or None when it needs more.

        Windows grow four-fold up to a step. A number cut by the window's
        edge still reads as a shorter number ("30." as 30, "1e+" as 1), so a
        value that ends within two characters of the edge counts as cut.
        """
        remaining = len(self.text) - pos
        while True:
            piece = self.text[pos : pos + window]
            try:
                value, end = self.raw_decode(piece, 0)
            except (ValueError, RecursionError):
                pass  # cut by the window, or malformed: `split` tells which
            else:
                if end + 2 < len(piece) or len(piece) == remaining:
                    return value, pos + end
            if window >= JSON_STEP_CHARS or len(piece) == remaining:
                return None
            window = min(4 * window, JSON_STEP_CHARS)

    def split(self, pos: int, depth: int) -> tuple[Any, int]:
        """A value too big (or too broken) for one step, read in parts."""
        opener = self.text[pos : pos + 1]
        if opener == '"':
            return self.long_string(pos)
        if opener not in {"{", "["}:
            raise ValueError(f"Expecting value at character {pos}")
        if depth >= JSON_MAX_SPLIT_DEPTH:
            raise ValueError("the answer nests values too deeply")
        if opener == "{":
            return self.members(pos, depth + 1)
        return self.elements(pos, depth + 1)

    def counted(self) -> None:
        """Count one member read by hand; refuse past JSON_MAX_SPLIT_VALUES."""
        self.split_values += 1
        if self.split_values > JSON_MAX_SPLIT_VALUES:
            raise ValueError(
                f"the answer has more than {JSON_MAX_SPLIT_VALUES} values "
                "to read one by one"
            )

    def after(self, pos: int, token: str) -> int:
        """The position after `token` at `pos` (ValueError if it is not there)."""
        if not self.text.startswith(token, pos):
            raise ValueError(f"Expecting {token!r} at character {pos}")
        return pos + len(token)

    def members(self, pos: int, depth: int) -> tuple[dict, int]:
        """The object starting at `pos`, member by member."""
        found: dict = {}
        window = _JSON_FIRST_WINDOW
        pos = self.space(pos + 1)
        if self.text.startswith("}", pos):
            return found, pos + 1
        while True:
            if not self.text.startswith('"', pos):
                raise ValueError(f"Expecting property name at character {pos}")
            name, pos = self.value(pos, depth)
            pos = self.space(self.after(self.space(pos), ":"))
            member, end = self.value(pos, depth, window)
            found[name] = member
            window, pos = _next_window(end - pos), end
            self.counted()
            pos = self.space(pos)
            if self.text.startswith("}", pos):
                return found, pos + 1
            pos = self.space(self.after(pos, ","))

    def elements(self, pos: int, depth: int) -> tuple[list, int]:
        """The array starting at `pos`, element by element."""
        found: list = []
        window = _JSON_FIRST_WINDOW
        pos = self.space(pos + 1)
        if self.text.startswith("]", pos):
            return found, pos + 1
        while True:
            element, end = self.value(pos, depth, window)
            found.append(element)
            window, pos = _next_window(end - pos), end
            self.counted()
            pos = self.space(pos)
            if self.text.startswith("]", pos):
                return found, pos + 1
            pos = self.space(self.after(pos, ","))

    def long_string(self, pos: int) -> tuple[str, int]:
        """A string longer than a step, decoded a step of whole units at a time."""
        parts: list[str] = []
        start = pos + 1
        while True:
            cut = self.unit_boundary(start)
            piece, end = self.raw_decode('"' + self.text[start:cut] + '"', 0)
            if end != cut - start + 2:
                raise ValueError(f"Invalid string at character {start}")
            parts.append(piece)
            if self.text.startswith('"', cut):
                return "".join(parts), cut + 1
            if cut == start:  # a control character, a bad escape, the end
                raise ValueError(f"Unterminated string starting at character {pos}")
            start = cut

    def unit_boundary(self, start: int) -> int:
        """The end of the string units from `start`, at most a step further.

        A high surrogate escape at the end is left for the next step: json
        joins it with the low surrogate escape that may follow.
        """
        stop = min(start + JSON_STEP_CHARS - 2, len(self.text))
        cut = _JSON_STRING_UNITS.match(self.text, start, stop)
        end = cut.end() if cut is not None else start
        last = end - 6
        if last > start and _JSON_HIGH_SURROGATE.match(self.text, last, end):
            before = self.text[start:last]
            if (len(before) - len(before.rstrip("\\"))) % 2 == 0:
                return last  # not itself an escaped backslash followed by "u"
        return end


async def _parse_off_loop(body: bytes, parse: Callable[[bytes], T]) -> T:
    """Run `parse(body)`; in a worker thread when the body is large."""
    if len(body) <= INLINE_PARSE_BYTES:
        return parse(body)
    return await asyncio.to_thread(parse, body)


# --- end shared: backend_http ---


# --- shared: web_search (made from tools/shared/web_search.py) ---
WebSearch = Callable[[str, int], Awaitable[list]]


class _WebSearchOffError(Exception):
    """Open WebUI's web search cannot run: turned off, or no engine is set up."""

    def __init__(self, *, disabled: bool) -> None:
        """`disabled`: the admin turned web search off (else: not configured)."""
        super().__init__("web search is disabled" if disabled else "no engine")
        self.disabled = disabled


def _import_openwebui() -> SimpleNamespace | None:
    """Open WebUI's search pieces, or None outside Open WebUI (the test seam)."""
    try:
        from open_webui.routers import retrieval  # noqa: PLC0415
    except ImportError:
        return None
    try:
        from open_webui.models.config import Config  # noqa: PLC0415  (0.11+)
    except ImportError:
        Config = None  # noqa: N806
    try:
        from open_webui.models.users import UserModel  # noqa: PLC0415
    except ImportError:
        UserModel = None  # noqa: N806
    return SimpleNamespace(
        search_web=retrieval.search_web,
        config_store=Config,
        user_model=UserModel,
        config_keys=getattr(retrieval, "RETRIEVAL_CONFIG_KEYS", None),
    )


def _app_setting(app_config: Any, *names: str) -> Any:
    """A 0.6/0.8 `app.state.config` value (its AppConfig may raise KeyError)."""
    for name in names:
        try:
            return getattr(app_config, name)
        except (AttributeError, KeyError):
            continue
    return None


async def _openwebui_web_search(
    ow: SimpleNamespace, request: Any, user: dict | None, engine: str
) -> WebSearch:
    """A search function over Open WebUI's engine, for this version's API.

    Args:
        ow: Open WebUI's pieces (`_import_openwebui`).
        request: The request Open WebUI passed to the tool.
        user: The `__user__` dict (made Open WebUI's UserModel when it fits).
        engine: The engine to use; "" for the one the admin configured.

    Returns:
        `search(query, count)`: the engine's results (dicts or Open WebUI's
        SearchResult objects).

    Raises:
        _WebSearchOffError: Web search is turned off or has no engine.
    """
    state = getattr(getattr(request, "app", None), "state", None)
    app_config = getattr(state, "config", None)
    config: dict | None = None
    if app_config is not None:  # 0.6 / 0.8
        enabled = bool(
            _app_setting(app_config, "ENABLE_WEB_SEARCH", "ENABLE_RAG_WEB_SEARCH")
        )
        configured = _app_setting(
            app_config, "WEB_SEARCH_ENGINE", "RAG_WEB_SEARCH_ENGINE"
        )
    elif ow.config_store is not None:  # 0.11+
        # 0.12 takes the whole retrieval config as `config=`; 0.11 reads it itself.
        takes_config = bool(ow.config_keys) and (
            "config" in inspect.signature(ow.search_web).parameters
        )
        keys = {"web.search.enable", "web.search.engine"}
        if takes_config:
            keys |= set(ow.config_keys.values())
        values = ow.config_store.get_many(*sorted(keys))
        values = dict(await values if inspect.isawaitable(values) else values)
        enabled = bool(values.get("web.search.enable"))
        configured = values.get("web.search.engine")
        config = values if takes_config else None
    else:
        raise _WebSearchOffError(disabled=False)
    if not enabled:
        raise _WebSearchOffError(disabled=True)
    engine = engine or configured or ""
    if not engine:
        raise _WebSearchOffError(disabled=False)
    owui_user = _owui_user(ow, user)

    async def search(query: str, count: int) -> list:
        if config is not None:  # 0.12+: keyword-only config, the count in it
            options = {**config, "web.search.result_count": count}
            result = ow.search_web(request, engine, query, owui_user, config=options)
        elif inspect.iscoroutinefunction(ow.search_web):  # 0.11
            result = ow.search_web(request, engine, query, owui_user)
        else:  # 0.6 / 0.8: blocking, keep it off the event loop
            result = await asyncio.to_thread(
                ow.search_web, request, engine, query, owui_user
            )
        return list((await result if inspect.isawaitable(result) else result) or [])

    return search


def _owui_user(ow: SimpleNamespace, user: dict | None) -> Any:
    """Open WebUI's UserModel from the `__user__` dict (None if it does not fit)."""
    if not user or ow.user_model is None:
        return None
    try:
        return ow.user_model(**user)
    except Exception:  # engines that need no user still work
        return None


def _searxng_endpoint(url: str) -> _Endpoint | None:
    """A SearXNG search URL without query and credentials (None if invalid).

    A query written into it (the legacy '?q=<query>') is dropped: the tools
    send their own.
    """
    try:
        parts = urlsplit(url.strip())
        valid = parts.scheme in {"http", "https"} and bool(parts.hostname)
        _port = parts.port  # raises on a malformed port
    except ValueError:
        return None
    if not valid:
        return None
    host, auth = _split_credentials(parts)
    return _Endpoint(urlunsplit((parts.scheme, host, parts.path or "/", "", "")), auth)


# --- end shared: web_search ---


INVALID_REQUEST = (
    "[Search] Invalid request format: "
    "Input must be a JSON object containing 'query' field"
)
TIMEOUT_TEXT = "Google search Timeout, return None, Please try again later."
VIDEO_TEXT = "Your browser can't play this video."
DISABLED_TEXT = (
    "Web search is not enabled in Open WebUI, so the search tool cannot run. "
    "An administrator can enable and configure it in Admin Settings → Web Search. "
    "Continue with what you already know or with other tools."
)
UNCONFIGURED_TEXT = (
    "Web search is not configured in Open WebUI (no working search engine is set "
    "up), so the search tool cannot run. An administrator can configure it in "
    "Admin Settings → Web Search. Continue with what you already know or with "
    "other tools."
)
NO_BACKEND_TEXT = (
    "Web search is not available: the search tool is running outside Open WebUI "
    "and its SEARXNG_URL valve is empty. Set SEARXNG_URL to a SearXNG instance "
    "with the JSON output format enabled."
)
BAD_SEARXNG_URL_TEXT = (
    "Web search is not available: the SEARXNG_URL valve of the search tool is "
    "not a valid http(s) URL."
)
SETTINGS_FAILED_TEXT = (
    "Web search failed: Open WebUI's web search settings could not be read. "
    "Please try again later."
)
SNIPPET_CHARS = 2_000
DATE_CHARS = 64


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


@dataclass
class _Hit:
    """One search result, as the formatter needs it."""

    title: str
    link: str
    snippet: str = ""
    date: str = ""
    source: str = ""


@dataclass
class _Outcome:
    """What one query produced: the text block and the hits behind it."""

    text: str
    hits: list[_Hit] = field(default_factory=list)
    error: bool = False
    unconfigured: bool = False


Backend = Callable[[httpx.AsyncClient, str, int], Awaitable[list[_Hit]]]


class _UnconfiguredError(Exception):
    """Open WebUI has no usable web search engine."""


def _format_hit(idx: int, hit: _Hit) -> str:
    """One result in the reference layout (blank line before the snippet)."""
    text = f"{idx}. [{hit.title}]({hit.link})"
    if hit.date:
        text += f"\nDate published: {hit.date}"
    if hit.source:
        text += f"\nSource: {hit.source}"
    text += "\n"
    if hit.snippet:
        text += f"\n{hit.snippet}"
    return text.replace(VIDEO_TEXT, "")


def _format_block(query: str, hits: list[_Hit]) -> str:
    """The reference text for one query."""
    if not hits:
        return f"No results found for '{query}'. Try with a more general query."
    entries = "\n\n".join(_format_hit(i, hit) for i, hit in enumerate(hits, 1))
    header = f"A Google search for '{query}' found {len(hits)} results:\n\n"
    return header + "## Web Results\n" + entries


def _clean(value: Any) -> str:
    """A result field as text ('' for None and non-text)."""
    return value.strip() if isinstance(value, str) else ""


def _make_hit(title: Any, link: Any, snippet: Any, date: Any = "") -> _Hit | None:
    """A hit from raw fields; None without a valid link (nothing to cite or visit)."""
    url = _link(link)
    if not url:
        return None
    # A line break inside the title would break the markdown link.
    name = _cut(" ".join(_clean(title).split()), TITLE_CHARS) or url
    return _Hit(name, url, _cut(_clean(snippet), SNIPPET_CHARS), _format_date(date))


def _hits(results: list, count: int, fields: Callable[[Any], tuple]) -> list[_Hit]:
    """The first `count` valid hits; a result whose fields cannot be read is skipped."""
    return _first_made(results, count, lambda item: _make_hit(*fields(item)))


def _format_date(value: Any) -> str:
    """'May 19, 2025' like Google's result dates; unknown formats kept as text."""
    text = " ".join(_clean(value).split())  # a line break would forge a line
    if not text or len(text) > DATE_CHARS:
        return ""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return text
    return f"{moment:%b} {moment.day}, {moment.year}"


def _searxng_hits(body: bytes, count: int) -> list[_Hit]:
    """Hits from a SearXNG JSON answer, by score as Open WebUI orders them."""
    payload = _parse_json(body)
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, list):
        raise ValueError("no result list")
    hits = _hits(
        _ranked(results),
        count,
        lambda r: (
            r.get("title"),
            r.get("url"),
            r.get("content"),
            r.get("publishedDate"),
        ),
    )
    for hit in hits:
        hit.source = _site(hit.link)
    return hits


def _site(link: str) -> str:
    """The site a result comes from, for the reference's "Source:" line.

    Serper names the site of each result in its "source" field and the lab's
    tool prints it; SearXNG has no site name, so the link's host stands in
    for it (the engine name, e.g. "google", would name no site). The link
    was checked by `_link`, so the host is a plain name that cannot forge a line.
    """
    host = urlsplit(link).hostname or ""
    return host.removeprefix("www.")


async def _searxng_search(
    client: httpx.AsyncClient, endpoint: _Endpoint, query: str, count: int
) -> list[_Hit]:
    """Query SearXNG's JSON API."""
    body = await _get(client, endpoint, {"q": query, "format": "json"})
    return await _parse_off_loop(body, lambda data: _searxng_hits(data, count))


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)
_SECRET_PAIR = re.compile(
    r"(?i)\b(api[_-]?key|key|token|secret|password|passwd|auth\w*|sig\w*)"
    r"(['\"]?\s*[:=]\s*['\"]?)[^\s'\"&,;)}\]]+"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[\w.~+/=-]+")
MAX_LOGGED_MESSAGE = 300


def _without_secrets(text: str) -> str:
    """Text for the log: URLs cut to scheme, host and path, key-like values masked.

    Exception messages from engines and HTTP clients can quote request URLs
    (API keys in the query string, credentials before the host) or headers.
    """

    def bare_url(match: re.Match[str]) -> str:
        try:
            parts = urlsplit(match.group(0))
            host = parts.hostname or ""
        except ValueError:  # e.g. "http://[::1" quoted by an engine
            return "<unparsable URL>"
        port = f":{parts.port}" if _safe_port(parts) else ""
        return urlunsplit((parts.scheme, host + port, parts.path, "", ""))

    text = _URL.sub(bare_url, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} ***", text)
    text = _SECRET_PAIR.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)
    if len(text) > MAX_LOGGED_MESSAGE:
        text = text[:MAX_LOGGED_MESSAGE] + "…"
    return text


def _safe_port(parts: Any) -> bool:
    """Whether a URL has a readable port (a malformed one raises ValueError)."""
    try:
        return parts.port is not None
    except ValueError:
        return False


def _log_failure(exc: BaseException) -> None:
    """Log a failed query: the reason at WARNING, where it happened at DEBUG.

    Both without secrets: the traceback is rebuilt from its frames (file,
    line, function, source line) and the cleaned message, never from the raw
    exception text.
    """
    message = _without_secrets(str(exc))
    log.warning("search failed for a query: %s: %s", type(exc).__name__, message)
    if log.isEnabledFor(logging.DEBUG):
        frames = "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__)))
        log.debug(
            "search failure traceback (most recent call last):\n%s%s: %s",
            frames,
            type(exc).__name__,
            message,
        )


def _describe_failure(exc: BaseException) -> str:
    """A short reason without URLs or secrets."""
    return _backend_failure(exc, "the search engine")


class Tools:
    """Web search in the format Tongyi DeepResearch was trained on."""

    class Valves(BaseModel):
        """Administrator settings of the search tool."""

        MAX_QUERIES_PER_SEARCH: int = Field(
            default=5,
            description="Most queries searched per call; extra queries are not run "
            "and the model is told which ones were skipped. Values below 1 count as 1.",
        )
        RESULTS_PER_QUERY: int = Field(
            default=10,
            description="Most results shown per query (the model was trained on "
            "Google's top 10). On Open WebUI 0.12+ this is also the count asked of "
            "the engine; older versions use the admin's result count, cut to this "
            "value. Values below 1 count as 1.",
        )
        CONCURRENT_QUERIES: int = Field(
            default=5,
            description="How many queries of one call run at the same time. "
            "Use 1 for rate-limited engines. Values below 1 count as 1.",
        )
        QUERY_TIMEOUT_SECONDS: float = Field(
            default=30,
            description="Time limit for one query, in seconds; a query over the "
            "limit reports a timeout without stopping the others. Values of 0 or "
            "less mean 30.",
        )
        SEARCH_ENGINE: str = Field(
            default="",
            description="Open WebUI web search engine to use (e.g. 'searxng', "
            "'duckduckgo', 'brave'). Empty = the engine configured in Admin "
            "Settings → Web Search, with its settings.",
        )
        SEARXNG_URL: str = Field(
            default="",
            description="Search a SearXNG instance directly instead of Open WebUI's "
            "engine, e.g. http://searxng:8080/search (JSON format must be enabled "
            "in SearXNG). Needed when the tool runs outside Open WebUI. Credentials "
            "written into it (http://user:password@host/search) are sent as Basic "
            "auth to that host only and never shown or logged.",
        )

    def __init__(self) -> None:
        """Create the tool with default valves; sources are emitted by the tool."""
        self.valves = self.Valves()
        self.citation = False

    async def search(
        self,
        query: list[str],
        __request__: Any = None,
        __user__: dict | None = None,
        __event_emitter__: Emitter | None = None,
    ) -> str:
        """Perform Google web searches then returns a string of the top search results.

        Accepts multiple queries.

        :param query: The list of search queries.
        :return: The top results of every query, as text.
        """
        try:
            return await _search(self, query, __request__, __user__, __event_emitter__)
        except Exception as exc:  # the tool never raises: the model gets text
            log.warning("search failed: %s", type(exc).__name__)
            return ToolResult(
                f"Search failed: unexpected error ({type(exc).__name__}). "
                "Please try again later.",
                ok=False,
            )


# Open WebUI 0.6 offers every callable attribute of `Tools` not named `__*` as a
# tool (private `_x` methods included, which then fail its spec builder), so
# the class holds the tool method only and its helpers live here.


async def _search(
    tool: "Tools",
    query: Any,
    request: Any,
    user: dict | None,
    emitter: Emitter | None,
) -> ToolResult:
    """The search tool's work (see `Tools.search`)."""
    queries = _normalise_queries(query)
    if queries is None:
        return ToolResult(INVALID_REQUEST, ok=False)
    limit = _positive(tool.valves.MAX_QUERIES_PER_SEARCH, 5)
    queries, skipped = queries[:limit], queries[limit:]
    await _emit(emitter, description="Searching: " + " · ".join(queries), done=False)
    try:
        backend = await _backend(tool, request, user)
    except _UnconfiguredError as exc:
        message = str(exc) or UNCONFIGURED_TEXT
        await _emit(emitter, description=message, done=True)
        return ToolResult(message, ok=False)
    except Exception as exc:  # never a traceback for the model
        log.warning("reading web search settings failed: %s", type(exc).__name__)
        message = SETTINGS_FAILED_TEXT
        await _emit(emitter, description=message, done=True)
        return ToolResult(message, ok=False)
    outcomes = await _run_all(tool, queries, backend, emitter)
    if any(outcome.unconfigured for outcome in outcomes):
        await _emit(emitter, description=UNCONFIGURED_TEXT, done=True)
        return ToolResult(UNCONFIGURED_TEXT, ok=False)
    text = SEPARATOR.join(outcome.text for outcome in outcomes)
    text += _skipped_note(skipped, limit) if skipped else ""
    # Some results are a success: the failed queries say so in the text.
    return ToolResult(text, ok=not all(outcome.error for outcome in outcomes))


async def _backend(tool: "Tools", request: Any, user: dict | None) -> Backend:
    """Pick SearXNG or Open WebUI; raise _UnconfiguredError with the reason."""
    searxng_url = (tool.valves.SEARXNG_URL or "").strip()
    ow = _import_openwebui() if request is not None and not searxng_url else None
    if ow is None:
        if not searxng_url:
            raise _UnconfiguredError(NO_BACKEND_TEXT)
        endpoint = _searxng_endpoint(searxng_url)
        if endpoint is None:
            raise _UnconfiguredError(BAD_SEARXNG_URL_TEXT)
        return lambda client, q, n: _searxng_search(client, endpoint, q, n)
    engine = (tool.valves.SEARCH_ENGINE or "").strip()
    try:
        web_search = await _openwebui_web_search(ow, request, user, engine)
    except _WebSearchOffError as exc:
        raise _UnconfiguredError(
            DISABLED_TEXT if exc.disabled else UNCONFIGURED_TEXT
        ) from exc

    async def run(_client: httpx.AsyncClient, q: str, count: int) -> list[_Hit]:
        results = await web_search(q, count)
        return _hits(
            results,
            count,
            lambda r: (_field(r, "title"), _field(r, "link"), _field(r, "snippet")),
        )

    return run


async def _run_all(
    tool: "Tools",
    queries: list[str],
    backend: Backend,
    emitter: Emitter | None,
) -> list[_Outcome]:
    """Run the queries concurrently (bounded); outcomes in query order."""
    gate = asyncio.Semaphore(_positive(tool.valves.CONCURRENT_QUERIES, 5))
    count = _positive(tool.valves.RESULTS_PER_QUERY, 10)
    timeout = float(tool.valves.QUERY_TIMEOUT_SECONDS or 0)
    timeout = timeout if timeout > 0 else 30.0

    async def one(client: httpx.AsyncClient, q: str) -> _Outcome:
        async with gate:
            outcome = await _run_query(client, backend, q, count, timeout)
        await _report(emitter, q, outcome)
        return outcome

    verify = await _ssl_context()
    async with httpx.AsyncClient(
        timeout=timeout, follow_redirects=True, verify=verify
    ) as client:
        return list(await asyncio.gather(*(one(client, q) for q in queries)))


async def _run_query(
    client: httpx.AsyncClient,
    backend: Backend,
    query: str,
    count: int,
    seconds: float,
) -> _Outcome:
    """Search one query; every failure becomes this query's own text."""
    try:
        async with asyncio.timeout(seconds):
            hits = await backend(client, query, count)
    except (TimeoutError, httpx.TimeoutException):
        return _Outcome(TIMEOUT_TEXT, error=True)
    except Exception as exc:  # one query must not sink the others
        if MISSING_CONFIG.match(str(exc)):
            return _Outcome(UNCONFIGURED_TEXT, error=True, unconfigured=True)
        _log_failure(exc)
        reason = _describe_failure(exc)
        text = f"Search failed for '{query}': {reason}. Please try again later."
        return _Outcome(text, error=True)
    return _Outcome(_format_block(query, hits), hits)


async def _report(emitter: Emitter | None, query: str, outcome: _Outcome) -> None:
    """Status event for one finished query (the result list, or the error)."""
    if outcome.error:
        if not outcome.unconfigured:
            await _emit(emitter, description=outcome.text, done=True)
        return
    await _emit(
        emitter,
        action="web_search",
        description="Searched {{count}} sites",
        query=query,
        urls=[hit.link for hit in outcome.hits],
        items=[{"title": hit.title, "link": hit.link} for hit in outcome.hits],
        done=True,
    )
