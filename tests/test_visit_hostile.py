"""Hostile pages cost no more than their budget, and leave nothing running.

Issue 11, availability: pages built to make the converter slow (nested tables,
repeated `<a `, nested links and lists, unterminated quotes), bodies that go on
after their compressed stream, resolvers that never answer and charsets that
are not text encodings. Each gets a clear answer within its page timeout; no
thread of the server converts page content, no converter process is left
behind, and page content never switches the converter processes off.

The sites run on 127.0.0.1 over real HTTP; names are resolved by stubs, and
each test converts with a converter of its own (the tool's seams). The
worst event-loop stall over these inputs is measured by benchmarks/hostile.py
(timings are not asserted here beyond bounds many times the budget).
"""

from __future__ import annotations

import asyncio
import gzip
import os
import socket
import sys
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.events import Events
from tests.fakes.hostile import (
    HOSTILE_UNITS,
    empty_deflate_blocks,
    gzip_then_junk,
    hostile_page,
    scaled,
)
from tests.fakes.http import LocalServer, Response
from tests.fakes.pages import (
    ARTICLE_HTML,
    FAKE_PUBLIC_IP,
    FakeResolver,
    load_visit_tool,
)
from tests.fakes.visit_seams import ConverterWatch, CountingTransport, client_over

vt = load_visit_tool("visit_tool_hostile_tests")

PAGE_TIMEOUT = 1.5
# Far above the page timeout (a stopped conversion answers within
# milliseconds of it), far below what the pages cost when nothing stops them.
ANSWER_BOUND = PAGE_TIMEOUT + 10
JUNK_BYTES = 37_000_000
ARTICLE = ARTICLE_HTML.encode()
NOT_TEXT_CODECS = [
    "rot13", "base64", "zlib", "idna", "bz2", "hex", "uu", "quopri", "punycode",
    "unicode_escape", "raw_unicode_escape", "utf-7", "zip",
]  # fmt: skip
needs_proc = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="counts processes in /proc"
)


def hostile_path(name: str) -> str:
    return "/hostile/" + "".join(c if c.isalnum() else "-" for c in name)


def _chunked(chunks: list[bytes], sent: list[int]) -> Iterator[bytes]:
    for chunk in chunks:
        sent[0] += len(chunk)
        yield chunk


def _routes(sent: list[int]) -> dict[str, Any]:
    html = {"Content-Type": "text/html; charset=utf-8"}
    gz = {**html, "Content-Encoding": "gzip"}
    members = [gzip.compress(f"<p>member {n:03d}</p>".encode()) for n in range(200)]
    routes: dict[str, Any] = {
        hostile_path(n): (lambda r, n=n: Response(200, html, hostile_page(n)))
        for n in HOSTILE_UNITS
    }
    routes |= {
        "/fine": lambda r: Response(200, html, ARTICLE),
        "/gzip-then-junk": lambda r: Response(
            200, gz, _chunked(gzip_then_junk(ARTICLE, JUNK_BYTES), sent)
        ),
        "/gzip-members": lambda r: Response(
            200, gz, gzip.compress(b"<p>first part</p>") + gzip.compress(b"second part")
        ),
        "/gzip-many-members": lambda r: Response(200, gz, b"".join(members)),
        "/deflate-then-junk": lambda r: Response(
            200,
            {**html, "Content-Encoding": "deflate"},
            zlib.compress(ARTICLE) + b"junk" * 2_000_000,
        ),
        "/empty-blocks": lambda r: Response(
            200, gz, empty_deflate_blocks(b"<p>tiny page</p>", 5_000_000)
        ),
    }
    return routes


@pytest.fixture(scope="module")
def junk_sent() -> list[int]:
    return [0]


@pytest.fixture(scope="module")
def site(junk_sent: list[int]) -> Iterator[LocalServer]:
    with LocalServer(_routes(junk_sent)) as server:
        yield server


@pytest.fixture
def watch() -> ConverterWatch:
    """Records the workers the test's converter starts and its thread pages."""
    return ConverterWatch(vt)


