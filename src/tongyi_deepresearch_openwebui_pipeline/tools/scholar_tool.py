"""
id: deepresearch_scholar
title: DeepResearch Scholar
author: tongyi-deepresearch-openwebui-pipeline contributors
author_url: https://github.com/tongyi-deepresearch-openwebui/tongyi-deepresearch-openwebui-pipeline
version: 0.1.0
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
# Like Google Scholar, an uncited paper shows no citedBy line.
#
# Self-contained on purpose (stdlib, pydantic, httpx): the web search part
# repeats a small piece of the search tool so each file loads on its own.

import asyncio
import inspect
import json
import logging
import re
import ssl
import threading
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import BaseModel, Field

try:  # Open WebUI ships defusedxml; outside it the guard in _parse_xml applies.
    from defusedxml.ElementTree import fromstring as _defused_fromstring
except ImportError:  # pragma: no cover - depends on the environment
    _defused_fromstring = None

log = logging.getLogger(__name__)


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


Emitter = Callable[[dict], Awaitable[Any]]

SEPARATOR = "\n=======\n"
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
MAX_RESPONSE_BYTES = 5_000_000
SNIPPET_CHARS = 300
MISSING_CONFIG = re.compile(r"^No .*found", re.IGNORECASE)
ATOM = {"a": "http://www.w3.org/2005/Atom", "arxiv": "http://arxiv.org/schemas/atom"}


@dataclass
class _Paper:
    """One scholarly record, as the formatter needs it."""

    title: str
    pdf: str = ""
    page: str = ""
    info: str = ""
    year: str = ""
    cited_by: int = 0
    snippet: str = ""


@dataclass
class _Outcome:
    """The text block of one query and the papers behind it."""

    text: str
    papers: list[_Paper] = field(default_factory=list)
    error: bool = False


class _BadURLError(ValueError):
    """An API URL valve is not an http(s) URL."""


class _WebUnavailableError(Exception):
    """No web search engine can be used (the message says why)."""


def _format_paper(idx: int, paper: _Paper) -> str:
    """One record in the reference layout."""
    link_info = f"pdfUrl: {paper.pdf}" if paper.pdf else "no available link"
    text = f"{idx}. [{paper.title}]({link_info})"
    if paper.info:
        text += f"\npublicationInfo: {paper.info}"
    if paper.year:
        text += f"\nDate published: {paper.year}"
    if paper.cited_by:
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


def _normalise_queries(query: Any) -> list[str] | None:
    """Distinct, stripped queries in input order; None when the input is invalid."""
    if isinstance(query, str):
        query = [query]
    if not isinstance(query, list) or not all(isinstance(q, str) for q in query):
        return None
    return list(dict.fromkeys(q.strip() for q in query if q.strip())) or None


def _text(value: Any) -> str:
    """Whitespace-collapsed text ('' for None and non-text)."""
    return " ".join(value.split()) if isinstance(value, str) else ""


def _shorten(text: Any, limit: int = SNIPPET_CHARS) -> str:
    """Cut at a word boundary, like a search snippet."""
    text = _text(text)
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " …"


def _dig(data: Any, *keys: str) -> Any:
    """Nested dict lookup that tolerates missing levels."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _publication_info(authors: list[str], venue: str, year: str) -> str:
    """'A One, B Two, C Three… - Venue, 2017', like Google Scholar's line."""
    names = [a for a in authors if a]
    who = ", ".join(names[:3]) + ("…" if len(names) > 3 else "")
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
    cited: Any = 0,
    abstract: Any = "",
) -> _Paper:
    """A record from raw API values (any of them may be missing or malformed)."""
    found = re.match(r"\d{4}", str(year or ""))
    year_text = found.group(0) if found else ""
    names = [_text(a) for a in authors or []]
    return _Paper(
        title=_text(title),
        pdf=_text(pdf),
        page=_text(page),
        info=_publication_info(names, _text(venue), year_text),
        year=year_text,
        cited_by=cited if isinstance(cited, int) and cited > 0 else 0,
        snippet=_shorten(abstract),
    )


