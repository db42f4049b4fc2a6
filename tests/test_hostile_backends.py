"""The search and google_scholar tools against hostile backends over real HTTP.

Every backend (SearXNG, OpenAlex, Semantic Scholar, arXiv) is a fake on
127.0.0.1 that answers what an attacker or a broken server would: answers of
several MB, endless streams, compression bombs, junk after a gzip stream,
mixed score types, invalid links, entity bombs in any declared encoding. The
tools must answer in the reference format or with a model-facing error, keep
the heavy parsing off the event loop, and never show or log a credential
written into a URL valve.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import threading
import time
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from tongyi_deepresearch_openwebui_pipeline.tools import scholar_tool, search_tool

from .fakes.events import Events
from .fakes.scholarly import ArxivEntry, FakeScholarly, Fault, atom_feed, openalex_work
from .fakes.scholarly import s2_paper as s2_record
from .fakes.searxng import FakeSearXNG, result

T = TypeVar("T")
MB = 1_000_000
CAP = 5 * MB
SEARCH_TOO_LARGE = (
    "Search failed for 'q': the search engine sent an answer larger than 5 MB. "
    "Please try again later."
)
SEARCH_UNREADABLE = (
    "Search failed for 'q': the search engine sent an answer that could not be "
    "read. Please try again later."
)
SCHOLAR_TOO_LARGE = (
    "Scholar search failed for 'q': the service sent an answer larger than 5 MB. "
    "Please try again later."
)
SCHOLAR_UNREADABLE = (
    "Scholar search failed for 'q': the service sent an answer that could not be "
    "read. Please try again later."
)


def search_for(searxng: FakeSearXNG, **valves: Any) -> search_tool.Tools:
    tool = search_tool.Tools()
    tool.valves = search_tool.Tools.Valves(SEARXNG_URL=searxng.search_url, **valves)
    return tool


def scholar_for(apis: FakeScholarly, **valves: Any) -> scholar_tool.Tools:
    tool = scholar_tool.Tools()
    tool.valves = scholar_tool.Tools.Valves(
        OPENALEX_URL=apis.openalex_url,
        SEMANTIC_SCHOLAR_URL=apis.s2_url,
        ARXIV_URL=apis.arxiv_url,
        **valves,
    )
    return tool


# --- multi-MB answers: parsed off the event loop -------------------------------


def big_searxng_answer() -> bytes:
    """About 4.5 MB of SearXNG results (under the 5 MB cap)."""
    results = [
        result(
            f"https://site{i}.example/page",
            f"Result {i} " * 4,
            "snippet words " * 20,
            score=i % 97,
            published="2024-01-02",
        )
        for i in range(10_000)
    ]
    return json.dumps({"query": "q", "results": results}).encode()


def big_openalex_answer() -> bytes:
    works = [
        openalex_work(
            f"Paper {i}",
            authors=("Ann One", "Bob Two", "Cy Three", "Di Four"),
            venue="Journal",
            year=2020,
            abstract="word " * 60,
            cited=i,
        )
        for i in range(5_500)
    ]
    return json.dumps({"meta": {}, "results": works}).encode()


def big_s2_answer() -> bytes:
    papers = [
        s2_record(f"Paper {i}", year=2021, authors=("Ann", "Bob"), abstract="w " * 300)
        for i in range(5_000)
    ]
    return json.dumps({"total": len(papers), "data": papers}).encode()


def big_arxiv_feed() -> bytes:
    entries = [
        ArxivEntry(f"2101.{i:05d}", f"Paper {i}", "word " * 100, authors=("A",) * 5)
        for i in range(4_000)
    ]
    return atom_feed(entries)


BIG_ANSWERS: dict[str, Callable[[], bytes]] = {
    "searxng": big_searxng_answer,
    "openalex": big_openalex_answer,
    "semantic_scholar": big_s2_answer,
    "arxiv": big_arxiv_feed,
}


@functools.cache
def big_answer(kind: str) -> bytes:
    body = BIG_ANSWERS[kind]()
    assert 4 * MB < len(body) < CAP
    return body


async def run_with_big_answer(
    kind: str, searxng: FakeSearXNG, apis: FakeScholarly
) -> str:
    """One tool call whose backend answers the big body of `kind`."""
    body = big_answer(kind)
    if kind == "searxng":
        searxng.script("q", raw=body)
        return await search_for(searxng).search(["q"])
    apis.faults["s2" if kind == "semantic_scholar" else kind] = Fault(raw=body)
    tool = scholar_for(apis, BACKEND=kind, RESULTS_PER_QUERY=20)
    return await tool.google_scholar(["q"])


def expected_header(kind: str) -> str:
    if kind == "searxng":
        return "A Google search for 'q' found 10 results:\n\n## Web Results\n"
    return "A Google scholar for 'q' found 20 results:\n\n## Scholar Results\n"


@pytest.mark.parametrize("kind", list(BIG_ANSWERS))
async def test_big_answers_are_parsed_in_a_worker_thread(
    kind: str,
    searxng: FakeSearXNG,
    apis: FakeScholarly,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = search_tool if kind == "searxng" else scholar_tool
    seam = "_parse_feed" if kind == "arxiv" else "_parse_json"
    real = getattr(module, seam)
    threads: list[int] = []

    def spy(body: bytes) -> Any:
        threads.append(threading.get_ident())
        return real(body)

    monkeypatch.setattr(module, seam, spy)
    text = await run_with_big_answer(kind, searxng, apis)
    assert text.startswith(expected_header(kind))
    assert len(threads) == 1
    assert threads[0] != threading.get_ident()  # not the event loop's thread


async def longest_loop_step(work: Awaitable[T]) -> tuple[T, float]:
    """`work`'s result and the most CPU time the loop thread spent in one step.

    A ticker yields to the loop at every iteration and reads this thread's CPU
    clock, so each difference is the CPU one loop iteration used: the stall
    other chats would feel. CPU time, not wall time: a busy machine (or a
    worker thread holding the GIL) does not change it.
    """
    steps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.thread_time()
        while not done.is_set():
            await asyncio.sleep(0)
            now = time.thread_time()
            steps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        value = await work
    finally:
        done.set()
        await ticker
    return value, max(steps)


@pytest.mark.parametrize("kind", list(BIG_ANSWERS))
async def test_big_answers_do_not_stall_the_event_loop(
    kind: str, searxng: FakeSearXNG, apis: FakeScholarly
) -> None:
    await run_with_big_answer(kind, searxng, apis)  # warm up connections, caches
    text, longest = await longest_loop_step(run_with_big_answer(kind, searxng, apis))
    assert text.startswith(expected_header(kind))
    # Parsing and picking the results took 0.13-0.47 s of one loop step before.
    assert longest < 0.05, f"one loop step used {longest:.3f}s of CPU"


# --- the size cap counts the wire and the decompressed body ---------------------


def endless(chunk: bytes, stop: threading.Event) -> Iterator[bytes]:
    """A body that never ends (until the server stops)."""
    while not stop.is_set():
        yield chunk


def endless_after(first: bytes, chunk: bytes, stop: threading.Event) -> Iterator[bytes]:
    yield first
    yield from endless(chunk, stop)


@functools.cache
def gzip_bytes(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    return packer.compress(data) + packer.flush()


@functools.cache
def gzip_bomb() -> bytes:
    """About 200 kB of gzip that inflates to 200 MB of spaces."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * MB
    return b"".join(packer.compress(block) for _ in range(200)) + packer.flush()


