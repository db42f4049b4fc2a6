"""Property tests: any backend record gives the reference format or an error.

Every field a backend sends is untrusted: wrong types, nested objects, nulls,
missing keys, huge numbers, NaN, invalid or hostile links, huge strings. The
functions that turn a parsed answer into results must give records that print
in the reference format (checked by pattern) or raise ValueError (which the
tools report as "could not be read"), never anything else.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tongyi_deepresearch_openwebui_pipeline.tools import scholar_tool, search_tool

from .fakes.scholarly import ArxivEntry, atom_feed

FIELDS = [
    # OpenAlex
    "results", "display_name", "title", "best_oa_location", "primary_location",
    "pdf_url", "landing_page_url", "doi", "id", "authorships", "author", "source",
    "publication_year", "cited_by_count", "abstract_inverted_index",
    # Semantic Scholar
    "data", "externalIds", "ArXiv", "openAccessPdf", "url", "authors", "name",
    "venue", "journal", "year", "citationCount", "abstract",
    # SearXNG / Open WebUI
    "score", "content", "publishedDate", "link", "snippet",
]  # fmt: skip
ODD_STRINGS = [
    "http://[::1",
    "http://[::1]:99999/p",
    "https://ok.example/paper.pdf",
    "https://ok.example/x y",
    "javascript:alert(1)",
    "HTTPS://Upper.example/P",
    "2019-05-01T00:00:00",
    "1999",
    "a\nb\r\nc",
    "\x00\x1f",
    "](https://forged.example)",
    "x" * 3000,
    "w " * 2000,
]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**30, -(10**30), 10**400, 2019, 0, -1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(ODD_STRINGS)
)
JSON_LIKE = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(FIELDS) | st.text(max_size=4), children, max_size=6
        )
    ),
    max_leaves=40,
)
# Answers shaped like the real ones often enough to reach the field code.
ANSWERS = (
    JSON_LIKE
    | st.fixed_dictionaries({}, optional={"results": st.lists(JSON_LIKE, max_size=6)})
    | st.fixed_dictionaries({}, optional={"data": st.lists(JSON_LIKE, max_size=6)})
)
PROPERTY_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

NO_RESULTS = "No results found for 'q'. Try with a more general query."
LINK = r"https?://[^\s()]*\S*"
SCHOLAR_ENTRY = (
    r"[0-9]+\. \[[^\n]+\]\((?:pdfUrl: \S+|no available link)\)\n"
    r"(?:publicationInfo: [^\n]+\n)?"
    r"(?:Date published: [0-9]{4}\n)?"
    r"(?:citedBy: [1-9][0-9]*\n)?"
    r"(?:\n[^\n]+)?"
)
SCHOLAR_TEXT = re.compile(
    r"A Google scholar for 'q' found ([0-9]+) results:\n\n## Scholar Results\n"
    rf"{SCHOLAR_ENTRY}(?:\n\n{SCHOLAR_ENTRY})*"
)


def assert_http_link(url: str) -> None:
    parts = urlsplit(url)
    assert parts.scheme.lower() in {"http", "https"}
    assert parts.hostname
    assert not re.search(r"\s", url)
    assert len(url) <= scholar_tool.MAX_URL_CHARS


def assert_scholar_format(papers: list[scholar_tool._Paper]) -> None:
    text = scholar_tool._format_block("q", papers)
    if not papers:
        assert text == NO_RESULTS
        return
    match = SCHOLAR_TEXT.fullmatch(text)
    assert match, text
    assert int(match.group(1)) == len(papers)
    for paper in papers:
        assert len(paper.title) <= scholar_tool.TITLE_CHARS + 2
        for link in (paper.pdf, paper.page):
            if link:
                assert_http_link(link)
    assert len(text) < 10 * 4_000


@PROPERTY_SETTINGS
@given(ANSWERS)
def test_openalex_records(data: Any) -> None:
    assert_scholar_format(scholar_tool._openalex_papers(data, 10))


@PROPERTY_SETTINGS
@given(ANSWERS)
def test_semantic_scholar_records(data: Any) -> None:
    assert_scholar_format(scholar_tool._s2_papers(data, 10))


@PROPERTY_SETTINGS
@given(ANSWERS)
def test_searxng_answers_as_scholar_fallback(data: Any) -> None:
    papers = scholar_tool._web_papers(scholar_tool._searxng_items(data), 10)
    assert_scholar_format(papers)


class Hostile:
    """An engine result object whose attributes raise when read."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name}")


@PROPERTY_SETTINGS
@given(st.lists(JSON_LIKE | st.builds(Hostile), max_size=8))
def test_open_webui_results_as_scholar_fallback(items: list[Any]) -> None:
    assert_scholar_format(scholar_tool._web_papers(items, 10))


