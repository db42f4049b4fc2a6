"""
id: deepresearch_scholar
title: DeepResearch Scholar
author: tongyi-deepresearch-openwebui-pipeline contributors
author_url: https://github.com/tongyi-deepresearch-openwebui/tongyi-deepresearch-openwebui-pipeline
version: 0.2.0
license: MIT
description: Scholarly search for Tongyi DeepResearch (OpenAlex, Semantic Scholar or arXiv; no API key), answered in the Google Scholar text format the model was trained on.
requirements:
required_open_webui_version: 0.6.0
"""  # noqa: D205, D212, D415, E501  (Open WebUI frontmatter)

# The `google_scholar` tool of Tongyi DeepResearch as an Open WebUI Tools module.
#
# Papers come from a free scholarly API (OpenAlex by default, Semantic Scholar
# or arXiv) and are printed in the reference agent's Google Scholar format,
# byte for byte. When the scholarly API fails or times out, the query is run
# through the web search engine (Open WebUI's, or SearXNG) as
# "academic research: <query>" and a short note tells the model so. Web
# results are shown with the page URL as publicationInfo (the format has no
# other place for a link) and as pdfUrl when the page is a PDF.
#
# Like the lab's tool, a paper whose API gives a citation count shows a
# citedBy line, "citedBy: 0" included; a record without a count (arXiv, web
# results) shows none, as Serper's records without the field do.
#
# Self-contained on purpose (stdlib, pydantic, httpx): the web search part
# repeats a small piece of the search tool so each file loads on its own.

import asyncio
import inspect
import itertools
import json
import logging
import math
import re
import ssl
import threading
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, NoReturn, TypeVar
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit
from xml.parsers import expat

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
    "[google_scholar] Invalid request format: "
    "Input must be a JSON object containing 'query' field"
)
TIMEOUT_TEXT = "Google Scholar Timeout, return None, Please try again later."
WEB_PREFIX = "academic research: "
BACKENDS = {
    "openalex": "OpenAlex",
    "semantic_scholar": "Semantic Scholar",
    "arxiv": "arXiv",
    "web": "web search",
}
FALLBACK_NOTE = (
    "\n\nNote: the scholarly database ({name}) did not answer, so these are "
    "general web search results instead of scholarly records."
)
WEB_DISABLED_TEXT = (
    "Web search is not enabled in Open WebUI, so the google_scholar tool cannot "
    "use it. An administrator can enable it in Admin Settings → Web Search."
)
WEB_UNCONFIGURED_TEXT = (
    "Web search is not configured in Open WebUI (no working search engine is set "
    "up), so the google_scholar tool cannot use it. An administrator can configure "
    "it in Admin Settings → Web Search."
)
NO_WEB_TEXT = (
    "Web search is not available to the google_scholar tool: it is running "
    "outside Open WebUI and its SEARXNG_URL valve is empty."
)
BAD_SEARXNG_URL_TEXT = "The SEARXNG_URL valve is not a valid http(s) URL."
SNIPPET_CHARS = 300
WEB_SNIPPET_CHARS = 2_000
NAME_CHARS = 200
ATOM = {"a": "http://www.w3.org/2005/Atom", "arxiv": "http://arxiv.org/schemas/atom"}
# A backend asked for `count` (at most 100) records sends that many: of a
# longer answer, only the first this many records are looked at.
MAX_RECORDS_READ = 1_000
# Backend text is read up to this many characters (a title or an abstract is
# a few thousand): collapsing the spaces of megabytes holds the interpreter
# lock in one go (~150 ms for 5 MB).
MAX_TEXT_CHARS = 100_000
# An arXiv feed is parsed this many bytes at a time (see `_parse_feed`).
FEED_STEP_BYTES = 65_536


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
class _Paper:
    """One scholarly record, as the formatter and the exports need it."""

    title: str
    pdf: str = ""
    page: str = ""
    info: str = ""
    year: str = ""
    cited_by: int | None = None
    snippet: str = ""
    authors: tuple[str, ...] = ()
    venue: str = ""
    doi: str = ""

    def record(self) -> dict:
        """What the research pipe keeps of it (`ToolResult.papers`)."""
        return {
            "title": self.title,
            "url": self.page or self.pdf,
            "pdf": self.pdf,
            "authors": list(self.authors),
            "year": self.year,
            "venue": self.venue,
            "doi": self.doi,
        }


