"""Hostile input, round 2, in the tools (issue #25): bounded work, clear failures.

- Backend answers (search and google_scholar): JSON is parsed in steps of at
  most `JSON_STEP_CHARS` characters, so the worker thread that parses a 5 MB
  answer hands the interpreter lock back to the event loop between steps
  (one `json.loads` held it for the whole answer). Values too big for a step
  are read member by member, within a depth and a count; arXiv feeds go to
  expat in steps too; what the scholar tool then picks from an answer (the
  records, the characters of a text) is bounded.
- A redirect to a Location no URL parser can read fails that page with a
  clear reason and no traceback; a host name longer than DNS allows is
  refused before any lookup; a backend that redirects for ever fails its
  query clearly.
- Without a converter process, a PDF converted in a thread stops at its next
  read of the file (or page) once the caller stops waiting.

Every bound is proven by counting (characters handed to the JSON scanner,
records read, characters split, checks of a stop signal), never by timing.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any
from xml.parsers import expat

import pytest

from tongyi_deepresearch_openwebui_pipeline.tools import scholar_tool, search_tool

from .fakes.events import Events
from .fakes.http import LocalServer, Response
from .fakes.pages import load_visit_tool, make_pdf
from .fakes.scholarly import (
    ArxivEntry,
    FakeScholarly,
    Fault,
    atom_feed,
    openalex_work,
    s2_paper,
)

vt = load_visit_tool("visit_tool_hostile_round2")

RAW_DECODE = json.JSONDecoder().raw_decode


class CountedScan:
    """json's raw_decode, recording how many characters each call was given."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def __call__(self, text: str, index: int) -> tuple[Any, int]:
        self.steps.append(len(text) - index)
        return RAW_DECODE(text, index)


# --- backend answers: parsed in bounded steps ------------------------------------


def openalex_records() -> bytes:
    """4.6 MB of ordinary OpenAlex records (what test_hostile_backends sends)."""
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


# Every escape JSON has, a surrogate pair, multi-byte characters: cut anywhere
# in a long string, they show whether a step boundary splits a character.
AWKWARD = 'word é 日本 😀 "quoted" back\\slash \n\t\u0001 \u2028 \\u '


def one_long_title(ensure_ascii: bool) -> bytes:
    """A title of about 4 MB: one string far longer than a step."""
    title = AWKWARD * (50_000 if ensure_ascii else 75_000)
    answer = {"results": [{"display_name": title, "cited_by_count": 3}]}
    return json.dumps(answer, ensure_ascii=ensure_ascii).encode()


def long_member_names() -> bytes:
    """Member names of 300,000 characters (a name is a string like any other)."""
    answer = {("k" * 300_000) + str(i): i for i in range(5)}
    return json.dumps(answer).encode()


def big_values_nested(levels: int) -> bytes:
    """`levels` objects-in-lists, each bigger than a step: read by hand."""
    value: Any = "x" * 100_000
    for level in range(levels):
        value = {"level": level, "inner": [value, "y" * 10]}
    return json.dumps(value).encode()


def much_whitespace() -> bytes:
    """Megabytes of whitespace between the tokens (valid JSON)."""
    return b'{"a":' + b" " * 1_500_000 + b'1, "b": [' + b"\n\t\r " * 500_000 + b"2]}"


def utf16_records() -> bytes:
    """An answer in UTF-16, which json.loads reads from bytes as well."""
    works = [openalex_work(f"Papier {i} — é", year=2020) for i in range(3_000)]
    return json.dumps({"results": works}, ensure_ascii=False).encode("utf-16")


ANSWERS: dict[str, Callable[[], bytes]] = {
    "openalex records": openalex_records,
    "one long title (escapes)": functools.partial(one_long_title, ensure_ascii=True),
    "one long title (UTF-8)": functools.partial(one_long_title, ensure_ascii=False),
    "long member names": long_member_names,
    "big values nested 3 deep": functools.partial(big_values_nested, 3),
    "much whitespace": much_whitespace,
    "UTF-16": utf16_records,
}