def _abstract(index: Any) -> str:
    """Rebuild an OpenAlex abstract from its inverted index (word → positions)."""
    if not isinstance(index, dict):
        return ""
    words: dict[int, str] = {}
    for word, places in index.items():
        for place in places if isinstance(places, list) else []:
            if isinstance(place, int) and 0 <= place < 5000:
                words[place] = word
    return " ".join(words[i] for i in sorted(words))


def _base_url(url: str) -> str:
    """An admin-set API URL, checked to be http(s)."""
    parts = urlsplit((url or "").strip())
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise _BadURLError
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


async def _get(client: httpx.AsyncClient, url: str, params: dict) -> bytes:
    """GET a body, refusing oversized answers."""
    async with client.stream("GET", url, params=params) as response:
        response.raise_for_status()
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_RESPONSE_BYTES:
                raise ValueError("response too large")
    return bytes(body)


def _parse_xml(body: bytes) -> ET.Element:
    """Parse the arXiv feed without entity expansion.

    defusedxml is used when installed (Open WebUI has it). Otherwise entities can
    only be defined in a document type declaration, which an Atom feed never
    has, so any document with one is refused before the stdlib parser sees it.
    """
    if _defused_fromstring is not None:
        return _defused_fromstring(body)
    if b"<!DOCTYPE" in body.upper() or b"<!ENTITY" in body.upper():
        raise ValueError("XML with a document type declaration refused")
    return ET.fromstring(body)  # noqa: S314  (no DTD, so no entities: see above)


async def _openalex(
    client: httpx.AsyncClient, valves: Any, query: str, count: int
) -> list[_Paper]:
    """Search OpenAlex works."""
    params = {"search": query, "per-page": count}
    if valves.OPENALEX_MAILTO.strip():  # OpenAlex's "polite pool"
        params["mailto"] = valves.OPENALEX_MAILTO.strip()
    data = json.loads(
        await _get(client, _base_url(valves.OPENALEX_URL) + "/works", params)
    )
    papers = [
        _paper(
            _dig(work, "display_name") or _dig(work, "title"),
            pdf=_dig(work, "best_oa_location", "pdf_url")
            or _dig(work, "primary_location", "pdf_url"),
            page=_dig(work, "primary_location", "landing_page_url")
            or _dig(work, "doi")
            or _dig(work, "id"),
            authors=[
                _dig(a, "author", "display_name")
                for a in _dig(work, "authorships") or []
            ],
            venue=_dig(work, "primary_location", "source", "display_name"),
            year=_dig(work, "publication_year"),
            cited=_dig(work, "cited_by_count"),
            abstract=_abstract(_dig(work, "abstract_inverted_index")),
        )
        for work in _dig(data, "results") or []
    ]
    return [p for p in papers if p.title][:count]


async def _semantic_scholar(
    client: httpx.AsyncClient, valves: Any, query: str, count: int
) -> list[_Paper]:
    """Search Semantic Scholar's Graph API."""
    url = _base_url(valves.SEMANTIC_SCHOLAR_URL) + "/graph/v1/paper/search"
    fields = "title,year,authors,venue,journal,citationCount,openAccessPdf,"
    fields += "abstract,url,externalIds"
    data = json.loads(
        await _get(client, url, {"query": query, "limit": count, "fields": fields})
    )
    papers = []
    for paper in _dig(data, "data") or []:
        arxiv_id = _text(_dig(paper, "externalIds", "ArXiv"))
        papers.append(
            _paper(
                _dig(paper, "title"),
                pdf=_dig(paper, "openAccessPdf", "url")
                or (f"https://arxiv.org/pdf/{arxiv_id}" if arxiv_id else ""),
                page=_dig(paper, "url"),
                authors=[_dig(a, "name") for a in _dig(paper, "authors") or []],
                venue=_text(_dig(paper, "venue")) or _dig(paper, "journal", "name"),
                year=_dig(paper, "year"),
                cited=_dig(paper, "citationCount"),
                abstract=_dig(paper, "abstract"),
            )
        )
    return [p for p in papers if p.title][:count]


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
    root = _parse_xml(await _get(client, _base_url(valves.ARXIV_URL), params))
    papers = []
    for entry in root.findall("a:entry", ATOM):
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
            venue = "arXiv preprint arXiv:" + re.sub(
                r"v\d+$", "", page.split("/abs/")[1]
            )
        papers.append(
            _paper(
                entry.findtext("a:title", "", ATOM),
                pdf=pdf,
                page=page,
                authors=[
                    a.findtext("a:name", "", ATOM)
                    for a in entry.findall("a:author", ATOM)
                ],
                venue=venue,
                year=entry.findtext("a:published", "", ATOM),
                abstract=entry.findtext("a:summary", "", ATOM),
            )
        )
    return [p for p in papers if p.title][:count]


