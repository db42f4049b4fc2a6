"""Reading pages: the built-in fetcher against a real local site, Open WebUI's
loader in each version's shape, caps, content types, charsets, cache, concurrency.

The site runs on 127.0.0.1, so these tests set ALLOW_PRIVATE_URLS=True (the
refusal side is covered in test_visit_safety.py). The extractor is a real
FakeOpenAI server that echoes back the page text it was given, so each test
sees exactly what the extractor model would read. Each test's tool has its
own page cache and converter, and Open WebUI's loader where a test gives one
(the tool's seams).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.fakes.events import Events
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.pages import (
    PageSite,
    bomb,
    load_visit_tool,
    page_text_from_prompt,
)
from tests.fakes.visit_seams import ConverterWatch, HeldTransport, client_over

vt = load_visit_tool("visit_tool_fetch_tests")


def echo(body: dict[str, Any]) -> Reply:
    page = page_text_from_prompt(body["messages"][0]["content"])
    return Reply(
        content=json.dumps({"rational": "r", "evidence": page, "summary": "S"})
    )


@pytest.fixture(scope="module")
def site() -> Any:
    with PageSite() as running:
        yield running


@pytest.fixture(scope="module")
def extractor() -> Any:
    with FakeOpenAI() as fake:
        fake.respond_with(echo)
        yield fake


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


@pytest.fixture
def seams(converter: Any) -> Any:
    """The test's seams: its own page cache and converter, the real rest."""
    return vt._Seams(converter=converter, pages=vt._PageCache())


def make_tool(extractor: Any, seams: Any, **valves: Any) -> Any:
    tool = vt.Tools(seams=seams)
    settings = {
        "ALLOW_PRIVATE_URLS": True,
        "EXTRACTOR_BASE_URL": extractor.base_url,
        "EXTRACTOR_MODEL": "extractor-model",
        **valves,
    }
    tool.valves = tool.Valves(**settings)
    return tool


def evidence_of(result: str) -> str:
    assert result.startswith("The useful information in "), result[:300]
    return result.split("Evidence in page: \n", 1)[1].rsplit("\n\nSummary: \n", 1)[0]


def is_failure(result: str) -> bool:
    return vt.FAILURE_EVIDENCE in result and vt.FAILURE_SUMMARY in result


# -- HTML and friends -------------------------------------------------------------


async def test_html_article_becomes_clean_markdown(
    site: Any, extractor: Any, seams: Any
) -> None:
    events = Events()
    url = site.url("/article")
    result = await make_tool(extractor, seams).visit(
        url=[url], goal="efficiency", __event_emitter__=events
    )
    page = evidence_of(result)
    assert page.startswith("Title: Solar Panels & Efficiency\n\nURL Source: ")
    assert "# Solar panel efficiency in 2024" in page
    assert "## Key figures" in page
    assert "- Monocrystalline: 22.8%" in page
    assert "  - Older models: 15%" in page
    assert "| Type | Efficiency |\n| --- | --- |\n| Mono | 22.8% |" in page
    assert f"[annual report]({site.url('/reports/2024.html')})" in page
    assert "Modern panels reach 22.8% efficiency" in page
    junk_markers = ["SCRIPT", "STYLE-TEXT", "SITE-HEADER", "NAV-LINK", "HIDDEN"]
    junk_markers += [
        "NOSCRIPT",
        "TEMPLATE",
        "SVG-TEXT",
        "ASIDE",
        "FOOTER",
        "<p>",
        "[top]",
    ]
    for junk in junk_markers:
        assert junk not in page, junk
    assert events.sources()[0]["source"] == {
        "name": "Solar Panels & Efficiency",
        "url": url,
    }


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/plain", "Plain facts: water boils at 100 C."),
        ("/markdown", "# Notes\n\n- item"),
        ("/json", '{"answer": 42, "unit": "widgets"}'),
        ("/gzip", "# Solar panel efficiency in 2024"),
        ("/html-as-octet", "# Solar panel efficiency in 2024"),
        ("/latin1", "Café crème brûlée"),
        ("/meta-charset", "Привет, мир"),
        ("/bom", "BOM wins: naïve"),
        ("/bad-charset", "broken \ufffd"),
        ("/pdf", "--- Page 1 ---\nPhotosynthesis converts light into chemical energy."),
        ("/pdf-as-html", "--- Page 2 ---\nPage two."),
    ],
)
async def test_content_types_and_charsets(
    path: str, expected: str, site: Any, extractor: Any, seams: Any
) -> None:
    result = await make_tool(extractor, seams).visit(url=site.url(path), goal="g")
    assert expected in evidence_of(result)


