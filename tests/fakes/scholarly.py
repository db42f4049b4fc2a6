"""Fake scholarly APIs (OpenAlex, Semantic Scholar, arXiv) over real HTTP.

One `LocalServer` on 127.0.0.1 serves the three APIs in their real shapes:

- OpenAlex ``GET /works?search=...&per-page=...`` → ``{"meta", "results": [work]}``
  with ``abstract_inverted_index`` (word → positions) as OpenAlex sends it;
- Semantic Scholar ``GET /graph/v1/paper/search?query=...&limit=...&fields=...``
  → ``{"total", "offset", "data": [paper]}``;
- arXiv ``GET /api/query?search_query=all:w1 AND all:w2&max_results=...`` → an
  Atom feed.

Answers are scripted per query (the words of an arXiv ``search_query`` joined
by spaces); each API can also be made to fail with an HTTP status, send raw
bytes, or never answer (released when the server stops).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from .http import LocalServer, Request, Response


def inverted_index(text: str) -> dict[str, list[int]]:
    """An abstract as OpenAlex stores it: each word with its positions."""
    index: dict[str, list[int]] = {}
    for position, word in enumerate(text.split()):
        index.setdefault(word, []).append(position)
    return index


def openalex_work(
    title: str | None,
    *,
    year: int | None = None,
    authors: tuple[str, ...] = (),
    venue: str | None = None,
    pdf: str | None = None,
    landing: str | None = None,
    doi: str | None = None,
    cited: int = 0,
    abstract: str | None = None,
) -> dict[str, Any]:
    """One OpenAlex work record (the fields the tool reads, in OpenAlex's shape)."""
    source = {"display_name": venue} if venue else None
    location = {"landing_page_url": landing, "pdf_url": None, "source": source}
    return {
        "id": "https://openalex.org/W1",
        "doi": doi,
        "title": title,
        "display_name": title,
        "publication_year": year,
        "cited_by_count": cited,
        "authorships": [
            {"author_position": "middle", "author": {"display_name": name}}
            for name in authors
        ],
        "primary_location": location,
        "best_oa_location": {"pdf_url": pdf, "landing_page_url": landing}
        if pdf
        else None,
        "abstract_inverted_index": inverted_index(abstract) if abstract else None,
    }


def s2_paper(
    title: str | None,
    *,
    year: int | None = None,
    authors: tuple[str, ...] = (),
    venue: str = "",
    journal: str | None = None,
    pdf: str | None = None,
    arxiv: str | None = None,
    cited: int = 0,
    abstract: str | None = None,
    url: str = "https://www.semanticscholar.org/paper/abc",
    doi: str | None = None,
) -> dict[str, Any]:
    """One Semantic Scholar Graph API paper."""
    return {
        "paperId": "abc",
        "url": url,
        "title": title,
        "year": year,
        "venue": venue,
        "journal": {"name": journal} if journal else None,
        "authors": [{"authorId": str(i), "name": n} for i, n in enumerate(authors)],
        "citationCount": cited,
        "openAccessPdf": {"url": pdf, "status": "GREEN"} if pdf else None,
        "externalIds": {
            **({"ArXiv": arxiv} if arxiv else {}),
            **({"DOI": doi} if doi else {}),
        },
        "abstract": abstract,
    }


@dataclass
class ArxivEntry:
    """One arXiv Atom entry."""

    arxiv_id: str
    title: str
    summary: str = ""
    published: str = "2017-06-12T17:57:34Z"
    authors: tuple[str, ...] = ()
    journal_ref: str | None = None
    with_pdf: bool = True

    def xml(self) -> str:
        """The entry as arXiv writes it (title and summary wrapped over lines)."""
        page = f"http://arxiv.org/abs/{self.arxiv_id}"
        links = [f'<link href="{page}" rel="alternate" type="text/html"/>']
        if self.with_pdf:
            pdf = f"http://arxiv.org/pdf/{self.arxiv_id}"
            links.append(
                f'<link title="pdf" href="{pdf}" rel="related" type="application/pdf"/>'
            )
        authors = "".join(
            f"<author><name>{escape(a)}</name></author>" for a in self.authors
        )
        journal = (
            f"<arxiv:journal_ref>{escape(self.journal_ref)}</arxiv:journal_ref>"
            if self.journal_ref
            else ""
        )
        return (
            f"<entry><id>{page}</id><updated>{self.published}</updated>"
            f"<published>{self.published}</published>"
            f"<title>{escape(self.title)}</title>"
            f"<summary>  {escape(self.summary)}\n</summary>{authors}{journal}"
            f"{''.join(links)}"
            f'<arxiv:primary_category term="cs.CL" scheme={quoteattr("http://arxiv.org/schemas/atom")}/>'
            "</entry>"
        )


def atom_feed(entries: list[ArxivEntry]) -> bytes:
    """An arXiv API answer."""
    body = "".join(entry.xml() for entry in entries)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<feed xmlns="http://www.w3.org/2005/Atom" '
        'xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/" '
        'xmlns:arxiv="http://arxiv.org/schemas/atom">'
        "<title>arXiv Query</title>"
        f"<opensearch:totalResults>{len(entries)}</opensearch:totalResults>"
        f"{body}</feed>"
    ).encode()