@dataclass
class _Outcome:
    """The text block of one query and the papers behind it."""

    text: str
    papers: list[_Paper] = field(default_factory=list)
    error: bool = False


class _BadURLError(ValueError):
    """An API URL valve is not an http(s) URL."""


def _format_paper(idx: int, paper: _Paper) -> str:
    """One record in the reference layout."""
    link_info = f"pdfUrl: {paper.pdf}" if paper.pdf else "no available link"
    text = f"{idx}. [{paper.title}]({link_info})"
    if paper.info:
        text += f"\npublicationInfo: {paper.info}"
    if paper.year:
        text += f"\nDate published: {paper.year}"
    if paper.cited_by is not None:
        text += f"\ncitedBy: {paper.cited_by}"
    text += "\n"
    if paper.snippet:
        text += f"\n{paper.snippet}"
    return text


def _format_block(query: str, papers: list[_Paper]) -> str:
    """The reference text for one query (the model's query, never a prefix)."""
    if not papers:
        return f"No results found for '{query}'. Try with a more general query."
    entries = "\n\n".join(_format_paper(i, p) for i, p in enumerate(papers, 1))
    header = f"A Google scholar for '{query}' found {len(papers)} results:\n\n"
    return header + "## Scholar Results\n" + entries


def _text(value: Any) -> str:
    """Whitespace-collapsed text of the first MAX_TEXT_CHARS ('' for non-text)."""
    return " ".join(value[:MAX_TEXT_CHARS].split()) if isinstance(value, str) else ""


def _shorten(text: Any, limit: int = SNIPPET_CHARS) -> str:
    """Cut at a word boundary, like a search snippet."""
    return _cut(_text(text), limit)


def _dig(data: Any, *keys: str) -> Any:
    """Nested dict lookup that tolerates missing levels."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _list(value: Any) -> list:
    """A list from a backend field ([] for anything else)."""
    return value if isinstance(value, list) else []


def _first_link(*candidates: Any) -> str:
    """The first candidate that is a valid link ('' if none is)."""
    return next((url for url in map(_link, candidates) if url), "")


def _year(value: Any) -> str:
    """A four-digit year from an int or a date-like string ('' otherwise)."""
    if isinstance(value, bool):
        return ""
    if isinstance(value, int):
        return str(value) if 1000 <= value <= 9999 else ""
    found = re.match(r"[0-9]{4}", value.strip()) if isinstance(value, str) else None
    return found.group(0) if found else ""


def _count(value: Any) -> int | None:
    """A citation count; None (no line) for anything but a sensible integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value < 10**15 else None


def _publication_info(authors: list[str], venue: str, year: str) -> str:
    """'A One, B Two, C Three… - Venue, 2017', like Google Scholar's line."""
    names = [a for a in authors if a]
    who = ", ".join(_shorten(a, NAME_CHARS) for a in names[:3])
    who += "…" if len(names) > 3 else ""
    where = ", ".join(part for part in (venue, year) if part)
    return " - ".join(part for part in (who, where) if part)


def _paper(
    title: Any,
    *,
    pdf: Any = "",
    page: Any = "",
    authors: list[Any] | None = None,
    venue: Any = "",
    year: Any = None,
    cited: Any = None,
    abstract: Any = "",
    doi: Any = "",
) -> _Paper:
    """A record from raw API values (any of them may be missing or malformed)."""
    year_text = _year(year)
    names = [_text(a) for a in authors or []]
    venue_text = _shorten(venue, NAME_CHARS)
    return _Paper(
        title=_shorten(title, TITLE_CHARS),
        pdf=_link(pdf),
        page=_link(page),
        info=_publication_info(names, venue_text, year_text),
        year=year_text,
        cited_by=_count(cited),
        snippet=_shorten(abstract),
        authors=tuple(_shorten(a, NAME_CHARS) for a in names[:MAX_AUTHORS] if a),
        venue=venue_text,
        doi=_doi(doi),
    )