async def test_searxng_answer_over_the_cap_is_refused(searxng: FakeSearXNG) -> None:
    searxng.script("q", raw=b"[" + b" " * (CAP + 10) + b"]")
    assert await search_for(searxng).search(["q"]) == SEARCH_TOO_LARGE


async def test_endless_searxng_answer_stops_at_the_cap(searxng: FakeSearXNG) -> None:
    searxng.script("q", raw=endless(b" " * 65536, searxng.stopping))
    text = await search_for(searxng, QUERY_TIMEOUT_SECONDS=60).search(["q"])
    assert text == SEARCH_TOO_LARGE


async def test_gzip_bomb_is_refused_with_bounded_memory(searxng: FakeSearXNG) -> None:
    searxng.script("q", raw=gzip_bomb(), headers={"Content-Encoding": "gzip"})
    tracemalloc.start()
    try:
        text = await search_for(searxng).search(["q"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text == SEARCH_TOO_LARGE
    assert peak < 4 * CAP  # never a whole 64 kB wire chunk inflated at once


async def test_junk_after_the_gzip_stream_is_refused(searxng: FakeSearXNG) -> None:
    answer = json.dumps({"results": [result("https://a.example", "A")]}).encode()
    body = endless_after(gzip_bytes(answer), b"junk" * 16384, searxng.stopping)
    searxng.script("q", raw=body, headers={"Content-Encoding": "gzip"})
    text = await search_for(searxng, QUERY_TIMEOUT_SECONDS=60).search(["q"])
    assert text == SEARCH_UNREADABLE


async def test_endless_junk_after_gzip_stops_at_the_wire_cap(
    searxng: FakeSearXNG,
) -> None:
    # Junk that zlib never looks at still counts against the cap on the wire.
    answer = json.dumps({"results": []}).encode()
    packed = gzip_bytes(answer)
    body = endless_after(packed[:-8], b"\0" * 65536, searxng.stopping)
    searxng.script("q", raw=body, headers={"Content-Encoding": "gzip"})
    text = await search_for(searxng, QUERY_TIMEOUT_SECONDS=60).search(["q"])
    assert text in {SEARCH_TOO_LARGE, SEARCH_UNREADABLE}


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "deflate", "raw-deflate"])
async def test_compressed_answers_are_read(searxng: FakeSearXNG, encoding: str) -> None:
    answer = json.dumps({"results": [result("https://a.example", "A", "S")]}).encode()
    if encoding == "raw-deflate":
        packer = zlib.compressobj(6, zlib.DEFLATED, -15)
        body, encoding = packer.compress(answer) + packer.flush(), "deflate"
    elif encoding == "deflate":
        body = zlib.compress(answer)
    else:
        body = gzip_bytes(answer)
    searxng.script("q", raw=body, headers={"Content-Encoding": encoding})
    text = await search_for(searxng).search(["q"])
    assert text.endswith("1. [A](https://a.example)\nSource: a.example\n\nS")
    assert searxng.requests[0].headers["accept-encoding"] == "gzip, deflate"