SCHOLARLY = {
    "openalex": _openalex,
    "semantic_scholar": _semantic_scholar,
    "arxiv": _arxiv,
}


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


async def _openwebui_web(
    ow: SimpleNamespace, request: Any, user: dict | None, engine: str
) -> Callable[[str, int], Awaitable[list]]:
    """A search function over Open WebUI's engine, for this version's API."""
    app_config = getattr(
        getattr(getattr(request, "app", None), "state", None), "config", None
    )
    takes_config = bool(ow.config_keys) and (
        "config" in inspect.signature(ow.search_web).parameters
    )
    if app_config is not None:  # 0.6 / 0.8
        enabled = bool(
            _app_setting(app_config, "ENABLE_WEB_SEARCH", "ENABLE_RAG_WEB_SEARCH")
        )
        engine = (
            engine
            or _app_setting(app_config, "WEB_SEARCH_ENGINE", "RAG_WEB_SEARCH_ENGINE")
            or ""
        )
        values, takes_config = {}, False
    elif ow.config_store is not None:  # 0.11+
        keys = {"web.search.enable", "web.search.engine"}
        keys |= set(ow.config_keys.values()) if takes_config else set()
        values = ow.config_store.get_many(*sorted(keys))
        values = dict(await values if inspect.isawaitable(values) else values)
        enabled = bool(values.get("web.search.enable"))
        engine = engine or values.get("web.search.engine") or ""
    else:
        raise _WebUnavailableError(WEB_UNCONFIGURED_TEXT)
    if not enabled:
        raise _WebUnavailableError(WEB_DISABLED_TEXT)
    if not engine:
        raise _WebUnavailableError(WEB_UNCONFIGURED_TEXT)
    owui_user = None
    if user and ow.user_model is not None:
        try:
            owui_user = ow.user_model(**user)
        except Exception:  # engines that need no user still work
            owui_user = None

    async def run(query: str, count: int) -> list:
        if takes_config:  # 0.12+
            config = {**values, "web.search.result_count": count}
            result = ow.search_web(request, engine, query, owui_user, config=config)
        elif inspect.iscoroutinefunction(ow.search_web):  # 0.11
            result = ow.search_web(request, engine, query, owui_user)
        else:  # 0.6 / 0.8: blocking
            result = await asyncio.to_thread(
                ow.search_web, request, engine, query, owui_user
            )
        return list((await result if inspect.isawaitable(result) else result) or [])

    return run


def _searxng_web(
    client: httpx.AsyncClient, url: str
) -> Callable[[str, int], Awaitable[list]]:
    """A search function over SearXNG's JSON API."""
    parts = urlsplit(url.strip())
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise _WebUnavailableError("The SEARXNG_URL valve is not a valid http(s) URL.")
    endpoint = urlunsplit((parts.scheme, parts.netloc, parts.path or "/", "", ""))

    async def run(query: str, count: int) -> list:
        data = json.loads(await _get(client, endpoint, {"q": query, "format": "json"}))
        results = [r for r in _dig(data, "results") or [] if isinstance(r, dict)]
        results.sort(key=lambda r: r.get("score") or 0, reverse=True)
        return [
            {"link": r.get("url"), "title": r.get("title"), "snippet": r.get("content")}
            for r in results
        ][:count]

    return run


def _web_paper(item: Any) -> _Paper | None:
    """A web result as a scholar record: the page URL goes in publicationInfo."""
    get = item.get if isinstance(item, dict) else lambda k: getattr(item, k, None)
    link = _text(get("link"))
    if not link:
        return None
    is_pdf = urlsplit(link).path.lower().endswith(".pdf")
    return _Paper(
        title=_text(get("title")) or link,
        pdf=link if is_pdf else "",
        page=link,
        info=link,
        snippet=_text(get("snippet")),
    )