#: Most authors a record keeps for its export (Google Scholar's line shows 3).
MAX_AUTHORS = 50
#: A DOI: "10." then a registrant code, "/", and a suffix without blanks.
_DOI = re.compile(r"10\.\d{4,9}/\S{1,200}")


def _doi(value: Any) -> str:
    """A bare DOI from a DOI or its https://doi.org/ link ('' otherwise)."""
    found = _DOI.search(_text(value)) if isinstance(value, str) else None
    return found.group(0) if found else ""


def _abstract(index: Any) -> str:
    """Rebuild an OpenAlex abstract from its inverted index (word → positions)."""
    if not isinstance(index, dict):
        return ""
    words: dict[int, str] = {}
    for word, places in index.items():
        for place in _list(places) if isinstance(word, str) else []:
            if isinstance(place, int) and 0 <= place < 5000:
                words[place] = word
    return " ".join(words[i] for i in sorted(words))


def _endpoint(url: str) -> _Endpoint | None:
    """An admin-set http(s) URL without query and credentials (None if invalid)."""
    try:
        parts = urlsplit((url or "").strip())
        valid = parts.scheme in {"http", "https"} and bool(parts.hostname)
        _port = parts.port  # raises on a malformed port
    except ValueError:
        return None
    if not valid:
        return None
    host, auth = _split_credentials(parts)
    return _Endpoint(
        urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", "")), auth
    )


def _base_url(url: str, suffix: str = "") -> _Endpoint:
    """An API URL valve plus `suffix`; _BadURLError when it is not http(s)."""
    endpoint = _endpoint(url)
    if endpoint is None:
        raise _BadURLError
    return _Endpoint(endpoint.url + suffix, endpoint.auth)


class _UnsafeXMLError(ValueError):
    """The feed has a document type declaration (where entities are defined)."""


def _qualified(name: str) -> str:
    """Expat's 'uri}local' name in ElementTree's '{uri}local' form."""
    return "{" + name if "}" in name else name


def _parse_feed(
    body: bytes, make_parser: Callable[..., Any] = expat.ParserCreate
) -> ET.Element:
    """Parse an arXiv Atom feed; any document type declaration is refused.

    Entities (billion laughs, external files, parameter entities) can only be
    declared in a DTD, which an Atom feed never has. Expat decodes the bytes
    itself, in whatever encoding the document declares (UTF-16, Latin-1, …),
    and reports the declaration as a token, so no spelling or encoding can
    hide it; the parse stops there, before any entity is declared. Stdlib
    only: defusedxml is not in every Open WebUI environment.

    The feed is given to expat FEED_STEP_BYTES at a time: a text of megabytes
    in one call would hold the interpreter lock all along (its text goes to
    the tree builder without a line of Python in between).

    Args:
        body: The feed's bytes.
        make_parser: expat.ParserCreate (a seam for tests).

    Returns:
        The feed's root element.

    Raises:
        ValueError: The feed is malformed or declares a document type.
    """
    builder = ET.TreeBuilder()
    parser = make_parser(namespace_separator="}")

    def refuse(*_args: Any) -> NoReturn:
        raise _UnsafeXMLError("XML with a document type declaration refused")

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.ExternalEntityRefHandler = refuse
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartElementHandler = lambda name, attrs: builder.start(
        _qualified(name), {_qualified(k): v for k, v in attrs.items()}
    )
    parser.EndElementHandler = lambda name: builder.end(_qualified(name))
    parser.CharacterDataHandler = builder.data
    try:
        for start in range(0, len(body), FEED_STEP_BYTES):
            parser.Parse(body[start : start + FEED_STEP_BYTES], False)
        parser.Parse(b"", True)
        return builder.close()
    except expat.ExpatError as exc:
        raise ValueError(f"malformed XML: {exc}") from None
    except AssertionError:  # TreeBuilder: an empty document
        raise ValueError("malformed XML") from None


def _titled(papers: Iterable[_Paper], count: int) -> list[_Paper]:
    """The first `count` records that have a title, of the first MAX_RECORDS_READ.

    `papers` is read lazily: no record after the last one needed is made.
    """
    read = itertools.islice(papers, MAX_RECORDS_READ)
    return list(itertools.islice((paper for paper in read if paper.title), count))