@functools.cache
def answer(name: str) -> bytes:
    return ANSWERS[name]()


@pytest.mark.parametrize("name", list(ANSWERS))
def test_a_big_answer_is_parsed_in_steps_of_bounded_size(name: str) -> None:
    body = answer(name)
    scan = CountedScan()
    assert scholar_tool._parse_json(body, scan) == json.loads(body)
    # No step (the time the interpreter lock is held in one go) is larger than
    # JSON_STEP_CHARS, whatever the answer; json.loads took it in one step.
    assert max(scan.steps) <= scholar_tool.JSON_STEP_CHARS
    # And the work stays linear: windows grow four-fold, so a value costs at
    # most about five times its size (plus a few steps for the big values).
    assert sum(scan.steps) <= 6 * len(body) + 40 * scholar_tool.JSON_STEP_CHARS


def test_the_search_tool_parses_in_the_same_bounded_steps() -> None:
    body = answer("openalex records")
    scan = CountedScan()
    assert search_tool._parse_json(body, scan) == json.loads(body)
    assert max(scan.steps) <= search_tool.JSON_STEP_CHARS


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "Expecting value"),
        ("[1, 2,]", "Expecting value"),
        ('{"a" 1}', "Expecting ':' delimiter"),
        ('{"a": 1,}', "Expecting property name enclosed in double quotes"),
        ("[1] 2", "Extra data"),
        ('"a\u0001b"', "Invalid control character"),
        ('"abc', "Unterminated string"),
        ("[" * 5_000 + "]" * 5_000, "maximum recursion depth"),
    ],
)
def test_malformed_answers_are_refused_as_json_loads_refuses_them(
    text: str, error: str
) -> None:
    """Whatever json.loads refuses is refused (a ValueError: "could not be read")."""
    with pytest.raises((ValueError, RecursionError), match=error):
        json.loads(text.encode())
    with pytest.raises(ValueError):  # noqa: PT011  (the tools map any ValueError)
        scholar_tool._parse_json(text.encode())


@pytest.mark.parametrize(
    "body",
    [
        b'"x' + b"a" * 200_000 + b"\x01" + b'"',  # a control character, far in
        b'"x' + b"a" * 200_000,  # a long string that never ends
        b'{"a": [' + b"1, " * 100_000 + b"2}",  # a long list closed by "}"
        b"[" + b"1" * 70_000 + b"]",  # a number longer than a step
    ],
    ids=["control character", "unterminated", "wrong bracket", "long number"],
)
def test_malformed_big_answers_are_refused_in_bounded_steps(body: bytes) -> None:
    scan = CountedScan()
    with pytest.raises(ValueError):  # noqa: PT011
        scholar_tool._parse_json(body, scan)
    assert max(scan.steps) <= scholar_tool.JSON_STEP_CHARS


def flat_list_of_zeros() -> bytes:
    """4.8 MB: 2.4 million records, each a bare 0."""
    return b'{"results": [' + b",".join([b"0"] * 2_400_000) + b"]}"


def test_an_answer_of_millions_of_tiny_values_is_refused_after_bounded_work() -> None:
    scan = CountedScan()
    with pytest.raises(ValueError) as refused:  # noqa: PT011
        scholar_tool._parse_json(flat_list_of_zeros(), scan)
    limit = scholar_tool.JSON_MAX_SPLIT_VALUES
    assert (
        str(refused.value)
        == f"the answer has more than {limit} values to read one by one"
    )
    # Each value read by hand costs a step or two: the refusal comes after a
    # bounded number of steps, not after 2.4 million of them.
    assert len(scan.steps) <= limit + 10
    assert max(scan.steps) <= scholar_tool.JSON_STEP_CHARS


def test_big_values_nested_too_deep_are_refused() -> None:
    levels = scholar_tool.JSON_MAX_SPLIT_DEPTH  # each level is two containers
    with pytest.raises(ValueError) as refused:  # noqa: PT011
        scholar_tool._parse_json(big_values_nested(levels))
    assert str(refused.value) == "the answer nests values too deeply"