def _describe_failure(exc: BaseException) -> str:
    """A short reason without URLs or secrets."""
    if isinstance(exc, _BadURLError):
        return "the tool's API URL setting is not a valid http(s) URL"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"the service answered HTTP {exc.response.status_code}"
    if isinstance(exc, httpx.TransportError):
        return "the service could not be reached"
    if isinstance(exc, ValueError | ET.ParseError):
        return "the service sent an answer that could not be read"
    return f"unexpected error ({type(exc).__name__})"


async def _emit(emitter: Emitter | None, **data: Any) -> None:
    """Send a status event; a failing emitter never stops the search."""
    if emitter is None:
        return
    try:
        sent = emitter({"type": "status", "data": data})
        if inspect.isawaitable(sent):
            await sent
    except Exception as exc:  # the UI is optional
        log.debug("status event failed: %s", type(exc).__name__)


def _positive(value: Any, default: int, ceiling: int = 1_000) -> int:
    """A valve limit as an int in 1..ceiling (non-numbers give the default)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return default
    return min(max(number, 1), ceiling)


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
            "Open WebUI's engine. Needed for web results outside Open WebUI.",
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
        queries = _normalise_queries(query)
        if queries is None:
            return INVALID_REQUEST
        backend = (self.valves.BACKEND or "").strip().lower()
        if backend not in BACKENDS:
            return (
                f"The google_scholar tool is misconfigured: its BACKEND valve must be "
                f"one of {', '.join(BACKENDS)}. Ask an administrator to fix it."
            )
        limit = _positive(self.valves.MAX_QUERIES_PER_SEARCH, 5)
        queries, skipped = queries[:limit], queries[limit:]
        await _emit(
            __event_emitter__,
            description="Searching papers: " + " · ".join(queries),
            done=False,
        )
        verify = await _ssl_context()
        async with httpx.AsyncClient(
            timeout=_seconds(self), follow_redirects=True, verify=verify
        ) as client:
            web = await _web(self, client, __request__, __user__)
            if backend == "web" and isinstance(web, str):
                await _emit(__event_emitter__, description=web, done=True)
                return web
            gate = asyncio.Semaphore(_positive(self.valves.CONCURRENT_QUERIES, 3))

            async def one(q: str) -> _Outcome:
                async with gate:
                    outcome = await _run_query(self, client, backend, web, q)
                await _report(__event_emitter__, q, outcome)
                return outcome

            outcomes = await asyncio.gather(*(one(q) for q in queries))
        text = SEPARATOR.join(outcome.text for outcome in outcomes)
        if skipped:
            names = ", ".join(f"'{q}'" for q in skipped)
            text += (
                f"\n\nNote: only the first {limit} queries of this call were searched "
                f"(limit per call). Not searched: {names}. "
                "Call the tool again with these queries if you still need them."
            )
        return text


# Open WebUI 0.6 offers every callable attribute of `Tools` not named `__*` as a
# tool (private `_x` methods included, which then fail its spec builder), so
# the class holds the tool method only and its helpers live here.


async def _web(
    tool: "Tools", client: httpx.AsyncClient, request: Any, user: dict | None
) -> Search | str:
    """The web search function, or the reason there is none."""
    searxng_url = (tool.valves.SEARXNG_URL or "").strip()
    try:
        ow = _import_openwebui() if request is not None and not searxng_url else None
        if ow is not None:
            engine = (tool.valves.SEARCH_ENGINE or "").strip()
            return await _openwebui_web(ow, request, user, engine)
        if not searxng_url:
            return NO_WEB_TEXT
        return _searxng_web(client, searxng_url)
    except _WebUnavailableError as exc:
        return str(exc)
    except Exception as exc:  # settings unreadable: no web search this call
        log.warning("reading web search settings failed: %s", type(exc).__name__)
        return WEB_UNCONFIGURED_TEXT


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
    except Exception as exc:  # web fallback failed too
        log.warning("web search failed for a query: %s", type(exc).__name__)
        if failure is None and MISSING_CONFIG.match(str(exc)):
            return _Outcome(WEB_UNCONFIGURED_TEXT, error=True)
        return _failure_outcome(query, failure or exc)
    papers = [p for p in map(_web_paper, found) if p][:count]
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