def _openalex_papers(data: Any, count: int) -> list[_Paper]:
    """Records from an OpenAlex /works answer (any JSON value)."""
    papers = (
        _paper(
            _text(_dig(work, "display_name")) or _dig(work, "title"),
            pdf=_first_link(
                _dig(work, "best_oa_location", "pdf_url"),
                _dig(work, "primary_location", "pdf_url"),
            ),
            page=_first_link(
                _dig(work, "primary_location", "landing_page_url"),
                _dig(work, "doi"),
                _dig(work, "id"),
            ),
            authors=[
                _dig(a, "author", "display_name")
                for a in _list(_dig(work, "authorships"))
            ],
            venue=_dig(work, "primary_location", "source", "display_name"),
            year=_dig(work, "publication_year"),
            cited=_dig(work, "cited_by_count"),
            abstract=_abstract(_dig(work, "abstract_inverted_index")),
            doi=_dig(work, "doi"),
        )
        for work in _list(_dig(data, "results"))
    )
    return _titled(papers, count)


def _s2_papers(data: Any, count: int) -> list[_Paper]:
    """Records from a Semantic Scholar paper search answer (any JSON value)."""
    papers = (_s2_paper(paper) for paper in _list(_dig(data, "data")))
    return _titled(papers, count)


def _s2_paper(paper: Any) -> _Paper:
    """One Semantic Scholar record (any JSON value)."""
    arxiv_id = _text(_dig(paper, "externalIds", "ArXiv"))
    return _paper(
        _dig(paper, "title"),
        pdf=_first_link(
            _dig(paper, "openAccessPdf", "url"),
            f"https://arxiv.org/pdf/{arxiv_id}" if arxiv_id else "",
        ),
        page=_dig(paper, "url"),
        authors=[_dig(a, "name") for a in _list(_dig(paper, "authors"))],
        venue=_text(_dig(paper, "venue")) or _dig(paper, "journal", "name"),
        year=_dig(paper, "year"),
        cited=_dig(paper, "citationCount"),
        abstract=_dig(paper, "abstract"),
        doi=_dig(paper, "externalIds", "DOI"),
    )


async def _openalex(
    client: httpx.AsyncClient, valves: Any, query: str, count: int
) -> list[_Paper]:
    """Search OpenAlex works."""
    params = {"search": query, "per-page": count}
    if valves.OPENALEX_MAILTO.strip():  # OpenAlex's "polite pool"
        params["mailto"] = valves.OPENALEX_MAILTO.strip()
    body = await _get(client, _base_url(valves.OPENALEX_URL, "/works"), params)
    return await _parse_off_loop(
        body, lambda data: _openalex_papers(_parse_json(data), count)
    )


async def _semantic_scholar(
    client: httpx.AsyncClient, valves: Any, query: str, count: int
) -> list[_Paper]:
    """Search Semantic Scholar's Graph API."""
    api = _base_url(valves.SEMANTIC_SCHOLAR_URL, "/graph/v1/paper/search")
    fields = "title,year,authors,venue,journal,citationCount,openAccessPdf,"
    fields += "abstract,url,externalIds"
    body = await _get(client, api, {"query": query, "limit": count, "fields": fields})
    return await _parse_off_loop(
        body, lambda data: _s2_papers(_parse_json(data), count)
    )


async def _arxiv(
    client: httpx.AsyncClient, valves: Any, query: str, count: int
) -> list[_Paper]:
    """Search the arXiv API (Atom feed); every word of the query must match."""
    words = re.findall(r"\w+", query)
    if not words:
        return []
    params = {
        "search_query": " AND ".join(f"all:{w}" for w in words),
        "start": 0,
        "max_results": count,
    }
    body = await _get(client, _base_url(valves.ARXIV_URL), params)
    return await _parse_off_loop(
        body, lambda data: _arxiv_papers(_parse_feed(data), count)
    )


def _arxiv_papers(root: ET.Element, count: int) -> list[_Paper]:
    """Records from a parsed arXiv Atom feed."""
    papers = (_arxiv_paper(entry) for entry in root.iterfind("a:entry", ATOM))
    return _titled(papers, count)