@dataclass
class Fault:
    """Make one API misbehave: an HTTP status, raw bytes, or no answer at all.

    `raw` may be a stream of chunks; `headers` adds e.g. a Content-Encoding.
    """

    status: int = 200
    raw: bytes | Iterable[bytes] | None = None
    hang: bool = False
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeScholarly:
    """Scripts for the three APIs, served by one local server."""

    openalex: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    s2: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    arxiv: dict[str, list[ArxivEntry]] = field(default_factory=dict)
    faults: dict[str, Fault] = field(default_factory=dict)
    server: LocalServer = field(init=False)
    barrier: threading.Barrier | None = None

    def __post_init__(self) -> None:
        """Create the server (not started)."""
        self.server = LocalServer()
        self.reset()

    def reset(self) -> None:
        """Forget scripts, faults and requests (reuse one server across tests)."""
        self.openalex.clear()
        self.s2.clear()
        self.arxiv.clear()
        self.faults.clear()
        self.barrier = None
        self.server.routes = {
            "/works": self._openalex,
            "/graph/v1/paper/search": self._s2,
            "/api/query": self._arxiv,
        }
        self.server.requests.clear()

    def __enter__(self) -> FakeScholarly:
        """Start serving."""
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop serving (and release requests that wait)."""
        self.server.stop()

    @property
    def openalex_url(self) -> str:
        """Value for the OPENALEX_URL valve."""
        return self.server.base_url

    @property
    def s2_url(self) -> str:
        """Value for the SEMANTIC_SCHOLAR_URL valve."""
        return self.server.base_url

    @property
    def arxiv_url(self) -> str:
        """Value for the ARXIV_URL valve."""
        return self.server.url("/api/query")

    def requests_to(self, path: str) -> list[Request]:
        """The requests one API received."""
        return [r for r in self.server.requests if r.path == path]

    def gather(self, parties: int, wait_seconds: float = 5.0) -> None:
        """Hold each request until `parties` requests are in flight together.

        Requests that never get company fail with HTTP 504 after the wait.
        """
        self.barrier = threading.Barrier(parties, timeout=wait_seconds)

    def _fault(self, api: str) -> Response | None:
        if self.barrier is not None:
            try:
                self.barrier.wait()
            except threading.BrokenBarrierError:
                return Response.text("requests did not arrive together", 504)
        fault = self.faults.get(api)
        if fault is None:
            return None
        if fault.hang:
            self.server.wait_forever()
            return Response.text("stopped", 503)
        if fault.raw is not None:
            headers = {"Content-Type": "application/json", **fault.headers}
            return Response(fault.status, headers, fault.raw)
        return Response.text("api error", fault.status)

    def _openalex(self, request: Request) -> Response:
        failed = self._fault("openalex")
        if failed:
            return failed
        query = request.query.get("search", [""])[0]
        per_page = int(request.query.get("per-page", ["25"])[0])
        works = self.openalex.get(query, [])[:per_page]
        return Response.json({"meta": {"count": len(works)}, "results": works})

    def _s2(self, request: Request) -> Response:
        failed = self._fault("s2")
        if failed:
            return failed
        query = request.query.get("query", [""])[0]
        limit = int(request.query.get("limit", ["10"])[0])
        papers = self.s2.get(query, [])[:limit]
        return Response(
            200,
            {"Content-Type": "application/json"},
            json.dumps({"total": len(papers), "offset": 0, "data": papers}).encode(),
        )

    def _arxiv(self, request: Request) -> Response:
        failed = self._fault("arxiv")
        if failed:
            return failed
        search = request.query.get("search_query", [""])[0]
        words = " ".join(re.findall(r"all:(\S+)", search))
        limit = int(request.query.get("max_results", ["10"])[0])
        feed = atom_feed(self.arxiv.get(words, [])[:limit])
        return Response(200, {"Content-Type": "application/atom+xml"}, feed)