async def test_unknown_content_encoding_is_unreadable(searxng: FakeSearXNG) -> None:
    searxng.script("q", raw=b"\x1b\x00", headers={"Content-Encoding": "br"})
    assert await search_for(searxng).search(["q"]) == SEARCH_UNREADABLE


async def test_truncated_gzip_is_unreadable(searxng: FakeSearXNG) -> None:
    answer = json.dumps({"results": [result("https://a.example", "A")]}).encode()
    searxng.script(
        "q", raw=gzip_bytes(answer)[:-12], headers={"Content-Encoding": "gzip"}
    )
    assert await search_for(searxng).search(["q"]) == SEARCH_UNREADABLE


@pytest.mark.parametrize("api", ["openalex", "s2", "arxiv"])
async def test_scholarly_answer_over_the_cap_is_refused(
    apis: FakeScholarly, api: str
) -> None:
    apis.faults[api] = Fault(raw=b" " * (CAP + 1))
    backend = {"s2": "semantic_scholar"}.get(api, api)
    text = await scholar_for(apis, BACKEND=backend).google_scholar(["q"])
    assert text == SCHOLAR_TOO_LARGE


async def test_scholarly_gzip_bomb_falls_back_to_web(
    apis: FakeScholarly, searxng: FakeSearXNG
) -> None:
    apis.faults["openalex"] = Fault(
        raw=gzip_bomb(), headers={"Content-Encoding": "gzip"}
    )
    searxng.default.results = [result("https://web.example/p", "Web page")]
    tool = scholar_for(apis, SEARXNG_URL=searxng.search_url)
    text = await tool.google_scholar(["q"])
    assert text == (
        "A Google scholar for 'q' found 1 results:\n\n## Scholar Results\n"
        "1. [Web page](no available link)\npublicationInfo: https://web.example/p\n"
        "\n\nNote: the scholarly database (OpenAlex) did not answer, so these are "
        "general web search results instead of scholarly records."
    )