def scholar_for(apis: FakeScholarly, **valves: Any) -> scholar_tool.Tools:
    tool = scholar_tool.Tools()
    tool.valves = scholar_tool.Tools.Valves(
        OPENALEX_URL=apis.openalex_url, SEMANTIC_SCHOLAR_URL=apis.s2_url, **valves
    )
    return tool


async def test_scholar_refuses_an_answer_of_millions_of_records(
    apis: FakeScholarly,
) -> None:
    """Before: 16 s of CPU in a thread that went on after the query timed out."""
    apis.faults["openalex"] = Fault(raw=flat_list_of_zeros())
    text = await scholar_for(apis).google_scholar(["q"])
    assert text == (
        "Scholar search failed for 'q': the service sent an answer that could not "
        "be read. Please try again later."
    )
    assert isinstance(text, scholar_tool.ToolResult)
    assert text.ok is False


class CountedList(list):
    """A backend list that counts how many of its items were looked at."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.read = 0

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            self.read += 1
            yield item


@pytest.mark.parametrize(
    ("pick", "key", "untitled"),
    [
        (scholar_tool._openalex_papers, "results", openalex_work(None)),
        (scholar_tool._s2_papers, "data", s2_paper(None)),
    ],
    ids=["openalex", "semantic scholar"],
)
def test_only_the_first_records_of_an_answer_are_read(
    pick: Callable[[Any, int], list[Any]], key: str, untitled: dict
) -> None:
    """A backend asked for 10 records sends at most 100: no more are read."""
    records = CountedList([untitled] * 50_000)
    assert pick({key: records}, 10) == []
    assert records.read == scholar_tool.MAX_RECORDS_READ


def test_reading_stops_at_the_records_asked_for() -> None:
    titled = [openalex_work(f"Paper {i}") for i in range(50)]
    records = CountedList(titled)
    papers = scholar_tool._openalex_papers({"results": records}, 10)
    assert [paper.title for paper in papers] == [f"Paper {i}" for i in range(10)]
    assert records.read == 10


class CountedSplit(str):
    """A backend string that records the length of every split of it."""

    splits: list[int]

    def __new__(cls, text: str, splits: list[int]) -> CountedSplit:
        made = super().__new__(cls, text)
        made.splits = splits
        return made

    def __getitem__(self, key: Any) -> CountedSplit:
        return CountedSplit(str.__getitem__(self, key), self.splits)

    def split(self, *args: Any, **kwargs: Any) -> list[str]:  # type: ignore[override]
        self.splits.append(len(self))
        return str.split(self, *args, **kwargs)


def test_collapsing_the_spaces_of_a_huge_title_reads_a_bounded_prefix() -> None:
    """Before: all 4.8 MB were split into words, in one step (~150 ms)."""
    splits: list[int] = []
    title = CountedSplit("a " * 2_400_000, splits)
    assert scholar_tool._shorten(title, 300) == ("a " * 150).strip() + " …"
    assert splits == [scholar_tool.MAX_TEXT_CHARS]


class CountedParser:
    """An expat parser that records how many bytes each Parse call was given."""

    def __init__(self, sizes: list[int], **options: Any) -> None:
        object.__setattr__(self, "parser", expat.ParserCreate(**options))
        object.__setattr__(self, "sizes", sizes)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.parser, name, value)  # the handlers go to the real parser

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)

    def Parse(self, data: bytes, final: bool = False) -> int:  # noqa: N802  (expat's)
        self.sizes.append(len(data))
        return self.parser.Parse(data, final)


def test_a_feed_with_megabytes_of_text_is_parsed_in_bounded_steps() -> None:
    """Before: expat got the whole feed in one call (~100 ms, lock held)."""
    summary = "word " * 900_000
    feed = atom_feed([ArxivEntry("2101.00001", "Paper", summary, authors=("A",))])
    sizes: list[int] = []
    root = scholar_tool._parse_feed(feed, functools.partial(CountedParser, sizes))
    assert max(sizes) <= scholar_tool.FEED_STEP_BYTES
    assert sum(sizes) == len(feed)
    [paper] = scholar_tool._arxiv_papers(root, 10)
    assert (paper.title, paper.snippet) == ("Paper", ("word " * 60).strip() + " …")


# --- redirects no URL parser can read ---------------------------------------------

GOOD_PAGE = "Plain facts: water boils at 100 C."
LONG_HOST = "http://" + "a" * 10_000 + "/"
HTTPX_REFUSED = "network error (RemoteProtocolError)"
REDIRECTS = {
    # httpx reads these; the standard library's URL parser does not.
    "open bracket": ("http://[", "the server redirected to an invalid URL"),
    "close bracket": ("http://a]b/", "the server redirected to an invalid URL"),
    "bracket, no scheme": ("//]", "the server redirected to an invalid URL"),
    # httpx refuses these itself (its redirect request cannot be built).
    "unclosed IPv6": ("http://[::1", HTTPX_REFUSED),
    "control character": ("http://a\x01b.example/", HTTPX_REFUSED),
    "10 kB of garbage": ("\x7f" + "%" * 10_000, HTTPX_REFUSED),
    # Parsed, then refused by the address check.
    "space in the host": ("http://exa mple.com", "refused: the URL has no valid host"),
    "10 kB host": (LONG_HOST, "refused: the host name is longer than 253 characters"),
}  # fmt: skip


@pytest.fixture(scope="module")
def redirecting_site() -> Iterator[LocalServer]:
    routes: dict[str, Any] = {
        f"/to/{number}": (lambda _r, loc=location: Response(302, {"Location": loc}))
        for number, (location, _) in enumerate(REDIRECTS.values())
    }
    routes["/good"] = lambda _r: Response.text(GOOD_PAGE)
    routes["/loop"] = lambda _r: Response(302, {"Location": "/loop"})
    with LocalServer(routes) as server:
        yield server


@pytest.mark.parametrize("name", list(REDIRECTS))
async def test_a_redirect_to_an_unreadable_location_fails_that_page_clearly(
    name: str, redirecting_site: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    reason = REDIRECTS[name][1]
    bad = redirecting_site.url(f"/to/{list(REDIRECTS).index(name)}")
    good = redirecting_site.url("/good")
    tool = vt.Tools()
    tool.valves = tool.Valves(ALLOW_PRIVATE_URLS=True, PAGE_LOADER="builtin")
    events = Events()
    caplog.set_level(logging.DEBUG)

    result = await tool.visit(url=[bad, good], goal="g", __event_emitter__=events)

    failures = [
        line for line in events.descriptions() if line.startswith("Could not read")
    ]
    assert failures == [f"Could not read {bad}: {reason}"]
    assert result.ok  # the other page was read: only this page failed
    assert [source["source"]["url"] for source in result.sources] == [good]
    assert [record for record in caplog.records if record.exc_info] == []


async def test_a_host_name_too_long_for_dns_is_refused_before_any_lookup() -> None:
    with pytest.raises(vt._RefusedError) as refused:
        await vt._check_url("http://" + "a" * 254 + "/", allow_private=False)
    assert str(refused.value) == "the host name is longer than 253 characters"


async def test_a_scholar_backend_that_redirects_for_ever_fails_clearly(
    redirecting_site: LocalServer,
) -> None:
    tool = scholar_tool.Tools()
    tool.valves = scholar_tool.Tools.Valves(OPENALEX_URL=redirecting_site.url("/loop"))
    text = await tool.google_scholar(["q"])
    assert text == (
        "Scholar search failed for 'q': the service could not be reached. "
        "Please try again later."
    )


async def test_a_search_backend_that_redirects_for_ever_fails_clearly(
    redirecting_site: LocalServer,
) -> None:
    tool = search_tool.Tools()
    tool.valves = search_tool.Tools.Valves(SEARXNG_URL=redirecting_site.url("/loop"))
    text = await tool.search(["q"])
    assert text == (
        "Search failed for 'q': the search engine could not be reached. "
        "Please try again later."
    )


@pytest.mark.parametrize(
    "name", ["unclosed IPv6", "control character", "10 kB of garbage"]
)
async def test_a_backend_redirect_to_an_unreadable_location_fails_clearly(
    name: str, redirecting_site: LocalServer
) -> None:
    tool = search_tool.Tools()
    path = f"/to/{list(REDIRECTS).index(name)}"
    tool.valves = search_tool.Tools.Valves(SEARXNG_URL=redirecting_site.url(path))
    text = await tool.search(["q"])
    assert text == (
        "Search failed for 'q': the search engine could not be reached. "
        "Please try again later."
    )


# --- a PDF converted in a thread stops when its caller does -------------------------

PAGES = 40
PDF = make_pdf([f"Text of page {number}." for number in range(1, PAGES + 1)])


class StopAfter:
    """A stop signal that is set once `pages` pages were allowed."""

    def __init__(self, pages: int) -> None:
        self.pages = pages
        self.checks = 0

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks > self.pages


@pytest.mark.parametrize("allowed", [0, 3, 500])
def test_the_pdf_reader_stops_at_the_first_check_after_its_stop_is_set(
    allowed: int,
) -> None:
    stop = StopAfter(allowed)
    with pytest.raises(vt._PageError) as stopped:
        vt._pdf_to_text(PDF, 1_000_000, stop=stop)
    assert str(stopped.value) == "the conversion was stopped"
    assert stop.checks == allowed + 1  # nothing more was read after it


def test_the_pdf_reader_checks_its_stop_as_it_reads_the_file() -> None:
    """Not only between pages: pypdf reads the whole page tree before page 1."""
    stop = StopAfter(10**9)  # never set
    text, _title = vt._pdf_to_text(PDF, 1_000_000, stop=stop)
    assert text == vt._pdf_to_text(PDF, 1_000_000)[0]  # a stop changes nothing
    assert text.endswith(f"--- Page {PAGES} ---\nText of page {PAGES}.")
    # At least one check per object read from the file (the catalog, the page
    # tree, the font, and each page and its contents), besides one per page:
    # before, it was checked once per page only (PAGES times).
    assert stop.checks >= 3 + 2 * PAGES + PAGES


class HeldThread:
    """Runs a function in a thread of its own once released, like to_thread.

    As asyncio.to_thread, it runs the function in a copy of the caller's
    context; unlike it, the function starts only when the test says so, and
    its outcome (a value or an exception) is kept for the test to read.
    """

    def __init__(self) -> None:
        self.release = threading.Event()
        self.called = asyncio.Event()
        self.thread: threading.Thread | None = None
        self.outcome: Any = None

    async def __call__(self, func: Callable[..., Any], *args: Any) -> Any:
        context = contextvars.copy_context()

        def run() -> None:
            self.release.wait()
            try:
                self.outcome = context.run(func, *args)
            except Exception as exc:  # the outcome under test
                self.outcome = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        self.called.set()
        await asyncio.get_running_loop().create_future()  # until cancelled


async def test_a_fallback_conversion_stops_when_its_caller_stops() -> None:
    """Before: the thread read all 20,000 pages of a PDF after the page timed out."""
    raw = vt._RawPage("https://s.example/long.pdf", PDF, "application/pdf")
    held = HeldThread()
    converting = asyncio.create_task(
        vt._convert_in_thread(raw, 95_000, run_in_thread=held)
    )
    await held.called.wait()
    converting.cancel()  # the page timed out, or the chat was stopped
    with pytest.raises(asyncio.CancelledError):
        await converting
    held.release.set()  # only now does the thread begin reading the PDF
    assert held.thread is not None
    held.thread.join(timeout=60)  # a guard against a hang, not a measurement
    assert isinstance(held.outcome, vt._PageError)
    assert str(held.outcome) == "the conversion was stopped"


async def test_a_fallback_conversion_that_finishes_gives_the_page() -> None:
    raw = vt._RawPage("https://s.example/long.pdf", PDF, "application/pdf")
    assert await vt._convert_in_thread(raw, 95_000) == vt._convert(raw, 95_000)