def _arxiv_paper(entry: ET.Element) -> _Paper:
    """One record of an arXiv Atom feed."""
    page = _text(entry.findtext("a:id", "", ATOM))
    pdf = next(
        (
            link.get("href", "")
            for link in entry.findall("a:link", ATOM)
            if link.get("title") == "pdf"
        ),
        "",
    )
    venue = _text(entry.findtext("arxiv:journal_ref", "", ATOM))
    if not venue and "/abs/" in page:  # Google Scholar's "arXiv preprint" line
        venue = "arXiv preprint arXiv:" + re.sub(r"v\d+$", "", page.split("/abs/")[1])
    return _paper(
        entry.findtext("a:title", "", ATOM),
        pdf=pdf,
        page=page,
        authors=[
            a.findtext("a:name", "", ATOM) for a in entry.findall("a:author", ATOM)
        ],
        venue=venue,
        year=entry.findtext("a:published", "", ATOM),
        abstract=entry.findtext("a:summary", "", ATOM),
        doi=entry.findtext("arxiv:doi", "", ATOM),
    )


SCHOLARLY = {
    "openalex": _openalex,
    "semantic_scholar": _semantic_scholar,
    "arxiv": _arxiv,
}


def _searxng_items(data: Any) -> list[dict]:
    """SearXNG results by score (as Open WebUI orders them), as web results."""
    return [
        {"link": r.get("url"), "title": r.get("title"), "snippet": r.get("content")}
        for r in _ranked(_list(_dig(data, "results")))
    ]


def _searxng_web(
    client: httpx.AsyncClient, endpoint: _Endpoint
) -> Callable[[str, int], Awaitable[list]]:
    """A search function over SearXNG's JSON API."""

    async def run(query: str, count: int) -> list:
        body = await _get(client, endpoint, {"q": query, "format": "json"})
        return await _parse_off_loop(
            body, lambda data: _web_papers(_searxng_items(_parse_json(data)), count)
        )

    return run


def _web_paper(item: Any) -> _Paper | None:
    """A web result as a scholar record: the page URL goes in publicationInfo."""
    if isinstance(item, _Paper):  # already converted (SearXNG, off the loop)
        return item
    link = _link(_field(item, "link"))
    if not link:
        return None
    is_pdf = urlsplit(link).path.lower().endswith(".pdf")
    return _Paper(
        title=_shorten(_field(item, "title"), TITLE_CHARS) or link,
        pdf=link if is_pdf else "",
        page=link,
        info=link,
        snippet=_shorten(_field(item, "snippet"), WEB_SNIPPET_CHARS),
    )


def _web_papers(items: list, count: int) -> list[_Paper]:
    """The first `count` web results with a valid link; unreadable ones skipped."""
    return _first_made(items, count, _web_paper)


def _describe_failure(exc: BaseException) -> str:
    """A short reason without URLs or secrets."""
    if isinstance(exc, _BadURLError):
        return "the tool's API URL setting is not a valid http(s) URL"
    return _backend_failure(exc, "the service", (ET.ParseError, expat.ExpatError))


Search = Callable[[str, int], Awaitable[list]]