async def test_endless_web_fallback_answer_stops_at_the_cap(
    apis: FakeScholarly, searxng: FakeSearXNG
) -> None:
    searxng.script("academic research: q", raw=endless(b" " * 65536, searxng.stopping))
    tool = scholar_for(apis, BACKEND="web", SEARXNG_URL=searxng.search_url)
    tool.valves.QUERY_TIMEOUT_SECONDS = 60
    assert await tool.google_scholar(["q"]) == SCHOLAR_TOO_LARGE


# --- mixed score types from SearXNG ---------------------------------------------

ODD_SCORES: list[Any] = [
    "high",
    None,
    True,
    [1],
    {"v": 1},
    float("nan"),
    float("inf"),
    10**400,
    "7.5",
]


def mixed_score_results() -> list[dict[str, Any]]:
    entries = [result("https://top.example", "Top", score=9.5)]
    for i, score in enumerate(ODD_SCORES):
        entries.append(result(f"https://odd{i}.example", f"Odd {i}", score=score))
    entries.append(result("https://mid.example", "Mid", score=2))
    missing = result("https://missing.example", "Missing")
    del missing["score"]
    entries.append(missing)
    return entries


def mixed_score_body() -> bytes:
    # json.dumps writes NaN/Infinity, which SearXNG (Python) would also write.
    return json.dumps({"results": mixed_score_results()}).encode()


async def test_mixed_score_types_do_not_lose_the_query(searxng: FakeSearXNG) -> None:
    searxng.script("q", raw=mixed_score_body())
    text = await search_for(searxng, RESULTS_PER_QUERY=20).search(["q"])
    entries = [line for line in text.splitlines() if line[:1].isdigit()]
    titles = [line.split("](")[0].split("[", 1)[1] for line in entries]
    # Numbers rank first; anything that is not a finite number counts as 0 and
    # keeps SearXNG's own order.
    assert titles[:2] == ["Top", "Mid"]
    assert sorted(titles) == sorted(
        ["Top", "Mid", "Missing", *(f"Odd {i}" for i in range(len(ODD_SCORES)))]
    )


async def test_scholar_web_backend_with_mixed_scores(
    apis: FakeScholarly, searxng: FakeSearXNG
) -> None:
    searxng.script("academic research: q", raw=mixed_score_body())
    tool = scholar_for(
        apis, BACKEND="web", SEARXNG_URL=searxng.search_url, RESULTS_PER_QUERY=2
    )
    text = await tool.google_scholar(["q"])
    assert text == (
        "A Google scholar for 'q' found 2 results:\n\n## Scholar Results\n"
        "1. [Top](no available link)\npublicationInfo: https://top.example\n\n\n"
        "2. [Mid](no available link)\npublicationInfo: https://mid.example\n"
    )


# --- untrusted fields: google_scholar never raises ------------------------------

BAD_LINKS = [
    "http://[::1",
    "http://[::1]:99999/x",
    "javascript:alert(1)",
    "data:text/html,<script>1</script>",
    "https://",
    "https://a.example/\nInjected line",
    "https://a.example/" + "x" * 5000,
    "   ",
]


async def test_invalid_fallback_links_do_not_break_the_call(
    apis: FakeScholarly, searxng: FakeSearXNG
) -> None:
    apis.faults["openalex"] = Fault(status=503)
    searxng.default.results = [
        *(result(link, f"Bad {i}") for i, link in enumerate(BAD_LINKS)),
        result("https://good.example/paper.pdf", "Good"),
    ]
    events = Events()
    tool = scholar_for(apis, SEARXNG_URL=searxng.search_url)
    text = await tool.google_scholar(["q"], __event_emitter__=events)
    assert text == (
        "A Google scholar for 'q' found 1 results:\n\n## Scholar Results\n"
        "1. [Good](pdfUrl: https://good.example/paper.pdf)\n"
        "publicationInfo: https://good.example/paper.pdf\n"
        "\n\nNote: the scholarly database (OpenAlex) did not answer, so these are "
        "general web search results instead of scholarly records."
    )
    assert events[-1]["data"]["urls"] == ["https://good.example/paper.pdf"]