async def test_wrong_type_html_is_not_shown_as_markup(
    site: Any, extractor: Any, seams: Any
) -> None:
    page = evidence_of(
        await make_tool(extractor, seams).visit(
            url=site.url("/html-as-octet"), goal="g"
        )
    )
    assert "<html" not in page
    assert "SCRIPT-TEXT" not in page


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/image", "the URL points to a PNG image, not a readable page"),
        ("/image-as-html", "the URL points to a PNG image, not a readable page"),
        ("/zip", "the URL points to a ZIP archive or Office document, not a "
         "readable page"),
        ("/octet-binary", "the URL points to a binary file "
         "(application/octet-stream), not a readable page"),
        ("/empty", "the page is empty"),
        ("/pdf-corrupt", "the PDF could not be read (PdfStreamError)"),
        ("/status/404", "the server answered HTTP 404"),
        ("/status/500", "the server answered HTTP 500"),
        ("/cut-off", "network error (RemoteProtocolError)"),
        ("/bad-encoding", "unsupported content encoding 'br'"),
        ("/redirect-no-location", "the server answered HTTP 302"),
        ("/bomb-zeros", "the URL points to a binary file (text/html), not a "
         "readable page"),
    ],
)  # fmt: skip
async def test_unreadable_pages_fail_with_a_clear_reason(
    path: str, reason: str, site: Any, extractor: Any, seams: Any
) -> None:
    events = Events()
    requests_before = len(extractor.requests)
    result = await make_tool(extractor, seams).visit(
        url=[site.url(path)], goal="g", __event_emitter__=events
    )
    assert is_failure(result)
    assert f"Could not read {site.url(path)}: {reason}" in events.descriptions()
    assert len(extractor.requests) == requests_before  # nothing to extract from
    assert events.sources() == []