ARXIV_TEXT = st.text(max_size=40) | st.sampled_from(ODD_STRINGS)


@PROPERTY_SETTINGS
@given(
    st.lists(
        st.builds(
            ArxivEntry,
            arxiv_id=st.text(max_size=12) | st.sampled_from(["2101.00001", "[::1"]),
            title=ARXIV_TEXT,
            summary=ARXIV_TEXT,
            published=ARXIV_TEXT,
            authors=st.tuples(ARXIV_TEXT, ARXIV_TEXT),
            journal_ref=st.none() | ARXIV_TEXT,
            with_pdf=st.booleans(),
        ),
        max_size=5,
    )
)
def test_arxiv_feeds(entries: list[ArxivEntry]) -> None:
    try:
        root = scholar_tool._parse_feed(atom_feed(entries))
    except ValueError:  # e.g. a control character XML cannot carry
        return
    assert_scholar_format(scholar_tool._arxiv_papers(root, 10))


@PROPERTY_SETTINGS
@given(st.binary(max_size=300) | st.text(max_size=100).map(str.encode))
def test_feed_parser_only_raises_value_error(body: bytes) -> None:
    with contextlib.suppress(ValueError):
        scholar_tool._parse_feed(b"<feed>" + body)


@PROPERTY_SETTINGS
@given(st.text(max_size=60))
def test_feed_text_round_trips(title: str) -> None:
    feed = (
        '<feed xmlns="http://www.w3.org/2005/Atom"><entry>'
        f"<title>{escape(title)}</title></entry></feed>"
    ).encode()
    try:
        root = scholar_tool._parse_feed(feed)
    except ValueError:
        return
    # XML itself turns every line end into "\n".
    expected = title.replace("\r\n", "\n").replace("\r", "\n")
    assert root.findtext("a:entry/a:title", "", scholar_tool.ATOM) == expected


# --- search ----------------------------------------------------------------------


def assert_search_format(hits: list[search_tool._Hit]) -> None:
    text = search_tool._format_block("q", hits)
    if not hits:
        assert text == NO_RESULTS
        return
    assert text.startswith(
        f"A Google search for 'q' found {len(hits)} results:\n\n## Web Results\n"
    )
    for number, hit in enumerate(hits, 1):
        assert_http_link(hit.link)
        assert "\n" not in hit.title
        assert (
            0 < len(hit.title) <= search_tool.TITLE_CHARS + 2 or hit.title == hit.link
        )
        assert "\n" not in hit.date
        assert len(hit.date) <= search_tool.DATE_CHARS
        assert len(hit.snippet) <= search_tool.SNIPPET_CHARS + 2
        assert f"{number}. [{hit.title}]({hit.link})\n" in text


@PROPERTY_SETTINGS
@given(ANSWERS)
def test_searxng_answers(data: Any) -> None:
    body = json.dumps(data).encode()
    try:
        hits = search_tool._searxng_hits(body, 10)
    except ValueError:  # reported as "could not be read"
        return
    assert_search_format(hits)


@PROPERTY_SETTINGS
@given(st.lists(JSON_LIKE | st.builds(Hostile), max_size=8))
def test_open_webui_results(items: list[Any]) -> None:
    hits = search_tool._hits(
        items,
        10,
        lambda r: (
            search_tool._field(r, "title"),
            search_tool._field(r, "link"),
            search_tool._field(r, "snippet"),
        ),
    )
    assert_search_format(hits)


# --- the tool methods themselves never raise ------------------------------------


def broken_http_client(*_args: Any, **_kwargs: Any) -> Any:
    """Where a tool builds its HTTP client, an error nobody planned for."""
    raise RuntimeError("CA bundle missing")


async def test_google_scholar_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpx, "AsyncClient", broken_http_client)
    text = await scholar_tool.Tools().google_scholar(["q"])
    assert text == (
        "Scholar search failed: unexpected error (RuntimeError). "
        "Please try again later."
    )


async def test_search_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpx, "AsyncClient", broken_http_client)
    tool = search_tool.Tools()
    tool.valves.SEARXNG_URL = "http://127.0.0.1:9/search"
    text = await tool.search(["q"])
    assert text == (
        "Search failed: unexpected error (RuntimeError). Please try again later."
    )


@pytest.mark.parametrize("date", ["a\nb", "2020\r\n<b>", "x" * 100, 2020, None])
def test_odd_dates_never_break_a_line(date: Any) -> None:
    hit = search_tool._make_hit("T", "https://a.example", "", date)
    assert hit is not None
    assert "\n" not in hit.date
    assert len(hit.date) <= search_tool.DATE_CHARS