async def test_invalid_search_links_are_dropped(searxng: FakeSearXNG) -> None:
    searxng.default.results = [
        *(result(link, f"Bad {i}") for i, link in enumerate(BAD_LINKS)),
        result("https://good.example", "Good"),
    ]
    events = Events()
    text = await search_for(searxng).search(["q"], __event_emitter__=events)
    assert text == (
        "A Google search for 'q' found 1 results:\n\n## Web Results\n"
        "1. [Good](https://good.example)\nSource: good.example\n"
    )
    assert events[-1]["data"]["urls"] == ["https://good.example"]


HOSTILE_WORKS: list[Any] = [
    7,
    "text",
    None,
    [],
    {"display_name": ["list", "title"]},
    {"display_name": {"nested": "title"}},
    {
        "display_name": "Typed wrong",
        "publication_year": 10**30,
        "cited_by_count": True,
        "authorships": 7,
        "abstract_inverted_index": {"word": "not a list"},
        "primary_location": {"pdf_url": "http://[::1", "source": "flat"},
        "best_oa_location": [],
    },
    {
        "display_name": "Huge " + "t" * 200_000,
        "publication_year": "2019-05-01",
        "cited_by_count": 3.5,
        "authorships": [{"author": {"display_name": "N" * 100_000}}, 5, None],
        "primary_location": {"landing_page_url": "javascript:alert(1)"},
        "best_oa_location": {"pdf_url": "https://ok.example/p.pdf"},
    },
]


async def test_hostile_openalex_records_give_the_reference_format(
    apis: FakeScholarly,
) -> None:
    apis.faults["openalex"] = Fault(raw=json.dumps({"results": HOSTILE_WORKS}).encode())
    events = Events()
    text = await scholar_for(apis).google_scholar(["q"], __event_emitter__=events)
    # Wrong types count as missing; huge strings are cut at a word (a title
    # to 300 characters, a name to 200); invalid links are no links.
    assert text == (
        "A Google scholar for 'q' found 2 results:\n\n## Scholar Results\n"
        "1. [Typed wrong](no available link)\n\n\n"
        "2. [Huge …](pdfUrl: https://ok.example/p.pdf)\n"
        "publicationInfo: " + "N" * 200 + " … - 2019\nDate published: 2019\n"
    )
    assert events[-1]["data"]["urls"] == ["https://ok.example/p.pdf"]


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b"null",
        b'{"results": 5}',
        b'{"results": {"a": 1}}',
        b'{"results": "abc"}',
        b'{"data": 5}',
        b"1" * 5000,
    ],
)
async def test_odd_answer_shapes_never_raise(apis: FakeScholarly, body: bytes) -> None:
    for api, backend in (("openalex", "openalex"), ("s2", "semantic_scholar")):
        apis.faults[api] = Fault(raw=body)
        text = await scholar_for(apis, BACKEND=backend).google_scholar(["q"])
        assert text in {
            "No results found for 'q'. Try with a more general query.",
            SCHOLAR_UNREADABLE,
        }


async def test_engine_error_quoting_an_invalid_url_keeps_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from .fakes.searxng import OpenWebUIStandIn

    standin = OpenWebUIStandIn("0.11", "http://127.0.0.1:9/search")

    async def failing(request: Any, engine: str, query: str, user: Any = None):
        raise RuntimeError("could not fetch http://[::1 or https://a:b@[zz]/x")

    pieces = standin.namespace()
    pieces.search_web = failing
    standin.install(monkeypatch, pieces)
    text = await search_tool.Tools().search(["q"], __request__=standin.request)
    assert text == (
        "Search failed for 'q': unexpected error (RuntimeError). "
        "Please try again later."
    )


# --- arXiv feeds cannot expand entities, in any encoding -------------------------