@pytest.fixture
def without_pypdf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """pypdf absent for this process AND for a converter process it starts.

    A converter process imports from the server's sys.path: a stand-in module
    there fails to import.
    """
    monkeypatch.setitem(sys.modules, "pypdf", None)
    (tmp_path / "pypdf.py").write_text("raise ImportError('no pypdf here')\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])


@pytest.mark.parametrize("where", ["child process", "worker thread"])
@pytest.mark.usefixtures("without_pypdf")
async def test_pypdf_missing_gives_a_clear_message(
    site: Any, extractor: Any, seams: Any, watch: ConverterWatch, where: str
) -> None:
    # A fresh converter: its worker takes sys.path when it starts; no program
    # means no worker can run (the page is converted in a thread).
    program = "" if where == "worker thread" else None
    converter = watch.converter(program)
    events = Events()
    try:
        result = await make_tool(extractor, replace(seams, converter=converter)).visit(
            url=site.url("/pdf"), goal="g", __event_emitter__=events
        )
    finally:
        await vt._stop_idle_workers(converter)
    assert is_failure(result)
    assert (
        f"Could not read {site.url('/pdf')}: reading PDFs needs the optional "
        "'pypdf' package (pip install pypdf)"
    ) in events.descriptions()
    assert len(watch.threaded) == (1 if where == "worker thread" else 0)


# -- caps ---------------------------------------------------------------------------


async def test_huge_page_is_cut_to_the_token_budget(
    site: Any, extractor: Any, seams: Any
) -> None:
    tool = make_tool(extractor, seams, MAX_PAGE_TOKENS=2000)
    page = evidence_of(await tool.visit(url=site.url("/huge"), goal="g"))
    assert page.endswith("\n\n[Page truncated to fit the reading budget]")
    body = page.split("Markdown Content:\n", 1)[1]
    assert 7000 < len(body) < 8200  # ~4 chars per token
    assert "Lorem ipsum" in body


async def test_gzip_bomb_is_cut_while_inflating(
    site: Any, extractor: Any, seams: Any
) -> None:
    tool = make_tool(extractor, seams, MAX_DOWNLOAD_BYTES=300_000)
    url = site.url("/bomb-text")
    result = await tool.visit(url=url, goal="g")
    # 50 MB after inflating; 300 kB read: "<html><body><p>" and the rest "A"s.
    paragraph = "A" * (300_000 - len("<html><body><p>"))
    assert evidence_of(result) == (
        f"Title: \n\nURL Source: {url}\n\nMarkdown Content:\n{paragraph}"
        f"\n\n{vt.TRUNCATION_NOTE}"
    )


async def test_bounded_decoder_never_inflates_beyond_the_limit() -> None:
    decoder = vt._BoundedDecoder("gzip")
    out = decoder.feed(bomb("zeros"), 1000)
    assert len(out) == 1000


async def test_endless_body_is_cut(site: Any, extractor: Any, seams: Any) -> None:
    tool = make_tool(extractor, seams, MAX_DOWNLOAD_BYTES=200_000)
    page = evidence_of(await tool.visit(url=site.url("/endless"), goal="g"))
    assert "endless text" in page
    assert page.endswith("[Page truncated to fit the reading budget]")


async def test_slow_page_times_out(site: Any, extractor: Any, seams: Any) -> None:
    events = Events()
    tool = make_tool(extractor, seams, PAGE_TIMEOUT_SECONDS=0.5)
    result = await tool.visit(url=site.url("/slow"), goal="g", __event_emitter__=events)
    assert is_failure(result)
    assert f"Could not read {site.url('/slow')}: timed out" in events.descriptions()


async def test_redirect_chain_is_followed_and_reported(
    site: Any, extractor: Any, seams: Any
) -> None:
    events = Events()
    url = site.url("/redirect/3")
    result = await make_tool(extractor, seams).visit(
        url=url, goal="g", __event_emitter__=events
    )
    assert "# Solar panel efficiency in 2024" in evidence_of(result)
    assert result.startswith(f"The useful information in {url} for user goal g")
    (source,) = events.sources()
    meta = source["metadata"][0]
    assert meta["final_url"] == site.url("/article")
    assert meta["redirects"] == [
        site.url("/redirect/2"),
        site.url("/redirect/1"),
        site.url("/article"),
    ]


async def test_endless_redirects_stop_at_the_limit(
    site: Any, extractor: Any, seams: Any
) -> None:
    events = Events()
    before = site.hits("/redirect-loop")
    tool = make_tool(extractor, seams, MAX_REDIRECTS=4)
    result = await tool.visit(
        url=site.url("/redirect-loop"), goal="g", __event_emitter__=events
    )
    assert is_failure(result)
    assert site.hits("/redirect-loop") - before == 5
    assert (
        f"Could not read {site.url('/redirect-loop')}: more than 4 redirects"
        in events.descriptions()
    )


# -- cache, de-duplication, concurrency --------------------------------------------


async def test_same_chat_reads_a_page_once_other_chats_read_again(
    site: Any, extractor: Any, seams: Any
) -> None:
    tool = make_tool(extractor, seams)
    url = site.url("/count/cache")
    first = await tool.visit(url=url, goal="g", __chat_id__="chat-A")
    second = await tool.visit(url=url + "#section", goal="g", __chat_id__="chat-A")
    assert site.hits("/count/cache") == 1
    assert evidence_of(first) == evidence_of(second)
    await tool.visit(url=url, goal="g", __chat_id__="chat-B")
    assert site.hits("/count/cache") == 2
    await tool.visit(url=url, goal="g")  # no chat id: never cached
    await tool.visit(url=url, goal="g")
    assert site.hits("/count/cache") == 4


class RecordingLoads(dict):
    """The pages being loaded (the `loading` seam), recording each look-up."""

    def __init__(self) -> None:
        super().__init__()
        self.looked_up: list[Any] = []

    def get(self, key: Any, default: Any = None) -> Any:
        self.looked_up.append(key)
        return super().get(key, default)


async def test_a_page_read_twice_at_once_in_a_chat_is_fetched_once(
    site: Any, extractor: Any, seams: Any
) -> None:
    # A heavy run's rollouts read the same page at the same time: the second
    # read waits for the first. Handshakes, no clock: the first download is
    # held until the second read has found it in flight.
    held = HeldTransport()
    loading = RecordingLoads()
    seams = replace(seams, http_client=client_over(held), loading=loading)
    tool = make_tool(extractor, seams)
    url = site.url("/count/together")
    first = asyncio.create_task(tool.visit(url=url, goal="a", __chat_id__="chat-H"))
    for _ in range(1500):
        if held.sent:
            break
        await asyncio.sleep(0.02)
    second = asyncio.create_task(tool.visit(url=url, goal="b", __chat_id__="chat-H"))
    for _ in range(1500):
        if len(loading.looked_up) == 2:
            break
        await asyncio.sleep(0.02)
    assert len(loading.looked_up) == 2 and len(loading) == 1  # found in flight
    held.release.set()
    results = await asyncio.gather(first, second)
    assert held.sent == [url] and site.hits("/count/together") == 1
    assert all("Counted page /count/together content." in r for r in results)
    assert loading == {}


async def test_cache_can_be_switched_off(site: Any, extractor: Any, seams: Any) -> None:
    tool = make_tool(extractor, seams, CACHE_TTL_SECONDS=0)
    for _ in range(2):
        await tool.visit(url=site.url("/count/nocache"), goal="g", __chat_id__="c")
    assert site.hits("/count/nocache") == 2


async def test_same_url_twice_in_one_call_is_read_once(
    site: Any, extractor: Any, seams: Any
) -> None:
    url = site.url("/count/dup")
    result = await make_tool(extractor, seams).visit(url=[url, url], goal="g")
    assert site.hits("/count/dup") == 1
    assert result.count("Counted page /count/dup content.") == 2


async def test_urls_are_read_concurrently(
    site: Any, extractor: Any, seams: Any
) -> None:
    """The server answers only when all three requests are in flight together."""
    urls = [site.url(f"/hold/{n}") for n in range(3)]
    result = await make_tool(extractor, seams, CONCURRENT_URLS=3).visit(
        url=urls, goal="g"
    )
    blocks = result.split("\n=======\n")
    assert [f"Held page {n} content." in block for n, block in enumerate(blocks)] == [
        True
    ] * 3


async def test_concurrency_is_capped(
    site: Any, extractor: Any, seams: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    urls = [site.url(f"/track/{n}") for n in range(4)]
    site.max_active = 0
    # The first read waits for the second to arrive: no race with a busy machine.
    monkeypatch.setattr(site, "track_together", 2)
    result = await make_tool(extractor, seams, CONCURRENT_URLS=2).visit(
        url=urls, goal="g"
    )
    assert result.count("Tracked page") == 4
    assert site.max_active == 2


async def test_heavy_conversion_runs_off_the_event_loop(
    site: Any, extractor: Any, seams: Any, watch: ConverterWatch
) -> None:
    result = await make_tool(extractor, seams).visit(url=site.url("/article"), goal="g")
    assert "# Solar panel efficiency in 2024" in evidence_of(result)
    assert watch.threaded == []  # not a thread of the server: a worker process
    assert len(watch.spawned) == 1
    assert watch.pids()[0] != os.getpid()
    (worker,) = seams.converter.idle  # it converted the page, and is kept warm
    assert worker.process is watch.spawned[0]


# -- Open WebUI's loader, in each version's shape -----------------------------------


def doc(text: str, title: str) -> Any:
    return SimpleNamespace(page_content=text, metadata={"source": "x", "title": title})


def loader_v06(calls: list) -> Any:
    def get_content_from_url(request: Any, url: str) -> tuple[str, list]:
        calls.append((request, url, threading.current_thread()))
        return "Loaded by 0.6 loader.", [doc("Loaded by 0.6 loader.", "Six")]

    return get_content_from_url


def loader_v011(calls: list) -> Any:
    async def get_content_from_url(request: Any, url: str) -> tuple[str, list]:
        calls.append((request, url, threading.current_thread()))
        return "Loaded by 0.11 loader.", [{"metadata": {"title": "Eleven"}}]

    return get_content_from_url


def loader_v012(calls: list) -> Any:
    async def get_content_from_url(
        request: Any, url: str, *, config: dict | None = None
    ) -> tuple[str, list]:
        calls.append((request, url, threading.current_thread()))
        return "Loaded by 0.12 loader.", [doc("Loaded by 0.12 loader.", "Twelve")]

    return get_content_from_url


@pytest.mark.parametrize(
    "shape",
    [
        (loader_v06, "Loaded by 0.6 loader.", "Six", True),
        (loader_v011, "Loaded by 0.11 loader.", "Eleven", False),
        (loader_v012, "Loaded by 0.12 loader.", "Twelve", False),
    ],
)
async def test_open_webui_loader_shapes(
    shape: tuple, site: Any, extractor: Any, seams: Any
) -> None:
    factory, text, title, threaded = shape
    calls: list = []
    seams = replace(seams, find_loader=lambda: factory(calls))
    request = object()
    events = Events()
    url = site.url("/count/owui")
    before = site.hits("/count/owui")
    result = await make_tool(extractor, seams, PAGE_LOADER="openwebui").visit(
        url=url, goal="g", __request__=request, __event_emitter__=events
    )
    assert text in evidence_of(result)
    assert [(c[0], c[1]) for c in calls] == [(request, url)]
    assert (calls[0][2] is not threading.main_thread()) is threaded
    assert site.hits("/count/owui") == before  # the built-in fetcher was not used
    assert events.sources()[0]["source"]["name"] == title


@pytest.mark.parametrize(
    "failure", [RuntimeError("loader engine down"), ("", []), ("   ", []), None]
)
async def test_open_webui_loader_falls_back_when_it_cannot_serve(
    failure: Any, site: Any, extractor: Any, seams: Any
) -> None:
    async def loader(request: Any, url: str) -> Any:
        if isinstance(failure, Exception):
            raise failure
        return failure

    seams = replace(seams, find_loader=lambda: loader)
    # auto with a browser engine configured (0.6/0.8 shape of Open WebUI's config)
    playwright = SimpleNamespace(
        app=SimpleNamespace(
            state=SimpleNamespace(
                config=SimpleNamespace(WEB_LOADER_ENGINE="playwright")
            )
        )
    )
    result = await make_tool(extractor, seams).visit(
        url=site.url("/plain"), goal="g", __request__=playwright
    )
    assert "Plain facts" in evidence_of(result)


async def test_open_webui_only_mode_does_not_fall_back(
    site: Any, extractor: Any, seams: Any
) -> None:
    async def loader(request: Any, url: str) -> Any:
        raise RuntimeError("down")

    seams = replace(seams, find_loader=lambda: loader)
    before = site.hits("/count/only")
    result = await make_tool(extractor, seams, PAGE_LOADER="openwebui").visit(
        url=site.url("/count/only"), goal="g", __request__=object()
    )
    assert is_failure(result)
    assert site.hits("/count/only") == before


async def test_builtin_mode_and_no_request_skip_open_webui(
    site: Any, extractor: Any, seams: Any
) -> None:
    calls: list = []
    seams = replace(seams, find_loader=lambda: loader_v012(calls))
    tool = make_tool(extractor, seams, PAGE_LOADER="builtin")
    assert "Plain facts" in await tool.visit(
        url=site.url("/plain"), goal="g", __request__=object()
    )
    tool = make_tool(extractor, seams)
    assert "Plain facts" in await tool.visit(url=site.url("/plain"), goal="g")
    assert calls == []


async def test_open_webui_not_installed_means_builtin(
    site: Any, extractor: Any, seams: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "open_webui", None)  # as if not installed
    assert vt._openwebui_content_loader() is None
    result = await make_tool(extractor, seams).visit(
        url=site.url("/plain"), goal="g", __request__=object()
    )
    assert "Plain facts" in evidence_of(result)


async def test_open_webui_text_is_cut_to_the_budget(
    site: Any, extractor: Any, seams: Any
) -> None:
    async def loader(request: Any, url: str) -> Any:
        return "word " * 50_000, []

    seams = replace(seams, find_loader=lambda: loader)
    tool = make_tool(extractor, seams, MAX_PAGE_TOKENS=1000, PAGE_LOADER="openwebui")
    page = evidence_of(
        await tool.visit(url=site.url("/plain"), goal="g", __request__=object())
    )
    assert page.endswith("[Page truncated to fit the reading budget]")
    assert len(page) < 4500


async def test_url_timeout_covers_the_whole_visit(
    site: Any, seams: Any, watch: ConverterWatch
) -> None:
    # The page is read in milliseconds (a thread converts its text, no worker
    # has to start); then the extractor never answers.
    seams = replace(seams, converter=watch.converter(""))
    events = Events()
    with FakeOpenAI() as silent:
        silent.respond_with(lambda body: Reply(fault="hang"))
        tool = make_tool(silent, seams, URL_TIMEOUT_SECONDS=1.0)
        result = await tool.visit(
            url=site.url("/plain"), goal="g", __event_emitter__=events
        )
        assert len(silent.bodies) == 1  # the extraction had begun
    assert is_failure(result)
    url = site.url("/plain")
    assert f"Reading {url}: whole document, 34 characters" in events.descriptions()
    assert f"Could not read {url}: timed out" in events.descriptions()


# -- big bodies ----------------------------------------------------------------------


@pytest.mark.parametrize("cap", [10**8, 2_000_000, 999_999])
async def test_big_bodies_are_read_exactly(site: Any, cap: int) -> None:
    expected = site.huge_body
    client = vt._http_client(await vt._ssl_context(True), 30.0)
    async with client, client.stream("GET", site.url("/huge")) as response:
        body, cut = await vt._read_capped(response, cap)
    assert (body, cut) == (expected[:cap], cap < len(expected))


async def test_joining_megabytes_runs_in_a_worker_thread() -> None:
    threads: list[threading.Thread] = []

    def join(chunks: list[bytes]) -> bytes:
        threads.append(threading.current_thread())
        return vt._join_bytes(chunks)

    chunks = [bytes([n]) * 65536 for n in range(20)]  # 1.3 MB
    assert await vt._joined(chunks, join) == b"".join(chunks)
    assert await vt._joined(chunks[:2], join) == b"".join(chunks[:2])
    assert len(threads) == 2
    assert threads[0] is not threading.main_thread()  # the big one
    assert threads[1] is threading.main_thread()  # 128 kB: not worth a thread