class Tools:
    """Scholarly search in the format Tongyi DeepResearch was trained on."""

    class Valves(BaseModel):
        """Administrator settings of the google_scholar tool."""

        BACKEND: str = Field(
            default="openalex",
            description="Where papers come from: 'openalex' (default, no key), "
            "'semantic_scholar' (no key, rate-limited), 'arxiv' (preprints only) or "
            "'web' (Open WebUI's web search as 'academic research: <query>'). "
            "When a scholarly backend fails, web search is used with a note.",
            json_schema_extra={
                "input": {"type": "select", "options": list(BACKENDS)},
            },
        )
        OPENALEX_URL: str = Field(
            default="https://api.openalex.org",
            description="Base URL of the OpenAlex API.",
        )
        OPENALEX_MAILTO: str = Field(
            default="",
            description="Contact e-mail sent to OpenAlex (its faster 'polite pool'). "
            "Optional.",
        )
        SEMANTIC_SCHOLAR_URL: str = Field(
            default="https://api.semanticscholar.org",
            description="Base URL of the Semantic Scholar API.",
        )
        ARXIV_URL: str = Field(
            default="https://export.arxiv.org/api/query",
            description="Query URL of the arXiv API.",
        )
        MAX_QUERIES_PER_SEARCH: int = Field(
            default=5,
            description="Most queries searched per call; extra queries are not run "
            "and the model is told which ones were skipped. Values below 1 count as 1.",
        )
        RESULTS_PER_QUERY: int = Field(
            default=10,
            description="Most papers shown per query (1 to 100).",
        )
        CONCURRENT_QUERIES: int = Field(
            default=3,
            description="How many queries of one call run at the same time "
            "(the reference agent uses 3). Values below 1 count as 1.",
        )
        QUERY_TIMEOUT_SECONDS: float = Field(
            default=30,
            description="Time limit for one query against the scholarly backend, in "
            "seconds (the web fallback gets the same time again). Values of 0 or "
            "less mean 30.",
        )
        SEARCH_ENGINE: str = Field(
            default="",
            description="Open WebUI web search engine for the 'web' backend and the "
            "fallback. Empty = the engine configured in Admin Settings → Web Search.",
        )
        SEARXNG_URL: str = Field(
            default="",
            description="Use this SearXNG instance (e.g. http://searxng:8080/search, "
            "JSON format enabled) for the 'web' backend and the fallback instead of "
            "Open WebUI's engine. Needed for web results outside Open WebUI. "
            "Credentials written into it (http://user:password@host/search) are "
            "sent as Basic auth to that host only and never shown or logged.",
        )

    def __init__(self) -> None:
        """Create the tool with default valves; sources are emitted by the tool."""
        self.valves = self.Valves()
        self.citation = False

    async def google_scholar(
        self,
        query: list[str],
        __request__: Any = None,
        __user__: dict | None = None,
        __event_emitter__: Emitter | None = None,
    ) -> str:
        """Leverage Google Scholar to retrieve relevant information from academic publications.

        Accepts multiple queries.

        :param query: The list of search queries for Google Scholar.
        :return: The top papers of every query, as text.
        """  # noqa: E501
        try:
            return await _google_scholar(
                self, query, __request__, __user__, __event_emitter__
            )
        except Exception as exc:  # the tool never raises: the model gets text
            log.warning("google_scholar failed: %s", type(exc).__name__)
            return ToolResult(
                f"Scholar search failed: unexpected error ({type(exc).__name__}). "
                "Please try again later.",
                ok=False,
            )


# Open WebUI 0.6 offers every callable attribute of `Tools` not named `__*` as a
# tool (private `_x` methods included, which then fail its spec builder), so
# the class holds the tool method only and its helpers live here.


async def _google_scholar(
    tool: "Tools",
    query: Any,
    request: Any,
    user: dict | None,
    emitter: Emitter | None,
) -> ToolResult:
    """The google_scholar tool's work (see `Tools.google_scholar`)."""
    queries = _normalise_queries(query)
    if queries is None:
        return ToolResult(INVALID_REQUEST, ok=False)
    backend = (tool.valves.BACKEND or "").strip().lower()
    if backend not in BACKENDS:
        return ToolResult(
            f"The google_scholar tool is misconfigured: its BACKEND valve must be "
            f"one of {', '.join(BACKENDS)}. Ask an administrator to fix it.",
            ok=False,
        )
    limit = _positive(tool.valves.MAX_QUERIES_PER_SEARCH, 5, ceiling=1_000)
    queries, skipped = queries[:limit], queries[limit:]
    await _emit(
        emitter, description="Searching papers: " + " · ".join(queries), done=False
    )
    verify = await _ssl_context()
    async with httpx.AsyncClient(
        timeout=_seconds(tool), follow_redirects=True, verify=verify
    ) as client:
        web = await _web(tool, client, request, user)
        if backend == "web" and isinstance(web, str):
            await _emit(emitter, description=web, done=True)
            return ToolResult(web, ok=False)
        gate = asyncio.Semaphore(_positive(tool.valves.CONCURRENT_QUERIES, 3, 1_000))

        async def one(q: str) -> _Outcome:
            async with gate:
                try:
                    outcome = await _run_query(tool, client, backend, web, q)
                except Exception as exc:  # one query must not sink the others
                    log.warning("scholar query failed: %s", type(exc).__name__)
                    outcome = _failure_outcome(q, exc)
            await _report(emitter, q, outcome)
            return outcome

        outcomes = await asyncio.gather(*(one(q) for q in queries))
    text = SEPARATOR.join(outcome.text for outcome in outcomes)
    text += _skipped_note(skipped, limit) if skipped else ""
    # Some results are a success: the failed queries say so in the text.
    papers = tuple(paper.record() for outcome in outcomes for paper in outcome.papers)
    return ToolResult(
        text, ok=not all(outcome.error for outcome in outcomes), papers=papers
    )