BILLION_LAUGHS = (
    '<!DOCTYPE feed [<!ENTITY a "aaaaaaaaaa">'
    '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
    '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>'
)
EXTERNAL = '<!DOCTYPE feed [<!ENTITY c SYSTEM "file:///etc/hostname">]>'
PARAMETER = "<!DOCTYPE feed [<!ENTITY % p \"<!ENTITY c 'aaaaaaaaaa'>\"> %p;]>"
EXTERNAL_DTD = '<!DOCTYPE feed SYSTEM "http://127.0.0.1:9/evil.dtd">'
ATTACKS = {
    "billion-laughs": BILLION_LAUGHS,
    "external-entity": EXTERNAL,
    "parameter-entity": PARAMETER,
    "external-dtd": EXTERNAL_DTD,
}
ENCODINGS = ["UTF-8", "UTF-16", "UTF-16BE", "ISO-8859-1", "windows-1252"]


def hostile_feed(attack: str, encoding: str) -> bytes:
    text = (
        f'<?xml version="1.0" encoding="{encoding}"?>{ATTACKS[attack]}'
        '<feed xmlns="http://www.w3.org/2005/Atom"><entry>'
        "<id>http://arxiv.org/abs/1.1</id><title>T &c;</title></entry></feed>"
    )
    codec = {"UTF-16": "utf-16", "UTF-16BE": "utf-16-be"}.get(encoding, encoding)
    return text.encode(codec)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_hostile_feed_is_refused(
    apis: FakeScholarly, attack: str, encoding: str
) -> None:
    apis.faults["arxiv"] = Fault(
        raw=hostile_feed(attack, encoding), headers={"Content-Type": "application/xml"}
    )
    text = await scholar_for(apis, BACKEND="arxiv").google_scholar(["q"])
    assert text == SCHOLAR_UNREADABLE


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_feed_parser_refuses_any_document_type(attack: str, encoding: str) -> None:
    with pytest.raises(ValueError, match="document type"):
        scholar_tool._parse_feed(hostile_feed(attack, encoding))


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_feeds_in_other_encodings_are_read(
    apis: FakeScholarly, encoding: str
) -> None:
    text = (
        f'<?xml version="1.0" encoding="{encoding}"?>'
        '<feed xmlns="http://www.w3.org/2005/Atom"><entry>'
        "<id>http://arxiv.org/abs/1.1</id><title>Caf\u00e9 &amp; th\u00e9</title>"
        "<published>2020-01-01</published></entry></feed>"
    )
    codec = {"UTF-16": "utf-16", "UTF-16BE": "utf-16-be"}.get(encoding, encoding)
    apis.faults["arxiv"] = Fault(raw=text.encode(codec))
    out = await scholar_for(apis, BACKEND="arxiv").google_scholar(["q"])
    assert out == (
        "A Google scholar for 'q' found 1 results:\n\n## Scholar Results\n"
        "1. [Caf\u00e9 & th\u00e9](no available link)\n"
        "publicationInfo: arXiv preprint arXiv:1.1, 2020\nDate published: 2020\n"
    )


def test_feed_parser_reads_the_fake_arxiv_feed() -> None:
    root = scholar_tool._parse_feed(atom_feed([ArxivEntry("1.1", "T", "S")]))
    entry = root.find("a:entry", scholar_tool.ATOM)
    assert entry is not None
    assert entry.findtext("a:title", "", scholar_tool.ATOM) == "T"
    links = [link.get("title") for link in entry.findall("a:link", scholar_tool.ATOM)]
    assert links == [None, "pdf"]


# --- credentials in URL valves are sent, never shown or logged ------------------

PASSWORD = "pw-S3cr3t-9f2"
USER = "admin"


def secret_forms() -> list[str]:
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return [PASSWORD, basic, PASSWORD.lower()]


