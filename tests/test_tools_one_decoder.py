"""One body decoder for the three tools: what one reads, all read; at the cap, all stop.

Every tool reads what a server sends through the same safe HTTP code
(tools/shared/safe_http.py): gzip, deflate with a zlib header and deflate
without one (raw, as some servers send it) are each read, and a body that
decodes to more than the tool's cap is stopped at the cap, whatever its
encoding. Each case runs the real tool against a server on 127.0.0.1; a
search answer over its cap is refused, a page over its cap is cut there and
marked, as each tool always did. The raw deflate page was called corrupt by
the visit tool's own decoder before it used this one.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.fakes.http import LocalServer, Request, Response
from tests.fakes.pages import load_visit_tool
from tests.fakes.scholarly import openalex_work
from tongyi_deepresearch_openwebui_pipeline.tools import scholar_tool, search_tool

vt = load_visit_tool("visit_tool_one_decoder_tests")


def raw_deflate(data: bytes) -> bytes:
    """Deflate without the zlib header and trailer."""
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


# name -> (Content-Encoding, how the body is packed)
ENCODINGS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress),
    "deflate with a zlib header": ("deflate", zlib.compress),
    "deflate without a zlib header": ("deflate", raw_deflate),
    "none": ("identity", lambda data: data),
}
SEARCH_CAP = 5_000_000  # search and scholar: MAX_RESPONSE_BYTES
PAGE_CAP = 10_000  # visit: the smallest MAX_DOWNLOAD_BYTES

SEARXNG_ANSWER = json.dumps(
    {"results": [{"url": "https://a.example/x", "title": "A", "content": "S"}]}
).encode()
SEARCH_TEXT = (
    "A Google search for 'q' found 1 results:\n\n## Web Results\n"
    "1. [A](https://a.example/x)\nSource: a.example\n\nS"
)
SEARCH_TOO_LARGE = (
    "Search failed for 'q': the search engine sent an answer larger than 5 MB. "
    "Please try again later."
)
OPENALEX_ANSWER = json.dumps(
    {"results": [openalex_work("Paper", year=2020, landing="https://p.example/1")]}
).encode()
SCHOLAR_TEXT = (
    "A Google scholar for 'q' found 1 results:\n\n## Scholar Results\n"
    "1. [Paper](no available link)\npublicationInfo: 2020\n"
    "Date published: 2020\ncitedBy: 0\n"
)
SCHOLAR_TOO_LARGE = (
    "Scholar search failed for 'q': the service sent an answer larger than 5 MB. "
    "Please try again later."
)
PAGE = b"Plain facts: water boils at 100 C."
LONG_PAGE = b"word " * (PAGE_CAP // 5 + 1)  # one word more than the cap holds
NO_EXTRACTOR = (
    "No extractor model is configured (EXTRACTOR_BASE_URL valve), so the evidence "
    "above is the beginning of the page text, not a goal-focused extract."
)


def visit_text(url: str, evidence: str) -> str:
    """The visit tool's answer for one page read without an extractor."""
    return (
        f"The useful information in {url} for user goal g as follows: \n\n"
        f"Evidence in page: \n{evidence}\n\nSummary: \n{NO_EXTRACTOR}"
    )


class Bodies(LocalServer):
    """Serves `/<anything>` with the body and Content-Encoding set for it."""

    def __init__(self) -> None:
        super().__init__({"/": self._answer})
        self.body = b""
        self.headers: dict[str, str] = {}

    def serve(self, body: bytes, encoding: str, content_type: str) -> None:
        """Answer every request with `body` packed as `encoding` names."""
        content_encoding, pack = ENCODINGS[encoding]
        self.body = pack(body)
        self.headers = {"Content-Type": content_type}
        if content_encoding != "identity":
            self.headers["Content-Encoding"] = content_encoding

    def _answer(self, request: Request) -> Response:
        # Chunks, not bytes: no Content-Length, so the body is read to its end
        # (a declared length over the cap would be refused before any read).
        return Response(200, dict(self.headers), [self.body])


@pytest.fixture(scope="module")
def server() -> Iterator[Bodies]:
    running = Bodies()
    with running:
        yield running


@pytest.fixture(autouse=True)
def _fresh(server: Bodies) -> None:
    server.requests.clear()


async def search(server: Bodies) -> str:
    tool = search_tool.Tools()
    tool.valves = tool.Valves(SEARXNG_URL=server.url("/search"))
    return await tool.search(["q"])


async def scholar(server: Bodies) -> str:
    tool = scholar_tool.Tools()
    tool.valves = tool.Valves(OPENALEX_URL=server.base_url)
    return await tool.google_scholar(["q"])


async def visit(server: Bodies, **valves: Any) -> str:
    tool = vt.Tools()
    tool.valves = tool.Valves(
        ALLOW_PRIVATE_URLS=True,
        PAGE_LOADER="builtin",
        MAX_DOWNLOAD_BYTES=PAGE_CAP,
        **valves,
    )
    # No chat id: no page cache, every call reads the page again.
    return await tool.visit(url=[server.url("/page")], goal="g")


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
async def test_search_reads_every_encoding(server: Bodies, encoding: str) -> None:
    server.serve(SEARXNG_ANSWER, encoding, "application/json")
    assert await search(server) == SEARCH_TEXT


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
async def test_scholar_reads_every_encoding(server: Bodies, encoding: str) -> None:
    server.serve(OPENALEX_ANSWER, encoding, "application/json")
    assert await scholar(server) == SCHOLAR_TEXT


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
async def test_visit_reads_every_encoding(server: Bodies, encoding: str) -> None:
    server.serve(PAGE, encoding, "text/plain")
    assert await visit(server) == visit_text(server.url("/page"), PAGE.decode())


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
async def test_search_refuses_an_answer_over_its_cap(
    server: Bodies, encoding: str
) -> None:
    server.serve(b" " * (SEARCH_CAP + 1), encoding, "application/json")
    assert await search(server) == SEARCH_TOO_LARGE


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
async def test_scholar_refuses_an_answer_over_its_cap(
    server: Bodies, encoding: str
) -> None:
    server.serve(b" " * (SEARCH_CAP + 1), encoding, "application/json")
    assert await scholar(server) == SCHOLAR_TOO_LARGE


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
async def test_visit_cuts_a_page_over_its_cap(server: Bodies, encoding: str) -> None:
    server.serve(LONG_PAGE, encoding, "text/plain")
    kept = LONG_PAGE[:PAGE_CAP].decode().strip()
    evidence = f"{kept}\n\n{vt.TRUNCATION_NOTE}"
    result = await visit(server, RAW_EXCERPT_CHARS=2 * PAGE_CAP)
    assert result == visit_text(server.url("/page"), evidence)


async def test_every_tool_asks_for_the_encodings_it_reads(server: Bodies) -> None:
    server.serve(PAGE, "none", "text/plain")
    await search(server)
    await scholar(server)
    await visit(server)
    asked = [request.headers.get("accept-encoding") for request in server.requests]
    assert asked == ["gzip, deflate"] * 3
    assert vt.ACCEPT_ENCODING == search_tool.ACCEPT_ENCODING == "gzip, deflate"
    assert scholar_tool.ACCEPT_ENCODING == "gzip, deflate"
