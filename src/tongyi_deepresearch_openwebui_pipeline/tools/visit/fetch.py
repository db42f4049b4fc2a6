"""Fetch: a pinned, capped httpx GET; Open WebUI's loader where it is wanted.

The built-in fetcher checks every address and redirect hop, connects to the
address it checked and caps the body (the shared safe HTTP code reads it).
Open WebUI's loader does its own checks (their strength depends on the Open
WebUI version), so it is used only when the admin asks for it, or when Open
WebUI's engine does what the built-in fetcher cannot (a browser, a scraping
service). The tool's own address check runs before either, and what the
loader returns is classified like a body. Pages read are kept per chat.
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import asyncio
import dataclasses
import inspect
import logging
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

from ..shared.safe_http import (
    _SSL_CONTEXTS,
    ACCEPT_ENCODING,
    _read_capped,
    _ssl_context,
    _TlsContexts,
    _UnreadableBodyError,
)
from .convert import (
    _classify,
    _MangledFileError,
    _Page,
    _PageError,
    _RawPage,
    _resolved,
)
from .converter_worker import _CONVERTER, _convert_page, _ConverterState
from .safety import Resolver, _check_url, _RefusedError, _resolve, _Target

if TYPE_CHECKING:
    from ..visit_tool import Tools

log = logging.getLogger(__name__)

# --- snippet ---

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