def assert_no_secret(
    text: str, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    logged = "\n".join(
        f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records
    )
    assert "HTTP Request" in logged  # httpx's own INFO line was captured
    for secret in secret_forms():
        assert secret not in text
        assert secret not in json.dumps(events)
        assert secret not in logged


def with_credentials(url: str, password: str = PASSWORD) -> str:
    return url.replace("http://", f"http://{USER}:{password}@", 1)


@pytest.mark.parametrize("status", [200, 502])
async def test_searxng_credentials_are_sent_but_never_shown(
    searxng: FakeSearXNG, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    caplog.set_level(logging.DEBUG)
    searxng.script("q", status=status, results=[result("https://a.example", "A")])
    tool = search_tool.Tools()
    tool.valves = search_tool.Tools.Valves(
        SEARXNG_URL=with_credentials(searxng.search_url)
    )
    events = Events()
    text = await tool.search(["q"], __event_emitter__=events)
    assert text.startswith("A Google search" if status == 200 else "Search failed")
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert searxng.requests[0].headers["authorization"] == f"Basic {basic}"
    assert_no_secret(text, events, caplog)


async def test_percent_encoded_credentials_are_decoded(searxng: FakeSearXNG) -> None:
    tool = search_tool.Tools()
    tool.valves = search_tool.Tools.Valves(
        SEARXNG_URL=with_credentials(searxng.search_url, "p%40ss%3Aword")
    )
    await tool.search(["q"])
    basic = base64.b64encode(b"admin:p@ss:word").decode()
    assert searxng.requests[0].headers["authorization"] == f"Basic {basic}"


async def test_searxng_credentials_stay_with_their_host(
    searxng: FakeSearXNG,
) -> None:
    with FakeSearXNG() as other:
        other.script("q", results=[result("https://a.example", "A")])
        searxng.script(
            "q",
            status=302,
            raw=b"",
            headers={"Location": other.search_url + "?q=q&format=json"},
        )
        tool = search_tool.Tools()
        tool.valves = search_tool.Tools.Valves(
            SEARXNG_URL=with_credentials(searxng.search_url)
        )
        text = await tool.search(["q"])
        assert text.endswith("1. [A](https://a.example)\nSource: a.example\n")
        assert "authorization" in searxng.requests[0].headers
        assert "authorization" not in other.requests[0].headers


async def test_scholar_url_credentials_are_sent_but_never_shown(
    apis: FakeScholarly,
    searxng: FakeSearXNG,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    apis.faults["openalex"] = Fault(status=502)
    searxng.default.results = [result("https://web.example", "Web")]
    tool = scholar_tool.Tools()
    tool.valves = scholar_tool.Tools.Valves(
        OPENALEX_URL=with_credentials(apis.openalex_url),
        SEARXNG_URL=with_credentials(searxng.search_url),
    )
    events = Events()
    text = await tool.google_scholar(["q"], __event_emitter__=events)
    assert "1. [Web](no available link)" in text
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert apis.requests_to("/works")[0].headers["authorization"] == f"Basic {basic}"
    assert searxng.requests[0].headers["authorization"] == f"Basic {basic}"
    assert_no_secret(text, events, caplog)


@pytest.mark.parametrize("backend", ["semantic_scholar", "arxiv"])
async def test_other_scholarly_url_credentials_never_logged(
    apis: FakeScholarly, caplog: pytest.LogCaptureFixture, backend: str
) -> None:
    caplog.set_level(logging.DEBUG)
    apis.faults["s2" if backend == "semantic_scholar" else "arxiv"] = Fault(status=500)
    tool = scholar_tool.Tools()
    tool.valves = scholar_tool.Tools.Valves(
        BACKEND=backend,
        SEMANTIC_SCHOLAR_URL=with_credentials(apis.s2_url),
        ARXIV_URL=with_credentials(apis.arxiv_url),
    )
    events = Events()
    text = await tool.google_scholar(["q"], __event_emitter__=events)
    assert text == (
        "Scholar search failed for 'q': the service answered HTTP 500. "
        "Please try again later."
    )
    assert "authorization" in apis.server.requests[0].headers
    assert_no_secret(text, events, caplog)


async def test_concurrent_big_answers_finish(
    searxng: FakeSearXNG, apis: FakeScholarly
) -> None:
    # Several worker-thread parses at once all complete and keep query order.
    searxng.script("q", raw=big_answer("searxng"))
    searxng.script("small", results=[result("https://s.example", "S")])
    texts = await asyncio.gather(
        search_for(searxng).search(["q", "small"]),
        search_for(searxng).search(["q"]),
    )
    assert (
        texts[0]
        .split("\n=======\n")[1]
        .endswith("1. [S](https://s.example)\nSource: s.example\n")
    )
    assert all(t.startswith(expected_header("searxng")) for t in texts)