async def _web(
    tool: "Tools", client: httpx.AsyncClient, request: Any, user: dict | None
) -> Search | str:
    """The web search function, or the reason there is none."""
    searxng_url = (tool.valves.SEARXNG_URL or "").strip()
    try:
        ow = _import_openwebui() if request is not None and not searxng_url else None
        if ow is not None:
            engine = (tool.valves.SEARCH_ENGINE or "").strip()
            return await _openwebui_web_search(ow, request, user, engine)
    except _WebSearchOffError as exc:
        return WEB_DISABLED_TEXT if exc.disabled else WEB_UNCONFIGURED_TEXT
    except Exception as exc:  # settings unreadable: no web search this call
        log.warning("reading web search settings failed: %s", type(exc).__name__)
        return WEB_UNCONFIGURED_TEXT
    if not searxng_url:
        return NO_WEB_TEXT
    endpoint = _searxng_endpoint(searxng_url)
    if endpoint is None:
        return BAD_SEARXNG_URL_TEXT
    return _searxng_web(client, endpoint)


def _seconds(tool: "Tools") -> float:
    """The per-query time limit (bad values mean 30 s)."""
    try:
        seconds = float(tool.valves.QUERY_TIMEOUT_SECONDS)
    except (TypeError, ValueError):
        seconds = 0.0
    return seconds if seconds > 0 else 30.0


async def _run_query(
    tool: "Tools",
    client: httpx.AsyncClient,
    backend: str,
    web: Search | str,
    query: str,
) -> _Outcome:
    """One query: the scholarly backend, else web search with a note."""
    count = _positive(tool.valves.RESULTS_PER_QUERY, 10, ceiling=100)
    failure: BaseException | None = None
    if backend != "web":
        try:
            async with asyncio.timeout(_seconds(tool)):
                papers = await SCHOLARLY[backend](client, tool.valves, query, count)
            return _Outcome(_format_block(query, papers), papers)
        except Exception as exc:  # one query must not sink the others
            log.warning("%s failed for a query: %s", backend, type(exc).__name__)
            failure = exc
    if isinstance(web, str):
        return _failure_outcome(query, failure)
    try:
        async with asyncio.timeout(_seconds(tool)):
            found = await web(WEB_PREFIX + query, count)
        papers = _web_papers(found, count)
    except Exception as exc:  # web fallback failed too
        log.warning("web search failed for a query: %s", type(exc).__name__)
        if failure is None and MISSING_CONFIG.match(str(exc)):
            return _Outcome(WEB_UNCONFIGURED_TEXT, error=True)
        return _failure_outcome(query, failure or exc)
    text = _format_block(query, papers)
    if failure is not None:
        text += FALLBACK_NOTE.format(name=BACKENDS[backend])
    return _Outcome(text, papers)


def _failure_outcome(query: str, exc: BaseException | None) -> _Outcome:
    """The text for a query nothing could answer."""
    if exc is None or isinstance(exc, TimeoutError | httpx.TimeoutException):
        return _Outcome(TIMEOUT_TEXT, error=True)
    reason = _describe_failure(exc)
    text = f"Scholar search failed for '{query}': {reason}. Please try again later."
    return _Outcome(text, error=True)


async def _report(emitter: Emitter | None, query: str, outcome: _Outcome) -> None:
    """Status event for one finished query (the paper list, or the error)."""
    if outcome.error:
        await _emit(emitter, description=outcome.text, done=True)
        return
    links = [paper.pdf or paper.page for paper in outcome.papers]
    await _emit(
        emitter,
        action="web_search",
        description="Found {{count}} papers",
        query=query,
        urls=[link for link in links if link],
        items=[
            {"title": paper.title, "link": link}
            for paper, link in zip(outcome.papers, links, strict=True)
            if link
        ],
        done=True,
    )