@pytest.fixture
async def converter(watch: ConverterWatch) -> AsyncIterator[Any]:
    """The test's own converter; its warm workers are stopped at the end."""
    made = watch.converter()
    yield made
    await vt._stop_idle_workers(made)


def make_tool(seams: Any = None, **valves: Any) -> Any:
    """A tool reading loopback pages with the built-in fetcher."""
    tool = vt.Tools(seams=seams)
    tool.valves = tool.Valves(ALLOW_PRIVATE_URLS=True, PAGE_LOADER="builtin", **valves)
    return tool


def child_pids() -> set[int]:
    """Every process whose parent is this one (zombies too)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            found.add(int(entry))
    return found


def idle_worker_pids(converter: Any) -> set[int]:
    return {worker.process.pid for worker in converter.idle}


def threads_busy_with_pages() -> list[str]:
    """Threads (but this one) running the converter or an HTML parser right now."""
    busy = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        stack: Any = frame
        while stack is not None:
            name = stack.f_code.co_filename
            if name == vt.__file__ or name.endswith(
                ("html/parser.py", "_markupbase.py")
            ):
                busy.append(f"{name}:{stack.f_code.co_name}")
                break
            stack = stack.f_back
    return busy


# -- hostile pages: bounded by the page timeout, nothing left running ---------------


@needs_proc
@pytest.mark.parametrize("name", sorted(HOSTILE_UNITS))
async def test_a_hostile_page_costs_its_timeout_at_most_and_leaves_nothing(
    name: str, site: LocalServer, converter: Any, watch: ConverterWatch
) -> None:
    tool = make_tool(
        vt._Seams(converter=converter),
        PAGE_TIMEOUT_SECONDS=PAGE_TIMEOUT,
        URL_TIMEOUT_SECONDS=120,
    )
    # TLS context and a warm worker, with all the time a busy machine needs to
    # start one (the hostile page's own short timeout would kill a slow start).
    warm_up = make_tool(vt._Seams(converter=converter), PAGE_TIMEOUT_SECONDS=120)
    await warm_up.visit(url=[site.url("/fine")], goal="warm up")
    (warm,) = converter.idle  # the worker the hostile page goes to
    threads_before = threading.active_count()
    children_before = child_pids()
    events = Events()
    started = time.monotonic()
    result = await tool.visit(
        url=[site.url(hostile_path(name))], goal="g", __event_emitter__=events
    )
    elapsed = time.monotonic() - started

    assert elapsed < ANSWER_BOUND
    read = vt.FAILURE_EVIDENCE not in result
    url = site.url(hostile_path(name))
    assert read or f"Could not read {url}: timed out" in events.descriptions()
    assert watch.threaded == []  # converted in a child process
    assert watch.pids() == [warm.process.pid]  # the warm one: no other started
    assert threads_busy_with_pages() == []  # no thread goes on converting
    assert threading.active_count() == threads_before
    left = child_pids() - children_before
    assert left <= idle_worker_pids(converter)  # only warm, idle workers remain
    if not read:  # the worker was stopped at the deadline: killed and reaped
        assert warm.process.pid not in child_pids()
        assert converter.idle == []
    assert converter.usable()
    assert converter.start_failures == 0


@needs_proc
async def test_hostile_pages_at_once_never_switch_the_workers_off(
    site: LocalServer, converter: Any, watch: ConverterWatch
) -> None:
    children_before = child_pids()
    urls = [site.url(hostile_path(name)) for name in sorted(HOSTILE_UNITS)]
    tool = make_tool(
        vt._Seams(converter=converter),
        PAGE_TIMEOUT_SECONDS=PAGE_TIMEOUT,
        MAX_URLS_PER_CALL=10,
        CONCURRENT_URLS=10,
    )
    for _ in range(2):  # every slow page kills its worker, twice over
        started = time.monotonic()
        await tool.visit(url=urls, goal="g")
        assert time.monotonic() - started < ANSWER_BOUND
    assert converter.usable()
    assert converter.start_failures == 0
    assert watch.threaded == []
    assert child_pids() - children_before <= idle_worker_pids(converter)
    assert len(idle_worker_pids(converter)) <= converter.max_idle
    page = await vt._convert_page(
        vt._RawPage("https://s.example/a", ARTICLE, "text/html"), 2000, converter
    )
    assert "# Solar panel efficiency in 2024" in page.text
    assert watch.threaded == []


# -- without a worker process: a linear reader with hard caps ----------------------


@pytest.mark.parametrize("name", sorted(HOSTILE_UNITS))
async def test_the_fallback_reads_a_hostile_page_of_the_download_cap(
    name: str,
) -> None:
    cap = vt.Tools.Valves().MAX_DOWNLOAD_BYTES
    raw = vt._RawPage("https://s.example/h", scaled(name, cap), "text/html")
    # Linear with a cap on characters and tags: well under a second (the old
    # reader took hours on these); the bound is only there to end a hang.
    page = await asyncio.wait_for(
        asyncio.to_thread(vt._convert_budgeted, raw, 95_000), 60
    )
    assert page.text


async def test_without_a_worker_pages_go_to_the_budgeted_converter(
    watch: ConverterWatch,
) -> None:
    converter = watch.converter("")  # no program: no worker can run
    raw = vt._RawPage("https://s.example/a", ARTICLE, "text/html")
    page = await vt._convert_page(raw, 2000, converter)
    assert page == vt._convert_budgeted(raw, 2000)
    assert page == vt._convert(raw, 2000)  # the same text as the HTML parser's
    assert (watch.threaded, watch.spawned) == ([raw.final_url], [])


# -- compressed bodies ---------------------------------------------------------------


@pytest.fixture
def wire() -> CountingTransport:
    """Real HTTP, counting the body bytes taken from the wire (what was decoded)."""
    return CountingTransport()


async def read_body(url: str, cap: int, wire: CountingTransport) -> tuple[bytes, bool]:
    """The body as the tool reads it, with `cap`; `wire` counts what it took."""
    client = httpx.AsyncClient(transport=wire, trust_env=False)
    async with client, client.stream("GET", url) as response:
        return await vt._read_capped(response, cap)


async def test_junk_after_a_gzip_stream_is_not_read(
    site: LocalServer, wire: CountingTransport
) -> None:
    body, cut = await read_body(site.url("/gzip-then-junk"), 64_000_000, wire)
    assert (body, cut) == (ARTICLE, False)
    assert wire.received < 1_000_000  # not the 37 MB behind it


async def test_a_page_with_junk_after_its_gzip_stream_is_read(
    site: LocalServer, wire: CountingTransport, converter: Any
) -> None:
    seams = vt._Seams(http_client=client_over(wire), converter=converter)
    tool = make_tool(seams, MAX_DOWNLOAD_BYTES=64_000_000)
    result = await tool.visit(url=[site.url("/gzip-then-junk")], goal="g")
    assert "# Solar panel efficiency in 2024" in result
    assert 0 < wire.received < 1_000_000


async def test_junk_after_a_deflate_stream_is_not_read(
    site: LocalServer, wire: CountingTransport
) -> None:
    body, cut = await read_body(site.url("/deflate-then-junk"), 10_000_000, wire)
    assert (body, cut) == (ARTICLE, False)
    assert wire.received < 1_000_000  # not the 8 MB behind it


async def test_gzip_members_are_read_one_after_another(
    site: LocalServer, wire: CountingTransport
) -> None:
    body, cut = await read_body(site.url("/gzip-members"), 10_000, wire)
    assert (body, cut) == (b"<p>first part</p>second part", False)


async def test_gzip_members_are_capped(
    site: LocalServer, wire: CountingTransport
) -> None:
    body, cut = await read_body(site.url("/gzip-many-members"), 10_000_000, wire)
    count = vt._MAX_GZIP_MEMBERS
    assert body == b"".join(f"<p>member {n:03d}</p>".encode() for n in range(count))
    assert cut


async def test_the_cap_counts_bytes_on_the_wire(
    site: LocalServer, wire: CountingTransport
) -> None:
    cap = 200_000  # 5 MB on the wire inflate to 16 bytes
    body, cut = await read_body(site.url("/empty-blocks"), cap, wire)
    assert body == b"<p>tiny page</p>"
    assert cut
    assert wire.received < cap + 1_000_000  # one network chunk past the cap at most


def test_gzip_members_split_anywhere_are_joined() -> None:
    data = gzip.compress(b"one ") + gzip.compress(b"two ") + gzip.compress(b"three")
    decoder = vt._BoundedDecoder("gzip")
    out = b"".join(decoder.feed(data[i : i + 1], 1000) for i in range(len(data)))
    assert out == b"one two three"
    assert not decoder.finished


# -- DNS counts against the page timeout --------------------------------------------


async def never_answers(host: str) -> list[str]:
    """A resolver that never answers."""
    await asyncio.sleep(3600)
    return []


async def test_a_resolver_that_never_answers_costs_the_page_timeout() -> None:
    events = Events()
    tool = make_tool(
        vt._Seams(resolve=never_answers),
        PAGE_TIMEOUT_SECONDS=0.5,
        URL_TIMEOUT_SECONDS=60,
    )
    started = time.monotonic()
    result = await tool.visit(
        url=["http://slow-dns.example/"], goal="g", __event_emitter__=events
    )
    assert time.monotonic() - started < 10  # not the 60 s of the URL timeout
    assert vt.FAILURE_EVIDENCE in result
    assert "Could not read http://slow-dns.example/: timed out" in events.descriptions()


async def test_a_lookup_has_a_limit_of_its_own() -> None:
    with pytest.raises(vt._RefusedError, match=r"slow\.example \(DNS timed out\)"):
        await vt._check_url(
            "http://slow.example/", False, resolve=never_answers, dns_timeout=0.2
        )


async def test_lookups_run_on_threads_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[str] = []
    release = threading.Event()

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> list:
        threads.append(threading.current_thread().name)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (FAKE_PUBLIC_IP, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    loop = asyncio.get_running_loop()
    # The default executor busy with work that cannot be stopped (what a page
    # converted in a thread used to be): lookups do not wait behind it.
    busy = [loop.run_in_executor(None, release.wait, 30) for _ in range(40)]
    try:
        async with asyncio.timeout(10):
            target = await vt._check_url("http://name.example/", False)
    finally:
        release.set()
        await asyncio.gather(*busy)
    assert target.ip == FAKE_PUBLIC_IP
    assert threads and all(name.startswith("visit-dns") for name in threads)


async def test_a_fast_resolver_still_reads_the_page(
    site: LocalServer, converter: Any
) -> None:
    resolver = FakeResolver({"site.example": ["127.0.0.1"]})
    tool = make_tool(vt._Seams(resolve=resolver, converter=converter))
    url = site.url("/fine").replace("127.0.0.1", "site.example")
    result = await tool.visit(url=[url], goal="g")
    assert "# Solar panel efficiency in 2024" in result
    assert resolver.calls == ["site.example"]


# -- charsets that are not text encodings --------------------------------------------


@pytest.mark.parametrize("name", NOT_TEXT_CODECS)
@pytest.mark.parametrize("where", ["meta", "header"])
def test_a_charset_that_is_not_a_text_encoding_reads_as_utf8(
    name: str, where: str
) -> None:
    body = "<html><body><p>café ok</p></body></html>".encode()
    content_type = "text/html"
    if where == "meta":
        body = f'<meta charset="{name}">'.encode() + body
    else:
        content_type = f"text/html; charset={name}"
    page = vt._convert(vt._RawPage("https://s.example/", body, content_type), 1000)
    assert page.text == "café ok"


async def test_bad_charsets_never_break_a_worker(
    converter: Any, watch: ConverterWatch
) -> None:
    pids: set[int] = set()
    for name in NOT_TEXT_CODECS:
        body = f'<meta charset="{name}"><p>café ok</p>'.encode()
        raw = vt._RawPage("https://s.example/", body, "text/html")
        page = await vt._convert_page(raw, 1000, converter)
        assert page.text == "café ok"
        pids |= idle_worker_pids(converter)
    assert len(pids) == 1  # one worker read them all
    assert len(watch.spawned) == 1
    assert watch.threaded == []
    assert converter.start_failures == 0
